package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"golang.org/x/time/rate"
)

// golang.org/x/time/rate's own tests (rate_test.go), at the throttle API on a Redis
// token bucket: rate.NewLimiter(r, b) is Limit{Rate: r, Period: time.Second, Burst: b},
// lim.reserveN(t, n, max) is Reserve at t, r.CancelAt(t) is the reservation's Cancel
// at t, SetLimitAt and SetBurstAt are an Override at t (rates and bursts in force
// given), AllowN is AllowN, TokensAt is Inspect's available tokens (whole tokens:
// every figure of these cases is one). The server's clock is the test's: it may go
// back, as x/time/rate's t does in its jump-back cases. n above the burst, which
// x/time/rate refuses with ok false, is ErrExceedsLimit here.
//
// Two differences of the API, not of the bucket, shape two cases. A reservation has
// taken effect at its time, so its Cancel then does nothing (x/time/rate's CancelAt
// still gives back at exactly timeToAct): Cancel1Token cancels 1µs before. An n above
// the callers' own burst is refused before any call, even while an override raises
// the burst: ReserveSetBurst's callers have the higher burst, lowered by an override
// from t0 and raised back by ClearOverride.

// xd is rate_test.go's d: the cases' times are multiples of it.
const xd = 100 * time.Millisecond

// xstep is one step of a case: at t0 + at·xd,
//   - reserve: Reserve(n) within max (0: an hour) is ok and takes effect at act·xd
//     (from t0), remembered as reservation id when id > 0;
//   - allow: Inspect shows toks tokens, then AllowN(n) answers ok;
//   - cancel: reservation id's Cancel;
//   - set: an Override to rate and burst.
type xstep struct {
	kind    string
	at      int
	n       int
	act     int
	ok      bool
	max     time.Duration
	id      int
	toks    int
	early   time.Duration // a cancel's time: at·xd less this
	rate    int
	burst   int
	exceeds bool // n is above the burst: ErrExceedsLimit
}

func xreserve(at, n, act int, ok bool) xstep {
	return xstep{kind: "reserve", at: at, n: n, act: act, ok: ok}
}
func xreserveID(id, at, n, act int) xstep {
	return xstep{kind: "reserve", at: at, n: n, act: act, ok: true, id: id}
}
func xallow(at, toks, n int, ok bool) xstep {
	return xstep{kind: "allow", at: at, toks: toks, n: n, ok: ok}
}
func xcancel(id, at int) xstep { return xstep{kind: "cancel", at: at, id: id} }
func xset(at, r, b int) xstep  { return xstep{kind: "set", at: at, rate: r, burst: b} }
func xclear(at int) xstep      { return xstep{kind: "clear", at: at} }

