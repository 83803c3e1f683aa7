package throttle

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// While a key is paused every algorithm denies with the time to the pause's end, books
// only after it, and reports nothing remaining; after it, it grants again. A shorter
// pause keeps the longer one; the pause, set on an idle key, lives in its state's meta,
// which has a TTL.
func TestPauseDeniesUntilItEnds(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("paused", PerSecond(5), WithAlgorithm(alg))
		tl.at(10 * ms)
		if err := l.Pause(ctx, 300*ms); err != nil {
			t.Fatal(err)
		}
		if err := l.Pause(ctx, time.Millisecond); err != nil { // a shorter pause keeps the longer one
			t.Fatal(err)
		}
		tl.at(110 * ms)
		res, err := l.Allow(ctx)
		if err != nil || res.Allowed || res.RetryAfter != 200*ms || res.Remaining != 0 {
			t.Fatalf("during the pause: got %+v, %v; want denied, RetryAfter 200ms, nothing remaining", res, err)
		}
		if m := stateMeta(t, b.Client, l); m.PauseEnd != redistest.Epoch.Add(310*ms).UnixMicro() {
			t.Fatalf("the meta's pause ends at %d, want t0+310ms (µs): the longer pause", m.PauseEnd)
		}
		if ttl := b.Client.PTTL(ctx, l.stateKey()).Val(); ttl <= 0 {
			t.Fatalf("the state's PTTL %v during the pause on an idle key, want a TTL", ttl)
		}
		r, err := l.Reserve(ctx, 1, time.Second)
		if err != nil || !r.OK() || r.Delay() != 200*ms {
			t.Fatalf("booking during the pause: got OK %v Delay %v, %v; want booked at the pause's end (200ms)", r.OK(), r.Delay(), err)
		}
		tl.at(310 * ms)
		if res, err := l.Allow(ctx); err != nil || !res.Allowed {
			t.Fatalf("after the pause: got %+v, %v; want allowed", res, err)
		}
	})
}

// Pause holds across processes: a limiter on another client (another process, as far
// as Redis can tell), with other limits, is denied until the pause ends (here a Resume
// ends it: TestPauseDeniesUntilItEnds lets one run out), then allowed. A pause of
// d <= 0 is refused.
func TestPauseHoldsForOtherClients(t *testing.T) {
	eachAlgorithm(t, redistest.EachRealTime, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		a, err := New(b.Client, "shared", PerSecond(100), WithKeyPrefix(b.Prefix), WithAlgorithm(alg))
		if err != nil {
			t.Fatal(err)
		}
		other, err := New(ctlOtherClient(t, b), "shared", PerSecond(50), WithKeyPrefix(b.Prefix), WithAlgorithm(alg))
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range []time.Duration{-time.Second, 0} {
			if err := a.Pause(ctx, d); !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("Pause(%v): got %v, want ErrInvalidArgument", d, err)
			}
		}
		start := time.Now()
		if err := a.Pause(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		res, err := other.Allow(ctx)
		if err != nil || res.Allowed {
			t.Fatalf("the other process during the pause: got %+v, %v; want denied", res, err)
		}
		// the pause was set at most the elapsed time ago
		if res.RetryAfter > time.Minute || res.RetryAfter < time.Minute-time.Since(start) {
			t.Fatalf("RetryAfter %v, want at most 1m, less the time since Pause was called", res.RetryAfter)
		}
		if err := a.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if res, err := other.Allow(ctx); err != nil || !res.Allowed {
			t.Fatalf("the other process after the pause: got %+v, %v; want allowed", res, err)
		}
	})
}

