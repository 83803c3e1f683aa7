package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Many goroutines calling WaitN on one key, on the production scripts and the real
// clock: no window of the period ever holds more than the rate (by the server times the
// grants take effect), the rate is used in full once the first window has passed, and
// each permit costs about one script call.
//
// Tolerances: none on the bound; calls per permit must stay under 1.05 (a call that
// books is the only call a waiter makes). Utilization is measured on server times,
// over the whole periods after the first whose every slot was booked before the
// period began (a booking made before it takes effect after it; bookings are FIFO):
// those are filled by the limiter alone, and must reach 99% (97% for the sliding
// counter, 80% on miniredis). A period that began with no booking reaching past it had
// its queue run dry because the waiters did not run (a machine starved by other
// suites once left 62% of a period unused); it is counted, not judged. The 100 waiters
// keep half a second of bookings queued, so a waiter the scheduler runs late rarely
// leaves a period unjudged; that the waiters keep a queue at all is checked on the
// bookings themselves (some are made a whole period ahead).
func TestWaitSharesTheRate(t *testing.T) {
	parallel(t)
	const (
		workers = 100
		period  = 200 * ms
		rate    = 40
		windows = 5
	)
	eachAlgorithm(t, redistest.EachRealTime, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		limit := Limit{Rate: rate, Period: period}
		if alg == TokenBucket {
			limit.Burst = 1 // evenly spaced
		}
		l, err := New(b.Client, "share", limit, WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		total := rate * windows
		var (
			mu    sync.Mutex
			taken int
			wg    sync.WaitGroup
		)
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					mu.Lock()
					if taken >= total {
						mu.Unlock()
						return
					}
					taken++
					mu.Unlock()
					if err := l.Wait(ctx); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		if got := grants.Total(); got != total {
			t.Fatalf("granted %d permits, want %d", got, total)
		}
		most := grants.MaxInWindow(period)
		bound := rate
		if alg == FixedWindow {
			bound = 2 * rate // two aligned windows can meet inside one period
		}
		if most > bound {
			t.Fatalf("%d permits took effect within one %v window, limit %d", most, period, bound)
		}
		util, judged, windows := bookedUtilization(grants.List(), period, rate)
		perPermit := float64(grants.Calls()) / float64(total)
		redistest.Figure(t, "%v on %s: %d permits, most in any %v: %d, utilization of the %d of %d periods after the first booked before they began %.4f (all of them: %.4f), script calls per permit %.3f",
			alg, b.Kind, total, period, most, judged, windows, util, grants.Utilization(period, rate), perPermit)
		// the first round of waiters books 2.5 periods ahead at once, whatever the load
		// (a starved machine may leave no period judged: the queue ran dry in each)
		ahead := 0
		for _, g := range grants.List() {
			if g.Wait >= period {
				ahead++
			}
		}
		if ahead == 0 {
			t.Fatalf("no permit was booked a period ahead: the waiters never kept a queue")
		}
		minUtil := 0.99
		if alg == SlidingCounter {
			minUtil = 0.97 // a permit holds its place up to one bucket (1/50) longer
		}
		if b.Kind == redistest.Mini {
			// miniredis runs inside this test process: when other suites starve
			// the machine, its scripts themselves run late (0.88 measured twice
			// at load 10, before unbooked periods were left out)
			minUtil = 0.8
		}
		if judged > 0 && util < minUtil {
			t.Errorf("utilization %.4f, want >= %.2f", util, minUtil)
		}
		if perPermit > 1.05 {
			t.Errorf("%.3f script calls per permit, want <= 1.05", perPermit)
		}
	})
}

