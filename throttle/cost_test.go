package throttle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// tokens is an LLM-like limiter's limits: 10 calls and 1000 tokens a second.
func tokensLimiter(tl *timeline, key string, alg Algorithm, opts ...Option) *Limiter {
	return tl.limiter(key, PerSecond(10), append([]Option{WithAlgorithm(alg),
		WithLimits(Limit{Rate: 1000, Period: time.Second, Unit: "tokens"})}, opts...)...)
}

// Two processes book estimates and settle actuals on one key: a refund frees room for
// the other process's next call at once, a debt holds it back; a second settle, or one
// made again, changes nothing; a settle after the booking has left every limit says so
// and changes nothing. Every algorithm, every backend, on the fake timeline.
func TestCostReserveAndSettle(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		a := tokensLimiter(tl, "settle", alg)
		other := ctlLimiterOn(tl, ctlOtherClient(t, b), "settle", PerSecond(10), WithAlgorithm(alg),
			WithLimits(Limit{Rate: 1000, Period: time.Second, Unit: "tokens"}))
		r, err := a.Cost(map[string]int{"tokens": 800}).Reserve(ctx, 1, 0)
		if err != nil || !r.OK() {
			t.Fatalf("800 tokens: %v %v", r, err)
		}
		if r, err := other.Cost(map[string]int{"tokens": 800}).Reserve(ctx, 1, 0); err != nil || r.OK() {
			t.Fatalf("800 more tokens in the other process: %v %v, want not OK", r, err)
		}
		tl.at(100 * ms)
		if err := r.Settle(ctx, map[string]int{"tokens": 150}); err != nil {
			t.Fatalf("the settle of 800 as 150: %v", err)
		}
		if err := r.Settle(ctx, map[string]int{"tokens": 10}); err != nil {
			t.Fatalf("a second settle: %v, want nil and nothing changed", err)
		}
		r2, err := other.Cost(map[string]int{"tokens": 800}).Reserve(ctx, 1, 0)
		if err != nil || !r2.OK() {
			t.Fatalf("800 tokens in the other process after the refund: %v %v", r2, err)
		}
		if r, err := other.Cost(map[string]int{"tokens": 200}).Reserve(ctx, 1, 0); err != nil || r.OK() {
			t.Fatalf("200 more: %v %v, want not OK (the second settle refunded nothing)", r, err)
		}
		// a debt: the other process's 800 were 1000
		if err := r2.Settle(ctx, map[string]int{"tokens": 1000}); err != nil {
			t.Fatal(err)
		}
		tl.at(1050 * ms) // the first 150 have left the window; the 1000 have not
		if r, err := a.Cost(map[string]int{"tokens": 200}).Reserve(ctx, 1, 0); err != nil || r.OK() && alg != TokenBucket && alg != FixedWindow {
			t.Fatalf("200 tokens behind a debt of 200: %v %v, want not OK", r, err)
		}
		// too late
		tl.at(5 * time.Second)
		r3, err := a.Cost(map[string]int{"tokens": 10}).Reserve(ctx, 1, 0)
		if err != nil || !r3.OK() {
			t.Fatal(r3, err)
		}
		tl.at(10 * time.Second)
		if err := r3.Settle(ctx, map[string]int{"tokens": 900}); !errors.Is(err, waiter.ErrSettleTooLate) {
			t.Fatalf("a settle 5s after a booking of a 1s limit: %v, want ErrSettleTooLate", err)
		}
		if st, err := a.Inspect(ctx); err != nil || st.Limits[1].Used != 0 {
			t.Fatalf("after the late settle: %+v %v, want no tokens used", st.Limits, err)
		}
	})
}

// A settle whose reply is lost (the connection drops after the script ran) fails with
// ErrUnavailable; made again, it finds its record and changes nothing: the difference
// is charged once.
func TestSettleLostReplyAppliesOnce(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		// the real clock: tokens a day, so that none comes back to the bucket while
		// the test runs, whatever the load (a minute's came back within 0.2s)
		l, err := New(rdb, "lost-settle-"+alg.String(), PerMinute(100), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix),
			WithLimits(Limit{Rate: 1000, Period: 24 * time.Hour, Unit: "tokens"}))
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.ScriptLoad(ctx, l.t.script.src).Err(); err != nil {
			t.Fatal(err)
		}
		r, err := l.Cost(map[string]int{"tokens": 500}).Reserve(ctx, 1, 0)
		if err != nil || !r.OK() {
			t.Fatal(r, err)
		}
		proxy.DropReplyTo("exec")
		if err := r.Settle(ctx, map[string]int{"tokens": 100}); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v: a settle with its reply lost: %v, want ErrUnavailable", alg, err)
		}
		if err := r.Settle(ctx, map[string]int{"tokens": 100}); err != nil {
			t.Fatalf("%v: the settle again: %v", alg, err)
		}
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Limits[1].Used != 100 {
			t.Fatalf("%v: %d tokens used after a settle of 500 as 100 made twice, want 100 (applied once)", alg, st.Limits[1].Used)
		}
	}
	redistest.Figure(t, "a settle whose reply was lost, made again: applied once for each of %d algorithms (%d replies dropped)",
		len(allAlgorithms), proxy.Dropped())
}