// runXSteps runs a case's steps on a token bucket of r per second and burst b.
func runXSteps(t *testing.T, tl *timeline, key string, r, b int, steps []xstep) {
	t.Helper()
	ctx := context.Background()
	l := tl.limiter(key, Limit{Rate: r, Period: time.Second, Burst: b}, WithAlgorithm(TokenBucket))
	res := map[int]*waiter.Reservation{}
	for i, s := range steps {
		tl.at(time.Duration(s.at)*xd - s.early)
		switch s.kind {
		case "reserve":
			maxWait := s.max
			if maxWait == 0 {
				maxWait = time.Hour
			}
			rv, err := l.Reserve(ctx, s.n, maxWait)
			if s.exceeds {
				if !errors.Is(err, ErrExceedsLimit) {
					t.Fatalf("step %d: Reserve(t%d, %d): got %v, want ErrExceedsLimit (n above the burst)", i, s.at, s.n, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("step %d: Reserve(t%d, %d): %v", i, s.at, s.n, err)
			}
			act := time.Duration(s.at)*xd + rv.Delay()
			if rv.OK() != s.ok || (s.ok && act != time.Duration(s.act)*xd) {
				t.Fatalf("step %d: Reserve(t%d, %d, %v) = (t0+%v, %v), want (t%d, %v)", i, s.at, s.n, maxWait, act, rv.OK(), s.act, s.ok)
			}
			if s.id > 0 {
				res[s.id] = rv
			}
		case "allow":
			st, err := l.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if toks := st.Limits[0].Capacity - st.Limits[0].Used; toks != s.toks {
				t.Fatalf("step %d: tokens at t%d: got %d, want %d", i, s.at, toks, s.toks)
			}
			got, err := l.AllowN(ctx, s.n)
			if s.exceeds {
				if !errors.Is(err, ErrExceedsLimit) {
					t.Fatalf("step %d: AllowN(t%d, %d): got %v, want ErrExceedsLimit (n above the burst)", i, s.at, s.n, err)
				}
				continue
			}
			if err != nil || got.Allowed != s.ok {
				t.Fatalf("step %d: AllowN(t%d, %d): got %+v, %v; want allowed %v", i, s.at, s.n, got, err, s.ok)
			}
		case "cancel":
			if err := res[s.id].Cancel(ctx); err != nil {
				t.Fatalf("step %d: Cancel of reservation %d at t%d: %v", i, s.id, s.at, err)
			}
		case "set":
			if err := l.Override(ctx, 0, Limit{Rate: s.rate, Burst: s.burst}); err != nil {
				t.Fatalf("step %d: Override at t%d to %d/s burst %d: %v", i, s.at, s.rate, s.burst, err)
			}
		case "clear":
			if err := l.ClearOverride(ctx); err != nil {
				t.Fatalf("step %d: ClearOverride at t%d: %v", i, s.at, err)
			}
		}
	}
}

func TestXRateCases(t *testing.T) {
	exceeds := func(s xstep) xstep { s.exceeds = true; return s }
	withMax := func(s xstep, d time.Duration) xstep { s.max = d; return s }
	early := func(s xstep, d time.Duration) xstep { s.early = d; return s }
	cases := []struct {
		name  string
		r, b  int
		steps []xstep
	}{
		{"LimiterBurst1", 10, 1, []xstep{
			xallow(0, 1, 1, true), xallow(0, 0, 1, false), xallow(0, 0, 1, false),
			xallow(1, 1, 1, true), xallow(1, 0, 1, false), xallow(1, 0, 1, false),
			exceeds(xallow(2, 1, 2, false)), // burst size is 1, so n=2 always fails
			xallow(2, 1, 1, true), xallow(2, 0, 1, false),
		}},
		{"LimiterBurst3", 10, 3, []xstep{
			xallow(0, 3, 2, true), xallow(0, 1, 2, false), xallow(0, 1, 1, true), xallow(0, 0, 1, false),
			exceeds(xallow(1, 1, 4, false)),
			xallow(2, 2, 1, true), xallow(3, 2, 1, true), xallow(4, 2, 1, true), xallow(4, 1, 1, true),
			xallow(4, 0, 1, false), xallow(4, 0, 1, false), xallow(9, 3, 3, true), xallow(9, 0, 0, true),
		}},
		{"LimiterJumpBackwards", 10, 3, []xstep{
			xallow(1, 3, 1, true), // start at t1
			xallow(0, 2, 1, true), // jump back to t0, two tokens remain
			xallow(0, 1, 1, true), xallow(0, 0, 1, false), xallow(0, 0, 1, false),
			xallow(1, 1, 1, true), // got a token
			xallow(1, 0, 1, false), xallow(1, 0, 1, false),
			xallow(2, 1, 1, true), // got another token
			xallow(2, 0, 1, false), xallow(2, 0, 1, false),
		}},
		{"SimpleReserve", 10, 2, []xstep{xreserve(0, 2, 0, true), xreserve(0, 2, 2, true), xreserve(3, 2, 4, true)}},
		{"Mix", 10, 2, []xstep{
			exceeds(xreserve(0, 3, 1, false)), // n > Burst
			xreserve(0, 2, 0, true),
			xallow(1, 1, 2, false), // not enough tokens
			xreserve(1, 2, 2, true),
			xallow(1, -1, 1, false), // negative tokens
			xallow(3, 1, 1, true),
		}},
		{"CancelInvalid", 10, 2, []xstep{
			xreserve(0, 2, 0, true),
			exceeds(xreserve(0, 3, 3, false)), // nothing booked: nothing to cancel
			xreserve(0, 2, 2, true),           // did not get extra tokens
		}},
		{"CancelLast", 10, 2, []xstep{
			xreserve(0, 2, 0, true), xreserveID(1, 0, 2, 2),
			xcancel(1, 1), // got 2 tokens back
			xreserve(1, 2, 2, true),
		}},
		{"CancelTooLate", 10, 2, []xstep{
			xreserve(0, 2, 0, true), xreserveID(1, 0, 2, 2),
			xcancel(1, 3), // too late to cancel: no effect
			xreserve(3, 2, 4, true),
		}},
		{"Cancel0Tokens", 10, 2, []xstep{
			xreserve(0, 2, 0, true), xreserveID(1, 0, 1, 1), xreserve(0, 1, 2, true),
			xcancel(1, 0), // got 0 tokens back
			xreserve(0, 1, 3, true),
		}},
		{"Cancel1Token", 10, 2, []xstep{
			xreserve(0, 2, 0, true), xreserveID(1, 0, 2, 2), xreserve(0, 1, 3, true),
			early(xcancel(1, 2), time.Microsecond), // got 1 token back
			xreserve(2, 2, 4, true),
		}},
		{"CancelMulti", 10, 4, []xstep{
			xreserve(0, 4, 0, true), xreserveID(1, 0, 3, 3), xreserve(0, 1, 4, true), xreserveID(3, 0, 1, 5),
			xcancel(3, 1), // get 1 token back
			xcancel(1, 1), // get 2 tokens back, as if C was never reserved
			xreserve(1, 3, 5, true),
		}},
		{"ReserveJumpBack", 10, 2, []xstep{
			xreserve(1, 2, 1, true), // start at t1
			xreserve(0, 1, 1, true), // should violate Limit, Burst
			xreserve(2, 2, 3, true),
			exceeds(xreserve(0, 3, 0, false)), // burst size is 2: n=3 always fails, the state unchanged
			xreserve(2, 1, 4, true),
			withMax(xreserve(0, 2, 0, false), xd), // beyond maxReserve: fails, the state unchanged
			xreserve(2, 1, 5, true),
		}},
		{"ReserveJumpBackCancel", 10, 2, []xstep{
			xreserve(1, 2, 1, true), // start at t1
			xreserveID(1, 1, 2, 3),
			xreserve(1, 1, 4, true),
			xcancel(1, 0),           // cancel at t0, get 1 token back
			xreserve(1, 2, 4, true), // should violate Limit, Burst
		}},
		{"ReserveSetLimit", 5, 2, []xstep{
			xreserve(0, 2, 0, true), xreserve(0, 2, 4, true),
			xset(2, 10, 2),
			xreserve(2, 1, 4, true), // violates Limit and Burst
		}},
		{"ReserveSetBurst", 5, 4, []xstep{
			xset(0, 5, 2),
			xreserve(0, 2, 0, true), xreserve(0, 2, 4, true),
			xclear(3),
			xreserve(0, 4, 9, true), // violates Limit and Burst
		}},
		{"ReserveSetLimitCancel", 5, 2, []xstep{
			xreserve(0, 2, 0, true), xreserveID(1, 0, 2, 4),
			xset(2, 10, 2),
			xcancel(1, 2), // 2 tokens back
			xreserve(2, 2, 3, true),
		}},
		{"ReserveMax", 10, 2, []xstep{
			withMax(xreserve(0, 2, 0, true), xd),
			withMax(xreserve(0, 1, 1, true), xd),  // reserve for close future
			withMax(xreserve(0, 1, 2, false), xd), // time to act too far in the future
		}},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				runXSteps(t, newTimeline(t, b), "x"+c.name, c.r, c.b, c.steps)
			})
		}
	})
}