// A deadline that comes before the permits could: WaitN returns at once, books
// nothing. A context cancelled while sleeping returns at once and gives the booking
// back, in the background.
//
// Mechanisms, not timing: "at once" is "before the context's deadline" (30s; the
// permit is a minute away), and the cancellation comes once the limiter's Allowed hook
// says the sleeping waiter has booked. Nothing waits for the period: it is long so
// that a starved machine cannot run the test's next call after the permit came due
// (with 2s and a 1s deadline, a Wait at load 24 got its permit).
func TestWaitDeadlinesAndCancellation(t *testing.T) {
	const period = time.Minute
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		booked := make(chan time.Duration, 16)
		cancelled := make(chan int, 16)
		l, err := New(b.Client, "deadline", Limit{Rate: 1, Period: period}, WithKeyPrefix(b.Prefix),
			WithHooks(Hooks{Allowed: func(_ string, _ int, wait time.Duration) { booked <- wait },
				Cancelled: func(_ string, n int) { cancelled <- n }}))
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := l.Wait(ctx); err != nil { // takes the only permit
			t.Fatal(err)
		}
		<-booked
		short, cancel := context.WithTimeout(ctx, period/2)
		defer cancel()
		err = l.Wait(short)
		if !errors.Is(err, waiter.ErrWouldExceedDeadline) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait with a deadline before the permit: %v, want ErrWouldExceedDeadline (matching context.DeadlineExceeded)", err)
		}
		if short.Err() != nil {
			t.Errorf("Wait refused only at the deadline, want at once")
		}
		// a waiter whose context is cancelled while it sleeps gives its booking back
		sleeping, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- l.Wait(sleeping) }()
		if wait := <-booked; wait <= 0 {
			t.Fatalf("the waiter was granted at once (wait %v), want a booking ahead", wait)
		}
		stop()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("cancelled Wait: %v", err)
		}
		select { // the booking is given back in the background: the Cancelled hook says when
		case n := <-cancelled:
			if n != 1 {
				t.Fatalf("the cancelled Wait gave back %d permits, want 1", n)
			}
		case <-time.After(signalWait):
			t.Fatalf("the cancelled Wait's booking was not given back within %v", signalWait)
		}
		if got := grants.Total(); got != 1 {
			t.Fatalf("after a refused and a cancelled wait, %d permits stand, want 1", got)
		}
		// so the next caller gets the slot the cancelled one had
		r, err := l.Reserve(ctx, 1, 2*period)
		if err != nil || !r.OK() || r.Delay() > period {
			t.Fatalf("slot after cancel: %v %v %v", r.OK(), r.Delay(), err)
		}
	})
}