// A holder that never settles (it crashed) leaves its estimate charged, no more, and
// only until the limits' longest period has passed.
func TestUnsettledEstimateLapses(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tokensLimiter(tl, "crashed", alg)
		if r, err := l.Cost(map[string]int{"tokens": 700}).Reserve(ctx, 1, 0); err != nil || !r.OK() {
			t.Fatal(r, err)
		}
		if r, err := l.Cost(map[string]int{"tokens": 301}).Reserve(ctx, 1, 0); err != nil || r.OK() {
			t.Fatalf("301 tokens beside an unsettled 700: %v %v, want not OK", r, err)
		}
		if r, err := l.Cost(map[string]int{"tokens": 300}).Reserve(ctx, 1, 0); err != nil || !r.OK() {
			t.Fatalf("300 tokens beside an unsettled 700: %v %v, want OK", r, err)
		}
		tl.at(time.Second + 50*ms) // (the counter's sub-buckets are 20ms)
		if r, err := l.Cost(map[string]int{"tokens": 1000}).Reserve(ctx, 1, 0); err != nil || !r.OK() {
			t.Fatalf("the whole budget a period later: %v %v", r, err)
		}
	})
}

// WaitCost waits for its estimate and returns a reservation to settle; the limits of
// calls count the call as 1 and the plain calls (WaitN) take no tokens.
func TestWaitCost(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tokensLimiter(tl, "waitcost", alg)
		r, err := l.WaitCost(ctx, map[string]int{"tokens": 400})
		if err != nil || !r.OK() || r.Delay() != 0 {
			t.Fatalf("WaitCost: %v %v", r, err)
		}
		if err := l.WaitN(ctx, 3); err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(ctx, map[string]int{"tokens": 50}); err != nil {
			t.Fatal(err)
		}
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Limits[0].Used != 4 || st.Limits[1].Used != 50 || st.Limits[1].Limit.Unit != "tokens" {
			t.Fatalf("after WaitCost of 400 settled as 50 and WaitN(3): %+v, want 4 calls and 50 tokens", st.Limits)
		}
	})
}

// Bad costs get a typed error and call nothing.
func TestCostErrors(t *testing.T) {
	tl := newTimeline(t, redistest.NewMini(t))
	ctx := context.Background()
	l := tokensLimiter(tl, "costerrors", SlidingWindow)
	for _, c := range []struct {
		cost map[string]int
		want error
	}{
		{map[string]int{"words": 1}, ErrInvalidArgument},
		{map[string]int{"": 1}, ErrInvalidArgument},
		{map[string]int{"tokens": -1}, ErrInvalidArgument},
		{map[string]int{"tokens": 1001}, ErrExceedsLimit},
	} {
		if _, err := l.Cost(c.cost).Reserve(ctx, 1, 0); !errors.Is(err, c.want) {
			t.Errorf("Cost(%v).Reserve: %v, want %v", c.cost, err, c.want)
		}
		if _, err := l.WaitCost(ctx, c.cost); !errors.Is(err, c.want) {
			t.Errorf("WaitCost(%v): %v, want %v", c.cost, err, c.want)
		}
	}
	r, err := l.Cost(map[string]int{"tokens": 10}).Reserve(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(ctx, map[string]int{"words": 5}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a settle in words: %v", err)
	}
	if err := r.Settle(ctx, map[string]int{"tokens": -5}); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a settle of -5: %v", err)
	}
	plain, err := l.Reserve(ctx, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := plain.Settle(ctx, map[string]int{"tokens": 5}); !errors.Is(err, waiter.ErrNotReserved) {
		t.Errorf("a settle of a reservation of no costs: %v, want ErrNotReserved", err)
	}
	if _, err := New(tl.b.Client, "badunit", Limit{Rate: 1, Period: time.Second, Unit: "To kens"}); !errors.Is(err, ErrInvalidLimit) {
		t.Errorf("a limit of unit %q: %v", "To kens", err)
	}
}

// A settle's actual in a unit the booking estimated nothing of (not named, or 0) has no
// place to be charged at: the booking holds no entry in that unit's limits. It is
// ErrInvalidArgument on every algorithm, nothing charged (a log dropped such a debt
// silently, a bucket charged it), and the booking can still be settled in its units.
func TestSettleUnitNotEstimated(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tokensLimiter(tl, "unestimated", alg, WithLimits(Limit{Rate: 1000, Period: time.Second, Unit: "other"}))
		r, err := l.Cost(map[string]int{"other": 5, "tokens": 0}).Reserve(ctx, 1, 0)
		if err != nil || !r.OK() {
			t.Fatal(r, err)
		}
		if err := r.Settle(ctx, map[string]int{"tokens": 500, "other": 2}); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a settle of 500 tokens for a booking of none: %v, want ErrInvalidArgument", err)
		}
		if err := r.Settle(ctx, map[string]int{"tokens": 0, "other": 2}); err != nil {
			t.Fatalf("the settle in the units estimated: %v", err)
		}
		empty, err := l.WaitCost(ctx, map[string]int{})
		if err != nil {
			t.Fatal(err)
		}
		if err := empty.Settle(ctx, map[string]int{"tokens": 300}); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a settle of 300 tokens for WaitCost of no cost: %v, want ErrInvalidArgument", err)
		}
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Limits[1].Limit.Unit != "other" || st.Limits[1].Used != 2 || st.Limits[2].Used != 0 {
			t.Fatalf("after the settles: %+v, want 2 other and no tokens used", st.Limits)
		}
	})
}