// TestWaitCancel: after a Wait whose context ended gives its booking back, the next
// WaitN goes at once: rate.NewLimiter(10, 3); WaitN(2) now (1 token left); WaitN(3),
// cancelled while it waits, gives its 3 tokens back (2 left after d); WaitN(2) now.
// Time is stretched a thousandfold (10 per 1000s, d = 100s) so that the cancelled
// WaitN, which sleeps on the real clock, is surely still waiting when it is cancelled.
// The give-back goes in the background once the Wait returned, before the process's
// next call on the key: the Inspect made right after finds the tokens back.
func TestXRateWaitCancel(t *testing.T) {
	const d = 1000 * xd
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		var waits waitRecorder
		cancelled := make(chan int, 1)
		hooks := waits.hooks()
		hooks.Cancelled = func(_ string, n int) { cancelled <- n }
		l := tl.limiter("wait-cancel", Limit{Rate: 10, Period: 1000 * time.Second, Burst: 3}, WithAlgorithm(TokenBucket), WithHooks(hooks))
		if err := l.WaitN(ctx, 2); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- l.WaitN(wctx, 3) }()
		for deadline := time.Now().Add(signalWait); waits.count() < 2; time.Sleep(ms) {
			if time.Now().After(deadline) {
				t.Fatalf("WaitN(3) did not book within %v", signalWait)
			}
		}
		if w := waits.since(1); w[0] != 2*d {
			t.Fatalf("WaitN(3) booked %v ahead, want %v", w[0], 2*d)
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitN(3) cancelled: got %v, want context.Canceled", err)
		}
		st, err := l.Inspect(ctx) // made after the cancelled WaitN returned: after its give-back
		if err != nil {
			t.Fatal(err)
		}
		if toks := st.Limits[0].Capacity - st.Limits[0].Used; toks != 1 {
			t.Fatalf("tokens after the give-back: got %d, want 1 (x/time/rate: 1 at t0; 2 once d refilled)", toks)
		}
		// the hook runs once the give-back's reply is in, maybe after the Inspect's
		select {
		case n := <-cancelled:
			if n != 3 {
				t.Fatalf("gave back %d permits, want 3", n)
			}
		case <-time.After(signalWait):
			t.Fatalf("no Cancelled hook within %v of the give-back", signalWait)
		}
		tl.at(d)
		if err := l.WaitN(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if w := waits.since(2); len(w) != 1 || w[0] != 0 {
			t.Fatalf("WaitN(2) after the give-back waited %v, want to go at once", w)
		}
	})
}