// bookedUtilization returns the share of rate used in the whole periods after the
// first whose every grant was booked before the period began: one booked before its
// start (by the server's clock, At - Wait) takes effect at or after its end, and
// bookings take effect in the order they are made. judged counts those periods,
// windows all of them.
func bookedUtilization(list []redistest.Grant, p time.Duration, rate int) (util float64, judged, windows int) {
	if len(list) == 0 {
		return 0, 0, 0
	}
	first, last := list[0].At, list[0].At
	for _, g := range list {
		first, last = minTime(first, g.At), maxTime(last, g.At)
	}
	k := int(last.Sub(first) / p)
	n := 0
	for i := 1; i < k; i++ {
		from := first.Add(time.Duration(i) * p)
		to := from.Add(p)
		windows++
		var reach time.Time // the latest effect of a booking made before from
		in := 0
		for _, g := range list {
			if g.At.Add(-g.Wait).Before(from) && g.At.After(reach) {
				reach = g.At
			}
			if !g.At.Before(from) && g.At.Before(to) {
				in += g.N
			}
		}
		if reach.Before(to) {
			continue // the queue ran dry in it
		}
		judged++
		n += in
	}
	if judged == 0 {
		return 0, 0, windows
	}
	return float64(n) / float64(judged*rate), judged, windows
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// x/time/rate's TestWaitCancel on the real clock, as one goroutine runs it, time
// stretched fourfold: with 10 per 4s and a burst of 3, WaitN(2) now (1 token left);
// WaitN(3) asleep on its booking 800ms ahead, cancelled 500ms later, when 2.25 tokens
// are back; WaitN(2) at once. The give-back goes in the background, before the
// process's next call on the key: that call is granted now, whatever the machine's
// speed (later, more tokens are back). The premise, a WaitN(3) still asleep when it
// is cancelled, depends on the machine's speed: a try whose WaitN(3) came due first
// (a loaded machine ran the 500ms sleep past 800ms, or sent WaitN(3) 800ms after
// WaitN(2)) proves nothing and is made again on a new key. Reported: how long the last WaitN took.
func TestWaitAfterCancelledWait(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for try := 1; ; try++ {
			var waited []time.Duration
			l, err := New(b.Client, "after-cancel-"+itoa(try), Limit{Rate: 10, Period: 4 * time.Second, Burst: 3}, WithAlgorithm(TokenBucket),
				WithKeyPrefix(b.Prefix), WithHooks(Hooks{Allowed: func(_ string, _ int, wait time.Duration) { waited = append(waited, wait) }}))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.WaitN(ctx, 2); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- l.WaitN(wctx, 3) }()
			var early error
			returned := false
			sendEventually(t, signalWait, "WaitN(3) asleep", func() bool {
				select {
				case early = <-done: // not asleep: granted now, WaitN(2) long past
					returned = true
					return true
				default:
					return sendSleepers(l) == 1
				}
			})
			if !returned {
				time.Sleep(500 * ms)
				cancel()
				early = <-done
			}
			cancel()
			if early == nil {
				t.Logf("try %d: WaitN(3) came due before it was cancelled (the machine is slow): again", try)
				continue
			}
			if !errors.Is(early, context.Canceled) {
				t.Fatalf("WaitN(3) cancelled: got %v, want context.Canceled", early)
			}
			start := time.Now()
			if err := l.WaitN(ctx, 2); err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			redistest.Figure(t, "WaitN(2) right after a cancelled WaitN(3): %v (booked %v ahead)", took.Round(time.Microsecond), waited[len(waited)-1])
			if w := waited[len(waited)-1]; w != 0 {
				t.Fatalf("WaitN(2) after the cancelled WaitN(3) booked %v ahead, want now: it went before the give-back", w)
			}
			return
		}
	})
}

// A WaitN whose context ends as its booking comes in (in the Allowed hook, before it
// sleeps) gives the booking back before the process's next call on the key, as one
// cancelled asleep does: WaitN(3) booked ahead of the one token left and cancelled so,
// 20 times, and each WaitN(1) after it is granted now.
func TestWaitCancelledAsItBooks(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for i := range 20 {
			wctx, cancel := context.WithCancel(ctx)
			var last time.Duration
			l, err := New(b.Client, fmt.Sprintf("cancel-as-booked-%d", i), Limit{Rate: 10, Period: 4 * time.Second, Burst: 3},
				WithAlgorithm(TokenBucket), WithKeyPrefix(b.Prefix), WithHooks(Hooks{Allowed: func(_ string, n int, wait time.Duration) {
					if last = wait; n == 3 {
						cancel()
					}
				}}))
			if err != nil {
				t.Fatal(err)
			}
			if err := l.WaitN(ctx, 2); err != nil {
				t.Fatal(err)
			}
			if err := l.WaitN(wctx, 3); !errors.Is(err, context.Canceled) || last <= 0 {
				t.Fatalf("WaitN(3) with one token left, cancelled as it booked: %v, booked %v ahead; want context.Canceled, ahead", err, last)
			}
			if err := l.WaitN(ctx, 1); err != nil || last != 0 {
				t.Fatalf("try %d: WaitN(1) after it: %v, booked %v ahead; want now: it went before the give-back", i+1, err, last)
			}
		}
	})
}

