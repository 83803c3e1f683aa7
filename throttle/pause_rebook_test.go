package throttle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Waiters of this process whose bookings reach past the pause's end give them all
// back before any books again, so the first permit after the pause takes effect when
// it ends and the rest follow at the rate, with no gap: none books again behind a
// booking another is about to give back.
//
// Twelve waiters book 20ms apart (+20ms … +240ms); the 300ms pause begins as soon
// as they have. The waiters book again once Pause returns, well before the pause
// ends; the checks count only the grants booked again before it could have ended
// (their call sent by then: a goroutine the busy machine ran later than that is not
// the limiter's doing), and fail if there are none. Tolerances: the first of them
// takes effect within 25ms of the pause's end (server clock, against the local times
// around the Pause call); the last within 15ms, less than a step (plus a bucket a
// grant for SlidingCounter), of one step per grant after the first. A booking that
// took effect while Pause was running is not counted: the pause had not reached it.
//
// The log algorithms only: TokenBucket and FixedWindow give back only the latest
// booking (see their scripts), so the moved bookings stay counted and the slots
// after the pause are not all used.
func TestPauseRebooksFromItsEnd(t *testing.T) {
	const (
		waiters = 12
		step    = 20 * ms
		pause   = 300 * ms
	)
	for _, alg := range []Algorithm{SlidingWindow, SlidingCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
				ctx := context.Background()
				grants := redistest.RecordGrants(b.Client)
				l, err := New(b.Client, "rebook", Every(step), WithKeyPrefix(b.Prefix), WithAlgorithm(alg))
				if err != nil {
					t.Fatal(err)
				}
				if err := l.Wait(ctx); err != nil { // the permit of this step
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				for i := 0; i < waiters; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						if err := l.Wait(ctx); err != nil {
							t.Error(err)
						}
					}()
				}
				for deadline := time.Now().Add(time.Second); grants.Total() < waiters+1; time.Sleep(ms) {
					if time.Now().After(deadline) { // a waiter failed to book (reported above)
						wg.Wait()
						t.Fatalf("%d of %d bookings made", grants.Total(), waiters+1)
					}
				}
				from := time.Now()
				if err := l.Pause(ctx, pause); err != nil {
					t.Fatal(err)
				}
				to := time.Now()
				wg.Wait()
				end := from.Add(pause) // the earliest the pause can end
				var after []redistest.Grant
				late := 0
				for _, g := range grants.List() {
					switch {
					case !g.At.Before(end) && g.Sent.Before(end):
						after = append(after, g)
					case !g.At.Before(end):
						late++ // booked again only after the pause could have ended
					case g.At.After(to):
						t.Errorf("a grant took effect %v after Pause returned, inside the pause", g.At.Sub(to))
					}
				}
				if len(after) == 0 {
					t.Fatalf("no grant after the pause booked before its end (%d booked later)", late)
				}
				first, last := after[0].At, after[len(after)-1].At
				t.Logf("%v on %s: Pause took %v; %d grants after it booked before its end (%d later), the first %v after its end, the last %v after",
					alg, b.Kind, to.Sub(from), len(after), late, first.Sub(end), last.Sub(end))
				// tolerance 25ms: the waiters' goroutines must run to book again, and under
				// -race on a loaded machine one can be scheduled that late
				if late := first.Sub(to.Add(pause)); late > 25*ms {
					t.Errorf("the first grant after the pause took effect %v after its end, want within 25ms", late)
				}
				slack := 15 * ms           // under one step: a slot left unused fails
				if alg == SlidingCounter { // each permit may hold its place one bucket longer
					slack += time.Duration(len(after)-1) * step / defaultBuckets
				}
				if late := last.Sub(first.Add(time.Duration(len(after)-1) * step)); late > slack {
					t.Errorf("the last grant took effect %v after its slot, want within %v: slots after the pause went unused", late, slack)
				}
			})
		})
	}
}

// A Reservation held by code that does not wait on it is never given back: Pause
// waits for it no longer than pauseSettle, and the booking stands.
//
// The booking is 10s ahead, so a Pause that waited for it instead of pauseSettle
// takes 10s. Tolerance: 5s over pauseSettle for the Redis call and scheduling (a
// cluster node on this shared machine took 1s to answer once under load).
func TestPauseWaitsBoundedForHeldReservations(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		grants := redistest.RecordGrants(b.Client)
		l, err := New(b.Client, "held", Every(10*time.Second), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		r, err := l.Reserve(ctx, 1, 20*time.Second)
		if err != nil || !r.OK() {
			t.Fatalf("Reserve: %v %v", r.OK(), err)
		}
		start := time.Now()
		if err := l.Pause(ctx, 50*ms); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took < pauseSettle || took > pauseSettle+5*time.Second {
			t.Errorf("Pause took %v, want %v (+ up to 5s), not until the held booking (10s)", took, pauseSettle)
		}
		if got, want := grants.Total(), 2; got != want {
			t.Errorf("%d permits stand, want %d (the held booking stays)", got, want)
		}
		if err := r.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
	})
}