// Waiters of this process whose bookings have not taken effect give them back when
// this process pauses the key (before Pause's call reaches Redis), and book again only
// once the hold ends: after the pause, first at its end and the others at the rate,
// with no gap, in the order they were booked. The server's clock is the test's: the
// waiters' first bookings lie seconds ahead, so none can take effect before the pause
// reaches it, however late the machine runs it.
//
// The algorithms that get every booking back when they are given back latest first and
// book to the µs: the fixed window gives permits back only while their window is the
// latest one; the sliding counter books at its buckets' ends.
func TestPauseMovesThisProcessesWaiters(t *testing.T) {
	for _, alg := range []Algorithm{SlidingWindow, TokenBucket} {
		t.Run(alg.String(), func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				grants := redistest.RecordGrants(b.Client)
				var waits waitRecorder
				tl := newTimeline(t, b)
				const period = 10 * time.Second
				l := tl.limiter("moved", Limit{Rate: 1, Period: period, Burst: 1}.forAlg(alg), WithAlgorithm(alg), WithHooks(waits.hooks()))
				if res, err := l.Allow(ctx); err != nil || !res.Allowed { // the permit of this period
					t.Fatalf("Allow: %+v, %v", res, err)
				}
				const waiters = 3
				var wg sync.WaitGroup
				errs := make(chan error, waiters)
				for i := range waiters {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs <- l.Wait(ctx)
					}()
					// one at a time: the bookings are made in a known order
					for deadline := time.Now().Add(signalWait); waits.count() < 2+i; time.Sleep(ms) {
						if time.Now().After(deadline) {
							t.Fatalf("waiter %d did not book within %v", i, signalWait)
						}
					}
				}
				first := waits.since(1)
				if want := []time.Duration{period, 2 * period, 3 * period}; !slices.Equal(first, want) {
					t.Fatalf("waiters booked %v ahead, want %v", first, want)
				}
				tl.at(period - 100*ms) // the pause ends 200ms after the first permit frees
				const hold = 300 * ms
				paused := time.Now()
				if err := l.Pause(ctx, hold); err != nil {
					t.Fatal(err)
				}
				for deadline := time.Now().Add(signalWait); waits.count() < 1+2*waiters; time.Sleep(ms) {
					if time.Now().After(deadline) {
						t.Fatalf("%d of %d waiters booked again after %v", waits.count()-1-waiters, waiters, signalWait)
					}
				}
				list, giveBacks := grants.List(), grants.GiveBacks() // before the waiters leave and give their bookings back
				cancel()                                             // the waiters of the test need not sleep on
				wg.Wait()
				var back []time.Duration
				for _, gb := range giveBacks {
					if !gb.OK {
						t.Fatalf("give-back %+v refused: the booking was not the waiter's any more", gb)
					}
					back = append(back, gb.At.Sub(redistest.Epoch))
				}
				if len(back) < waiters || !slices.Equal(back[:waiters], []time.Duration{3 * period, 2 * period, period}) {
					t.Fatalf("given back %v (from t0), want the three bookings, the latest first", back)
				}
				// booked again once the hold ended, by this process's clock
				var again []redistest.Grant
				for _, g := range list {
					if g.Wait > 0 && g.Sent.After(paused) {
						again = append(again, g)
					}
				}
				if len(again) != waiters {
					t.Fatalf("%d bookings after the pause, want %d: %+v", len(again), waiters, again)
				}
				for _, g := range again {
					if g.Sent.Sub(paused) < hold {
						t.Fatalf("a waiter booked again %v after Pause was called, inside the %v hold", g.Sent.Sub(paused), hold)
					}
				}
				// at the pause's end (t0+period+200ms), then a period apart
				got := waits.since(1 + waiters)
				want := []time.Duration{300 * ms, 300*ms + period, 300*ms + 2*period}
				if !slices.Equal(got, want) {
					t.Fatalf("booked again %v ahead (from t0+%v), want %v: at the pause's end, then at the rate", got, period-100*ms, want)
				}
			})
		})
	}
}

// forAlg drops the burst of a limit for the algorithms that do not take one.
func (l Limit) forAlg(alg Algorithm) Limit {
	if alg != TokenBucket {
		l.Burst = 0
	}
	return l
}

// A Wait that comes while this process holds the key books only when the hold ends, as
// the waiters the hold moved do: booked inside the hold, it could land behind a slot
// one of them was about to give back. The hold is measured on this process's clock,
// which also times the call the recorder sees, so the check holds however slow the
// machine is.
func TestWaitDuringHoldBooksAfterIt(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		grants := redistest.RecordGrants(b.Client)
		l, err := New(b.Client, "wait-in-hold", Limit{Rate: 1, Period: 100 * ms}, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		const hold = 200 * ms
		paused := time.Now()
		if err := l.Pause(ctx, hold); err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		// (a call of Wait's inside the hold would have booked, at the pause's end, and
		// given its booking back; the process may also ask whether the key is paused
		// as it subscribes, see listenNotices)
		got, back := grants.List(), grants.GiveBacks()
		if len(got) != 1 || len(back) != 0 {
			t.Fatalf("grants %+v, given back %+v; want one grant, nothing given back", got, back)
		}
		if d := got[0].Sent.Sub(paused); d < hold {
			t.Fatalf("Wait's call sent %v after Pause was called, inside the %v hold", d, hold)
		}
	})
}

// A booking nobody waits on stands through a pause: Pause neither waits for it nor
// gives it back (Reserve's reservation keeps its booking; only WaitN follows a pause).
func TestPauseLeavesUnwatchedBookings(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("held", Limit{Rate: 1, Period: 10 * time.Second, Burst: 1}.forAlg(alg), WithAlgorithm(alg))
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		r, err := l.Reserve(ctx, 1, time.Minute)
		if err != nil || !r.OK() {
			t.Fatalf("Reserve: %v %v", r.OK(), err)
		}
		before, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Pause(ctx, 50*ms); err != nil {
			t.Fatal(err)
		}
		after, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if after.Booked != before.Booked || after.BookedAhead != before.BookedAhead || after.Booked == 0 {
			t.Fatalf("after Pause: %d booked, %v ahead; want the booking standing (%d, %v)", after.Booked, after.BookedAhead, before.Booked, before.BookedAhead)
		}
	})
}