// A WaitN whose context ends while a move has its booking gives back what it holds
// before the process's next call on the key, as one cancelled asleep does: WaitN(2)
// asleep ahead of the one token left, moved by Pause, cancelled during the hold (it is
// not booked again) or as Resume's move books it again (in the Allowed hook of that
// booking: the new one goes back), 20 times each, and each Allow after it is granted.
func TestWaitCancelledAsItIsMoved(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		for i := range 40 {
			inHold := i%2 == 1
			wctx, cancel := context.WithCancel(ctx)
			var armed atomic.Bool // the next booking of 2 is the move's
			l := tl.limiter(fmt.Sprintf("cancel-as-moved-%d", i), Limit{Rate: 1, Period: 10 * time.Second, Burst: 2},
				WithAlgorithm(TokenBucket), WithHooks(Hooks{Allowed: func(_ string, n int, wait time.Duration) {
					if n == 2 && wait > 0 && armed.CompareAndSwap(true, false) {
						cancel()
					}
				}}))
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("Allow: %+v, %v", res, err)
			}
			done := make(chan error, 1)
			go func() { done <- l.WaitN(wctx, 2) }()
			sendEventually(t, signalWait, "WaitN(2) asleep", func() bool { return sendSleepers(l) == 1 })
			if err := l.Pause(ctx, time.Hour); err != nil { // its move gives the booking back, and waits for the hold
				t.Fatal(err)
			}
			if inHold {
				cancel()
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Fatalf("WaitN(2) cancelled during the hold: %v, want context.Canceled", err)
				}
			}
			armed.Store(true)
			if err := l.Resume(ctx); err != nil { // the hold ends: the move books the waiter again, if it is still there
				t.Fatal(err)
			}
			if !inHold {
				if err := <-done; !errors.Is(err, context.Canceled) {
					t.Fatalf("WaitN(2) cancelled as it was booked again: %v, want context.Canceled", err)
				}
			}
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("try %d (cancelled in the hold %v): Allow after it: %+v, %v; want allowed: it went before the give-back", i+1, inHold, res, err)
			}
			cancel()
		}
	})
}

// A Wait returns by its deadline whatever Redis's reply latency: with every script
// call's reply 300ms late (the server's clock standing still, so its booking is
// exactly its slot ahead) and a deadline 150ms after its slot, whether its reply comes
// after the deadline (slot 100ms), comes before it and the Wait sleeps past it (slot
// 400ms), or comes as this process holds the key (slot 300ms; a Pause 100ms after the
// Wait began: its booking must go back and the Wait book after the hold, which its
// deadline does not allow). Asserted: each returns before its give-back's reply (the
// Cancelled hook), which comes 300ms after it was sent, and so in the background.
// Reported: how long after its deadline each returned.
func TestWaitDeadlineWhileRepliesAreLate(t *testing.T) {
	for _, c := range []struct {
		name  string
		slot  time.Duration
		pause bool
	}{{"reply after the deadline", 100 * ms, false}, {"asleep past the deadline", 400 * ms, false},
		{"held as its reply comes", 300 * ms, true}} {
		t.Run(c.name, func(t *testing.T) {
			l, proxy, w, _, _ := sendSlowLimiter(t, "late-"+itoa(int(c.slot/ms)), Limit{Rate: 1, Period: c.slot})
			ctx := context.Background()
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("Allow: got %+v, %v; want allowed", res, err)
			}
			proxy.Delay("evalsha", 300*ms)
			defer proxy.Delay("", 0)
			start := time.Now()
			dctx, cancel := context.WithDeadline(ctx, start.Add(c.slot+150*ms))
			defer cancel()
			if c.pause {
				go func() {
					time.Sleep(100 * ms)
					_ = l.Pause(ctx, time.Second) // its hold is set at once; its call is late too
				}()
			}
			err := l.Wait(dctx)
			returned := time.Now()
			gaveBack := w.cancelled.Load()
			dl, _ := dctx.Deadline()
			redistest.Figure(t, "%s: Wait returned %+v from its deadline: %v", c.name, returned.Sub(dl).Round(time.Microsecond), err)
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("Wait: got %v, want an error matching context.DeadlineExceeded", err)
			}
			if gaveBack != 0 {
				t.Fatalf("Wait returned after its booking's give-back was answered, 300ms after it was sent; want before")
			}
			if returned.Sub(dl) > sendPrompt {
				t.Fatalf("Wait returned %v after its deadline, want at most %v", returned.Sub(dl), sendPrompt)
			}
		})
	}
}