// TestWaitTimeout and TestWaitSimple: a WaitN whose permits would come after its
// context's deadline returns at once, booking nothing; one above the burst is
// ErrExceedsLimit; a done context is its error. Time is stretched a thousandfold, as
// in TestXRateWaitCancel: the deadline is d = 100s, the wait 200s.
func TestXRateWaitTimeout(t *testing.T) {
	const d = 1000 * xd
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("wait-timeout", Limit{Rate: 10, Period: 1000 * time.Second, Burst: 3}, WithAlgorithm(TokenBucket))
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := l.WaitN(done, 1); !errors.Is(err, context.Canceled) {
			t.Fatalf("WaitN with a done context: got %v, want context.Canceled", err)
		}
		if err := l.WaitN(ctx, 4); !errors.Is(err, ErrExceedsLimit) {
			t.Fatalf("WaitN(4), burst 3: got %v, want ErrExceedsLimit", err)
		}
		if err := l.WaitN(ctx, 2); err != nil {
			t.Fatal(err)
		}
		short, stop := context.WithTimeout(ctx, d)
		defer stop()
		if err := l.WaitN(short, 3); !errors.Is(err, waiter.ErrWouldExceedDeadline) {
			t.Fatalf("WaitN(3) with 1 token and a deadline of half the wait: got %v, want ErrWouldExceedDeadline", err)
		}
		if st, err := l.Inspect(ctx); err != nil || st.Limits[0].Capacity-st.Limits[0].Used != 1 {
			t.Fatalf("after the refused WaitN: %+v, %v; want 1 token, nothing booked", st, err)
		}
	})
}

// TestSimultaneousRequests: a very slow bucket of burst 5, 15 Allows at once (from
// this process and another): exactly 5 are allowed.
func TestXRateSimultaneousRequests(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		lim := Limit{Rate: 1, Period: time.Second, Burst: 5}
		ls := []*Limiter{
			tl.limiter("simultaneous", lim, WithAlgorithm(TokenBucket)),
			ctlLimiterOn(tl, ctlOtherClient(t, b), "simultaneous", lim, WithAlgorithm(TokenBucket)),
		}
		var ok atomic.Int32
		var wg sync.WaitGroup
		for i := range 15 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r, err := ls[i%2].Allow(context.Background())
				if err != nil {
					t.Error(err)
				}
				if r.Allowed {
					ok.Add(1)
				}
			}()
		}
		wg.Wait()
		if got := ok.Load(); got != 5 {
			t.Fatalf("%d allowed, want the burst, 5", got)
		}
	})
}

// TestLongRunningQPS: 100 per second, burst 100, an Allow every 2ms for 5 seconds
// (fake): never more than the burst plus the rate times the time, and all but 0.1% of
// it.
func TestXRateLongRunningQPS(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		const limit, burst = 100, 100
		elapsed := 5 * time.Second
		if b.Kind != redistest.Standalone {
			elapsed = 2 * time.Second // as eachModelCase's steps
		}
		tl := newTimeline(t, b)
		l := tl.limiter("qps", Limit{Rate: limit, Period: time.Second, Burst: burst}, WithAlgorithm(TokenBucket))
		ok := 0
		for at := time.Duration(0); at < elapsed; at += 2 * ms {
			tl.at(at)
			r, err := l.Allow(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if r.Allowed {
				ok++
			}
		}
		ideal := burst + limit*elapsed.Seconds()
		if ok > int(ideal+1) || ok < int(0.999*ideal) {
			t.Fatalf("%d allowed in %v, want %d (ideal %.1f) to %d", ok, elapsed, int(0.999*ideal), ideal, int(ideal+1))
		}
	})
}