// A pause stops the whole fleet: three processes (a Redis client each) with three
// workers each Wait on one key, 5 per second, and send to a vendor as each Wait
// returns; right after a send, when the next slot is 200ms away, process 0 reads a 429
// and pauses the key for 2s, as the HTTP transport does. Every process's waiters asleep
// on bookings inside the pause give them back and book after it: process 0's on its
// hold, the others' when the pause's notice reaches them.
//
// Judged by Redis's clock and by when each process heard the pause, not by when a send
// is seen (on a busy machine a worker can run long after its permit came due, and a
// process can hear the pause after some of its slots): Redis books nothing inside the
// pause once it took effect; a permit of a process that takes effect inside the pause
// and stands came due before that process heard the pause (a waiter whose slot comes
// before the notice goes ahead), or is one the process tried to give back once its time
// had come; after the pause the fleet sends again. A process has heard the pause, and
// taken its waiters, once the notice of a second, shorter Pause (which keeps the
// pause's end) reaches the test's listener in its hub: a subscriber gets a channel's
// messages in their order, and the hub hands a notice to every listener before it
// reads the next. That listener also keeps the process subscribed, confirmed before
// the pause: a notice published before is lost. Reported: the sends of each part, by
// the test's clock, and when each process had heard at the latest.
func TestPauseStopsTheFleet(t *testing.T) {
	parallel(t)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		const procs, workers, pause = 3, 3, 2 * time.Second
		addrs, cluster := b.Addrs()
		ctx := context.Background()
		type send struct {
			proc int
			at   time.Time
		}
		var mu sync.Mutex
		var sends []send
		sent := make(chan struct{}, 1)
		run, stop := context.WithCancel(ctx)
		defer stop()
		var wg sync.WaitGroup
		var lims []*Limiter
		var grants []*redistest.Grants
		var notices [procs]atomic.Int32 // the pause notices each process's hub handed out
		var heard [procs]atomic.Int64   // when the second came, Unix ns
		for p := range procs {
			rdb := redistest.Dial(addrs, cluster)
			defer rdb.Close()
			grants = append(grants, redistest.RecordGrants(rdb))
			l, err := New(rdb, "fleet-pause", Limit{Rate: 1, Period: 200 * ms}, WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
			h, ear := l.client().hub, &listener{channel: keys.Name(l.t.tag, keys.Wake), paused: func(int64) {
				if notices[p].Add(1) == 2 {
					heard[p].Store(time.Now().UnixNano())
				}
			}}
			if !h.listen(ear) {
				h.subscribe(ear)
			}
			defer h.unlisten(ear)
			for range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for l.Wait(run) == nil {
						mu.Lock()
						sends = append(sends, send{p, time.Now()})
						mu.Unlock()
						select {
						case sent <- struct{}{}:
						default:
						}
					}
				}()
			}
		}
		time.Sleep(time.Second) // every waiter booked ahead
		for _, l := range lims {
			ctlListening(t, l, 0) // subscribed, held so by its ear: the pause's notice reaches it
		}
		select {
		case <-sent:
		default:
		}
		<-sent // a slot just came: the next is 200ms away
		start := time.Now()
		if err := lims[0].Pause(ctx, pause); err != nil {
			t.Fatal(err)
		}
		landed := time.Now()
		if err := lims[0].Pause(ctx, time.Millisecond); err != nil { // its notice: heard
			t.Fatal(err)
		}
		end := time.UnixMicro(stateMeta(t, b.Client, lims[0]).PauseEnd) // Redis's clock
		from := end.Add(-pause)
		for p := range procs {
			for deadline := time.Now().Add(signalWait); heard[p].Load() == 0; time.Sleep(ms) {
				if time.Now().After(deadline) {
					t.Fatalf("process %d did not hear the pause within %v", p, signalWait)
				}
			}
		}
		sendsAfter := func() (n int) {
			mu.Lock()
			defer mu.Unlock()
			for _, s := range sends {
				if !s.at.Before(end) {
					n++
				}
			}
			return n
		}
		for deadline := end.Add(signalWait); sendsAfter() == 0; time.Sleep(10 * ms) {
			if time.Now().After(deadline) {
				t.Fatalf("no send within %v after the pause, want the fleet going again", signalWait)
			}
		}
		stop()
		wg.Wait()

		var heardAt []string
		for p := range procs {
			at := time.Unix(0, heard[p].Load())
			heardAt = append(heardAt, at.Sub(start).Round(time.Microsecond).String())
			tried := map[time.Time]bool{}
			for _, gb := range grants[p].GiveBacks() {
				tried[gb.At] = true
			}
			for _, g := range grants[p].List() {
				switch {
				case g.At.Before(from) || !g.At.Before(end):
				case g.At.Add(-g.Wait).After(from): // (at from: booked before the pause, at its instant)
					t.Errorf("process %d: a permit booked %v after the pause took effect, inside it (%v before its end)",
						p, g.At.Add(-g.Wait).Sub(from), end.Sub(g.At))
				case !tried[g.At] && !g.At.Before(at):
					t.Errorf("process %d: a permit %v into the pause taken, %v after the process heard it: its waiter went ahead",
						p, g.At.Sub(from), g.At.Sub(at))
				}
			}
		}
		mu.Lock()
		defer mu.Unlock()
		var during, inside, later int
		for _, s := range sends {
			switch {
			case s.at.Before(start):
			case s.at.Before(landed):
				during++
			case s.at.Before(end):
				inside++
			default:
				later++
			}
		}
		redistest.Figure(t, "a 2s pause by one of %d processes (Pause's call %v), heard by each at the latest %v after it was called: %d sends during Pause's call, %d inside the pause after it, %d after it",
			procs, landed.Sub(start).Round(time.Microsecond), heardAt, during, inside, later)
	})
}