// A Wait whose permits take effect after its deadline returns an error matching
// context.DeadlineExceeded and gives them back, even if the deadline's own timer has not
// run by then (a loaded machine: the select in the sleep picks either of two ready
// channels). The context stands for that timer: its deadline is set as the booking's
// reply comes back (so the booking was granted, sent without one), halfway through the
// 400ms its permits are booked ahead, and its Done never closes.
func TestWaitWakingPastItsDeadline(t *testing.T) {
	l, _, w, trip, grants := sendSlowLimiter(t, "wake-past", Limit{Rate: 1, Period: 400 * ms})
	ctx := context.Background()
	if res, err := l.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("Allow: got %+v, %v; want allowed", res, err)
	}
	lctx := &lateTimerCtx{Context: ctx}
	trip.after = func() { lctx.dl.Store(time.Now().Add(200 * ms).UnixNano()) }
	trip.armed.Store(true)
	if err := l.Wait(lctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait woken after its deadline: got %v, want an error matching context.DeadlineExceeded", err)
	}
	sendOneGiveBack(t, l, w, grants)
}

// lateTimerCtx is a context whose deadline (none until set) has passed while its Done
// channel is not closed yet: its timer has not run.
type lateTimerCtx struct {
	context.Context
	dl atomic.Int64 // Unix nanoseconds; 0: no deadline
}

func (c *lateTimerCtx) Deadline() (time.Time, bool) {
	if ns := c.dl.Load(); ns != 0 {
		return time.Unix(0, ns), true
	}
	return time.Time{}, false
}

// A tenant's Wait holds its place while its turn has not come and asks again when it
// does: a noisy tenant's 16 waiters in two processes, each asking again as soon as it is
// granted, and a quiet tenant's waits, which begin once a noisy waiter has been told to
// wait for its turn (the Denied hook with Turn: the noisy backlog reaches beyond the
// horizon however slowly the machine runs its calls), on the real clock, all get their
// permits, never beyond the limit, the noisy waiters coming back with their place. How
// many noisy permits came while the quiet tenant's were served is a figure: fairness is
// checked on the fake timeline (tenant_test.go).
func TestTenantWaitTakesItsTurn(t *testing.T) {
	parallel(t)
	const rate, noisy, quiet = 40, 16, 4
	eachAlgorithm(t, redistest.EachRealTime, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		limit := PerSecond(rate)
		if alg == TokenBucket {
			limit.Burst = 1 // evenly spaced
		}
		addrs, cluster := b.Addrs()
		other := redistest.Dial(addrs, cluster)
		t.Cleanup(func() { other.Close() })
		grants, otherGrants := redistest.RecordGrants(b.Client), redistest.RecordGrants(other)
		var turns atomic.Int32
		hooks := Hooks{Denied: func(_ string, _ int, r Result) {
			if r.Turn {
				turns.Add(1)
			}
		}}
		var procs []*Limiter
		for _, c := range []redis.UniversalClient{b.Client, other} {
			l, err := New(c, "turns", limit, WithAlgorithm(alg), WithKeyPrefix(b.Prefix), WithHooks(hooks))
			if err != nil {
				t.Fatal(err)
			}
			procs = append(procs, l)
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var wg sync.WaitGroup
		var noisyGranted atomic.Int32
		var stop atomic.Bool
		for w := 0; w < noisy; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for !stop.Load() {
					if err := procs[w%2].Tenant("noisy").Wait(ctx); err != nil {
						t.Error(err)
						return
					}
					noisyGranted.Add(1)
				}
			}()
		}
		for turns.Load() == 0 {
			if ctx.Err() != nil {
				stop.Store(true)
				wg.Wait()
				t.Fatal("no noisy waiter was told to wait for its turn in a minute")
			}
			time.Sleep(time.Millisecond)
		}
		before := noisyGranted.Load()
		for i := 0; i < quiet; i++ {
			if err := procs[i%2].Tenant("quiet").Wait(ctx); err != nil {
				stop.Store(true)
				wg.Wait()
				t.Fatal(err)
			}
		}
		during := noisyGranted.Load() - before
		stop.Store(true)
		wg.Wait()
		grants.Add(otherGrants.List()...)
		if got, want := grants.Total(), int(noisyGranted.Load())+quiet; got != want {
			t.Fatalf("granted %d permits, want %d", got, want)
		}
		if most := grants.MaxInWindow(time.Second); alg != FixedWindow && most > rate {
			t.Fatalf("%d permits in a second, limit %d", most, rate)
		}
		redistest.Figure(t, "%v %s: %d of the noisy tenant's permits came while the quiet tenant's %d were served; %d waits for a turn",
			alg, b.Kind, during, quiet, turns.Load())
	})
}

