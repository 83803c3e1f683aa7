package throttle

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Waiters of this process whose bookings reach past the pause's start give them all
// back at once and book again when the hold ends, so the first permit after the pause
// takes effect when it ends and the rest follow at the rate, with no gap: the give-
// backs are done long before the hold ends, so none books again behind a booking
// another is about to give back.
//
// Twelve waiters book 20ms apart (+20ms … +240ms); the 300ms pause begins as soon
// as they have. The checks follow the grants after the pause's end, and fail if there
// are none. Tolerances are stated at the checks. A booking that
// took effect before its waiter could give it back (a goroutine the busy machine ran
// late) stays counted, unused: the next slot is the first after it.
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
				var before time.Time // the latest grant before the pause's end
				for _, g := range grants.List() {
					if g.At.Before(end) {
						before = g.At // a booking that took effect before its waiter could give it back
					} else {
						after = append(after, g)
					}
				}
				if len(after) == 0 {
					t.Fatal("no grant after the pause")
				}
				t.Logf("%v on %s: Pause took %v; %d grants after it, the first %v after its end (sent %v after), the last %v after",
					alg, b.Kind, to.Sub(from), len(after), after[0].At.Sub(end), after[0].Sent.Sub(end), after[len(after)-1].At.Sub(end))
				// Each grant takes effect in the first slot free when its call was sent:
				// the pause's end, or the slot after the previous grant. Tolerances: 25ms
				// for the first (the waiters book again when the hold ends by this
				// process's clock, which may be up to Pause's round trip before the end
				// Redis set), 15ms for the others, less than a step (plus a bucket for
				// SlidingCounter, whose permits may hold their place that much longer): a
				// slot left unused fails. A call the busy machine sent late is allowed
				// the slot free at its time, and each call the time Redis took to run
				// its script after it was sent (At - Wait - Sent, same machine's clock:
				// a redis-server starved by busy loops ran one 28ms after it was sent);
				// a permit a late waiter could not give back before it took effect
				// keeps its slot.
				slot, slack := to.Add(pause), 25*ms
				if next := before.Add(step); next.After(slot) {
					slot = next
				}
				for i, g := range after {
					if free := g.Sent; free.After(slot) {
						slot = free
					}
					if ran := g.At.Add(-g.Wait).Sub(g.Sent); ran > 0 {
						slot = slot.Add(ran) // Redis ran the script that late
					}
					if late := g.At.Sub(slot); late > slack {
						t.Errorf("grant %d after the pause took effect %v after the first free slot, want within %v: slots after the pause went unused", i, late, slack)
					}
					slot, slack = g.At.Add(step), 15*ms
					if alg == SlidingCounter {
						slack += step / defaultBuckets
					}
				}
			})
		})
	}
}

// A booking nobody waits on stands through a pause: Pause neither waits for it nor
// gives it back. A Wait on it afterwards finds it moved, gives it back, and books
// again after the hold: here the next permit comes after Wait's deadline, so Wait
// returns ErrWouldExceedDeadline, and only the first grant stands.
func TestPauseLeavesUnwatchedBookings(t *testing.T) {
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
		if err := l.Pause(ctx, 50*ms); err != nil {
			t.Fatal(err)
		}
		if got, want := grants.Total(), 2; got != want {
			t.Errorf("after Pause %d permits stand, want %d (the unwatched booking stays)", got, want)
		}
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := r.Wait(wctx); !errors.Is(err, waiter.ErrWouldExceedDeadline) {
			t.Fatalf("Wait on the moved booking: %v, want ErrWouldExceedDeadline (booked again: 10s ahead)", err)
		}
		if got, want := grants.Total(), 1; got != want {
			t.Errorf("after Wait %d permits stand, want %d (the moved booking given back)", got, want)
		}
	})
}