// A process whose WaitN booked before another process paused the key, and which was
// not yet subscribed to the key's channel when the pause's notice was published, still
// takes the pause: once its subscription is confirmed it asks Redis whether the key is
// paused and until when, and its waiter books again after the pause's end instead of
// going ahead inside it. Process B's subscription is held back (its hub's worker, which
// makes the SUBSCRIBE, is kept busy) from before its Wait books until after A's Pause
// has returned, its notice published; B's booking, two seconds ahead (the time B has to
// hear the pause, from A's Pause to its check's answer), is asleep by then, and the
// pause, set before it comes due (by Redis's clock), lasts three.
func TestPauseHeardOnceSubscribed(t *testing.T) {
	parallel(t)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		const period, pause = 2 * time.Second, 3 * time.Second
		addrs, cluster := b.Addrs()
		ctx := context.Background()
		var lims [2]*Limiter
		for i := range lims {
			rdb := redistest.Dial(addrs, cluster)
			defer rdb.Close()
			l, err := New(rdb, "pause-unheard", Limit{Rate: 1, Period: period}, WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			lims[i] = l
		}
		a, lb := lims[0], lims[1]
		h := lb.client().hub
		release := make(chan struct{})
		var once sync.Once
		free := func() { once.Do(func() { close(release) }) }
		defer free()
		h.mu.Lock()
		h.do(func() { <-release }) // B's SUBSCRIBE waits behind it
		h.mu.Unlock()

		if res, err := a.Allow(ctx); err != nil || !res.Allowed {
			t.Fatalf("A's Allow: got %+v, %v; want allowed (B's slot is then a period ahead)", res, err)
		}
		type result struct {
			g   grant
			err error
		}
		done := make(chan result, 1)
		go func() {
			g, err := lb.waitN(ctx, 1)
			done <- result{g, err}
		}()
		ks := lb.client().key(lb.t.tag)
		var booked int64 // the token B's waiter sleeps on, server µs
		for deadline := time.Now().Add(signalWait); booked == 0; time.Sleep(ms) {
			ks.mu.Lock()
			for s := range ks.sleepers {
				booked = s.g.token
			}
			ks.mu.Unlock()
			if time.Now().After(deadline) {
				t.Fatalf("B's Wait not asleep on its booking after %v", signalWait)
			}
		}
		h.mu.Lock()
		ch := h.chans[keys.Name(lb.t.tag, keys.Wake)]
		live := ch != nil && ch.live
		h.mu.Unlock()
		if live {
			t.Fatal("B subscribed before A paused: its SUBSCRIBE was to be held back")
		}
		if err := a.Pause(ctx, pause); err != nil {
			t.Fatal(err)
		}
		end := stateMeta(t, b.Client, a).PauseEnd // Redis's clock
		if from := end - pause.Microseconds(); from >= booked {
			t.Fatalf("the pause began %v after B's booking came due, want before: inside it", time.Duration(from-booked)*time.Microsecond)
		}
		free() // B subscribes now, the pause's notice gone by
		select {
		case r := <-done:
			if r.err != nil {
				t.Fatalf("B's Wait: %v", r.err)
			}
			if r.g.token < end {
				t.Fatalf("B's Wait went ahead on a booking %v before the pause's end, inside it; want it booked again after it",
					time.Duration(end-r.g.token)*time.Microsecond)
			}
		case <-time.After(pause + signalWait):
			t.Fatalf("B's Wait did not return within %v", pause+signalWait)
		}
	})
}