// A waiter that a move books again while Redis is unreachable gets what a WaitN made
// then would: under FailLocal, a grant of this process's share, not ErrUnavailable.
// Here the key is paused by this process after Redis went away: the move cannot give
// the booking back nor book again in Redis, and the waiter, an hour from its slot,
// goes on the share once the hold is over.
func TestWaitMovedWhileRedisIsDownFallsBackToThePolicy(t *testing.T) {
	for _, kind := range []redistest.Kind{redistest.Mini, redistest.Standalone} {
		t.Run(string(kind), func(t *testing.T) {
			b := redistest.New(t, kind)
			addrs, _ := b.Addrs()
			target := addrs[0]
			if b.Mini != nil {
				target = b.Mini.Addr()
			}
			proxy, err := redistest.NewProxy(target)
			if err != nil {
				t.Fatal(err)
			}
			defer proxy.Close()
			rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1, DialTimeout: 100 * ms})
			defer rdb.Close()
			var waits waitRecorder
			var degraded atomic.Int32
			hooks := waits.hooks()
			hooks.Degraded = func(string, FailurePolicy, error) { degraded.Add(1) }
			l, err := New(rdb, "moved-down", Limit{Rate: 1, Period: time.Hour}, WithKeyPrefix(b.Prefix),
				WithFailurePolicy(FailLocal(1)), WithHooks(hooks))
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("Allow: %+v, %v", res, err)
			}
			done := make(chan error, 1)
			go func() { done <- l.Wait(ctx) }()
			for deadline := time.Now().Add(signalWait); waits.count() < 2; time.Sleep(ms) {
				if time.Now().After(deadline) {
					t.Fatalf("the waiter did not book within %v", signalWait)
				}
			}
			ks := l.client().key(l.t.tag)
			for deadline := time.Now().Add(signalWait); ; time.Sleep(ms) {
				ks.mu.Lock()
				asleep := len(ks.sleepers)
				ks.mu.Unlock()
				if asleep == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("the waiter was not asleep on its booking within %v", signalWait)
				}
			}
			proxy.Close() // Redis unreachable: connections closed, new ones refused
			if err := l.Pause(ctx, 50*ms); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("Pause with Redis unreachable: %v, want ErrUnavailable", err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("the moved waiter: %v, want granted by its FailLocal share as a WaitN made now", err)
				}
			case <-time.After(signalWait):
				t.Fatalf("the moved waiter did not return within %v", signalWait)
			}
			if degraded.Load() == 0 {
				t.Fatal("no Degraded report: the moved waiter was not granted by the failure policy")
			}
		})
	}
}

// A process's waiters that sleep one after another keep the key's one subscription (its
// listener stays from one to the next), so the check for a pause missed before a subscription is
// confirmed (checkPauses, one script call) runs once, not at every sleep: a lone Wait loop
// makes one script call per permit, and one more at most.
func TestSleepsInTurnKeepOneSubscription(t *testing.T) {
	const waits = 4
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		l, err := New(b.Client, "inturn", Every(250*time.Millisecond), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if r, err := l.Allow(ctx); err != nil || !r.Allowed { // the burst: each Wait after it sleeps about 250ms
			t.Fatalf("the first Allow: %+v, %v", r, err)
		}
		calls := &cmdCount{match: func(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }}
		b.Client.AddHook(calls)
		for range waits {
			if err := l.Wait(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if n := calls.n.Load(); n > waits+1 {
			t.Errorf("%d Waits in turn made %d script calls, want at most %d", waits, n, waits+1)
		}
	})
}