// xchange is a change of a bucket's limits at tc, made by an Override set at tc, by
// ClearOverride at tc (the callers' limits are then the new ones and an override of
// the old ones was set at t0), or by an override of the old ones that expires at tc.
type xchange string

const (
	xbySet    xchange = "set"
	xbyClear  xchange = "clear"
	xbyExpiry xchange = "expiry"
)

// xchanged makes a token bucket whose limits are from until tc and to after it, the
// change made as by says; it returns the limiter and a func to call at tc.
func xchanged(t *testing.T, tl *timeline, key string, from, to Limit, tc time.Duration, by xchange) (*Limiter, func()) {
	t.Helper()
	ctx := context.Background()
	callers := from
	if by != xbySet {
		callers = to
	}
	l := tl.limiter(key, callers, WithAlgorithm(TokenBucket))
	switch by {
	case xbySet:
		return l, func() {
			if err := l.Override(ctx, 0, Limit{Rate: to.Rate, Burst: to.Burst}); err != nil {
				t.Fatal(err)
			}
		}
	case xbyClear:
		if err := l.Override(ctx, 0, Limit{Rate: from.Rate, Burst: from.Burst}); err != nil {
			t.Fatal(err)
		}
		return l, func() {
			if err := l.ClearOverride(ctx); err != nil {
				t.Fatal(err)
			}
		}
	default:
		if err := l.Override(ctx, tc, Limit{Rate: from.Rate, Burst: from.Burst}); err != nil {
			t.Fatal(err)
		}
		return l, func() {} // it ends by itself
	}
}