// A tenant's caps may count a unit; its calls of large costs get fewer turns than
// another's of small ones, in proportion to the time their costs take the limits.
func TestTenantCostCaps(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tokensLimiter(tl, "tenant-costs", SlidingWindow, WithTenantLimits(Limit{Rate: 600, Period: time.Second, Unit: "tokens"}))
		a := l.Tenant("a")
		if r, err := a.Cost(map[string]int{"tokens": 600}).Reserve(ctx, 1, 0); err != nil || !r.OK() {
			t.Fatal(r, err)
		}
		tl.at(700 * ms) // its turn has come again
		r, err := a.Cost(map[string]int{"tokens": 100}).Reserve(ctx, 1, 0)
		if err != nil || r.OK() {
			t.Fatalf("100 more of a's tokens, its caps full: %v %v, want not OK", r, err)
		}
		if r, err := l.Tenant("b").Cost(map[string]int{"tokens": 400}).Reserve(ctx, 1, 0); err != nil || !r.OK() {
			t.Fatalf("b's 400 tokens beside a's 600: %v %v", r, err)
		}
		if _, err := a.Cost(map[string]int{"tokens": 601}).Reserve(ctx, 1, 0); !errors.Is(err, ErrExceedsLimit) {
			t.Fatalf("601 tokens of a tenant capped at 600: %v, want ErrExceedsLimit", err)
		}
		if _, err := l.Cost(map[string]int{"tokens": 601}).Tenant("a").Reserve(ctx, 1, 0); !errors.Is(err, ErrExceedsLimit) {
			t.Fatalf("Cost, then Tenant: 601 tokens of a tenant capped at 600: %v, want ErrExceedsLimit", err)
		}
	})
}

// While Redis is unreachable, FailLocal's share charges a call's costs too: each unit's
// limits are cut to the process's share and take the call's cost in that unit; a grant
// made so settles nothing (Redis never saw it).
func TestFailLocalCosts(t *testing.T) {
	ctx := context.Background()
	l, err := New(downClient(t), "local-costs", PerSecond(100), WithFailurePolicy(FailLocal(2)),
		WithLimits(Limit{Rate: 1000, Period: time.Second, Unit: "tokens"}))
	if err != nil {
		t.Fatal(err)
	}
	r, err := l.Cost(map[string]int{"tokens": 400}).Reserve(ctx, 1, 0)
	if err != nil || !r.OK() {
		t.Fatalf("400 of this process's 500 tokens: %v %v", r, err)
	}
	if r, err := l.Cost(map[string]int{"tokens": 101}).Reserve(ctx, 1, 0); err != nil || r.OK() {
		t.Fatalf("101 more of its 500: %v %v, want not OK", r, err)
	}
	if r, err := l.Cost(map[string]int{"tokens": 100}).Reserve(ctx, 1, 0); err != nil || !r.OK() {
		t.Fatalf("its last 100: %v %v", r, err)
	}
	if err := r.Settle(ctx, map[string]int{"tokens": 10}); err != nil {
		t.Fatalf("a settle of a local grant: %v, want nil (nothing to settle)", err)
	}
}