// A change of rate or burst keeps the tokens the bucket holds at the change, as
// x/time/rate's SetLimitAt and SetBurstAt do, whether an override is set, cleared or
// expires at the change: each scenario's answers after the change are x/time/rate's
// (the oracle, changed at the same time).
func TestXRateChanges(t *testing.T) {
	p45 := time.Duration(1<<45) * time.Microsecond
	scenarios := []struct {
		name     string
		from, to Limit
		before   []int // permits taken at t0, one AllowN each
		tc       time.Duration
		// after the change: at each time (from t0), AllowN(n) answers the oracle's
		probes []struct {
			at time.Duration
			n  int
		}
		want func(t *testing.T, got []Result) // the scenario's own claim
	}{
		{
			// raising 5/s to 10/s does not make the next permit later than without the
			// raise: x/time/rate books it 200ms after the change (400ms without)
			name: "raise-rate", from: Limit{Rate: 5, Period: time.Second, Burst: 2}, to: Limit{Rate: 10, Period: time.Second, Burst: 2},
			before: []int{2, 2}, tc: 2 * xd,
			probes: []struct {
				at time.Duration
				n  int
			}{{2 * xd, 1}, {4 * xd, 1}},
			want: func(t *testing.T, got []Result) {
				if got[0].Allowed || got[0].RetryAfter != 2*xd {
					t.Fatalf("right after the raise: got %+v, want denied, RetryAfter 200ms (400ms without the raise)", got[0])
				}
			},
		},
		{
			// a drained bucket of 1 per 2^45µs raised to 10 per second (the period stays:
			// 351843721 per 2^45µs) answers a short wait
			name: "raise-tiny-rate", from: Limit{Rate: 1, Period: p45, Burst: 1}, to: Limit{Rate: 351843721, Period: p45, Burst: 1},
			before: []int{1}, tc: xd,
			probes: []struct {
				at time.Duration
				n  int
			}{{xd, 1}, {2 * xd, 1}},
			want: func(t *testing.T, got []Result) {
				if got[0].Allowed || got[0].RetryAfter > xd {
					t.Fatalf("right after the raise: got %+v, want denied for at most 100ms", got[0])
				}
				if !got[1].Allowed {
					t.Fatalf("100ms after the raise: got %+v, want allowed", got[1])
				}
			},
		},
		{
			// lowering a drained 10/s burst-2 bucket to 1/s grants nothing for a second
			name: "lower-rate", from: Limit{Rate: 10, Period: time.Second, Burst: 2}, to: Limit{Rate: 1, Period: time.Second, Burst: 2},
			before: []int{2}, tc: 0,
			probes: []struct {
				at time.Duration
				n  int
			}{{0, 1}, {5 * xd, 1}, {10*xd - time.Microsecond, 1}, {10 * xd, 1}, {10 * xd, 1}},
			want: func(t *testing.T, got []Result) {
				for i, r := range got[:3] {
					if r.Allowed {
						t.Fatalf("probe %d within a second of lowering a drained bucket to 1/s: allowed", i)
					}
				}
				if !got[3].Allowed || got[4].Allowed {
					t.Fatalf("a second after: got %+v, %+v; want one permit", got[3], got[4])
				}
			},
		},
		{
			// raising the burst does not hand a drained bucket the whole new burst
			name: "raise-burst", from: Limit{Rate: 10, Period: time.Second, Burst: 2}, to: Limit{Rate: 10, Period: time.Second, Burst: 10},
			before: []int{2}, tc: 0,
			probes: []struct {
				at time.Duration
				n  int
			}{{0, 1}, {xd, 1}, {xd, 1}, {10 * xd, 2}, {10 * xd, 2}, {20 * xd, 2}},
			want: func(t *testing.T, got []Result) {
				if got[0].Allowed || !got[1].Allowed || got[2].Allowed {
					t.Fatalf("after raising the burst of a drained bucket: got %+v, %+v, %+v; want one token per 100ms", got[0], got[1], got[2])
				}
			},
		},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, sc := range scenarios {
			for _, by := range []xchange{xbySet, xbyClear, xbyExpiry} {
				if by == xbyExpiry && sc.tc == 0 {
					continue // an override cannot expire at once
				}
				t.Run(sc.name+"-by-"+string(by), func(t *testing.T) {
					ctx := context.Background()
					tl := newTimeline(t, b)
					l, change := xchanged(t, tl, "change-"+sc.name+"-"+string(by), sc.from, sc.to, sc.tc, by)
					perSec := func(l Limit) rate.Limit { return rate.Limit(float64(l.Rate) / l.Period.Seconds()) }
					oracle := rate.NewLimiter(perSec(sc.from), sc.from.Burst)
					t0 := redistest.Epoch
					for _, n := range sc.before {
						want := oracle.ReserveN(t0, n)
						got, err := l.Reserve(ctx, n, time.Hour)
						if err != nil {
							t.Fatal(err)
						}
						if got.OK() != want.OK() || got.Delay() != want.DelayFrom(t0) {
							t.Fatalf("before the change: Reserve(%d) = %v %v; x/time/rate %v %v", n, got.OK(), got.Delay(), want.OK(), want.DelayFrom(t0))
						}
					}
					tl.at(sc.tc)
					change()
					oracle.SetLimitAt(t0.Add(sc.tc), perSec(sc.to))
					oracle.SetBurstAt(t0.Add(sc.tc), sc.to.Burst)
					var got []Result
					for i, p := range sc.probes {
						tl.at(p.at)
						now := t0.Add(p.at)
						tokens := oracle.TokensAt(now)
						st, err := l.Inspect(ctx)
						if err != nil {
							t.Fatal(err)
						}
						if avail := st.Limits[0].Capacity - st.Limits[0].Used; avail != int(math.Floor(tokens+1e-9)) {
							t.Fatalf("probe %d (t0+%v): %d whole tokens, x/time/rate %.6f", i, p.at, avail, tokens)
						}
						r, err := l.AllowN(ctx, p.n)
						if err != nil {
							t.Fatal(err)
						}
						want := oracle.AllowN(now, p.n)
						if r.Allowed != want {
							t.Fatalf("probe %d (t0+%v, n=%d): allowed %v, x/time/rate %v (tokens %.6f)", i, p.at, p.n, r.Allowed, want, tokens)
						}
						if !want {
							wantWait := time.Duration(math.Ceil((float64(p.n)-tokens)/float64(perSec(sc.to))*1e6)) * time.Microsecond
							if d := r.RetryAfter - wantWait; d < -time.Microsecond || d > time.Microsecond {
								t.Fatalf("probe %d (t0+%v, n=%d): RetryAfter %v, x/time/rate %v", i, p.at, p.n, r.RetryAfter, wantWait)
							}
						}
						got = append(got, r)
					}
					sc.want(t, got)
					t.Logf("%s by %s: %s", sc.name, by, fmt.Sprint(got))
				})
			}
		}
	})
}
