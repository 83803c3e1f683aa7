package throttle

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// A tenant's request takes from the limiter's limits and the tenant's caps at once, or
// from neither; a denial says which denied it: the caps, the fair turn (a tenant's
// requests are paced at its share of the rate, a horizon's worth ahead at most), or the
// limiter's limits.
func TestTenantTakesFromLimitsAndCapsAtOnce(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("tenants", PerSecond(10), WithAlgorithm(alg), WithTenantLimits(PerSecond(2)))
		a, c, d := l.Tenant("a"), l.Tenant("c"), l.Tenant("d")
		for i := 0; i < 2; i++ {
			if r, err := a.Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("a's Allow %d: %+v %v, want granted", i, r, err)
			}
		}
		if r, err := a.Allow(ctx); err != nil || r.Allowed || !r.ByCap || r.Turn {
			t.Fatalf("a's 3rd Allow: %+v %v, want denied by its cap", r, err)
		}
		// the fair turn: 10/s is a permit per 100ms, and a tenant books 250ms ahead at most
		big := tl.limiter("paced", PerSecond(10), WithAlgorithm(alg))
		for i := 0; i < 3; i++ {
			if r, err := big.Tenant("e").Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("e's Allow %d: %+v %v, want granted", i, r, err)
			}
		}
		if r, err := big.Tenant("e").Allow(ctx); err != nil || r.Allowed || r.ByCap || !r.Turn || r.RetryAfter != 50*ms {
			t.Fatalf("e's 4th Allow: %+v %v, want its turn in 50ms", r, err)
		}
		if r, err := l.AllowN(ctx, 7); err != nil || !r.Allowed { // the limiter's own: 9 of 10
			t.Fatalf("AllowN(7): %+v %v", r, err)
		}
		if r, err := c.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("c's Allow: %+v %v, want granted (the limiter's 10th)", r, err)
		}
		r, err := d.Allow(ctx) // the limiter is full, d's cap is not
		if err != nil || r.Allowed || r.ByCap || r.Turn || r.RetryAfter <= 0 {
			t.Fatalf("d's Allow: %+v %v, want denied by the limiter's limit", r, err)
		}
		st, err := d.Inspect(ctx) // the denied request took nothing from d's cap
		if err != nil || st.Tenant == nil || len(st.Tenant.Caps) != 1 || st.Tenant.Caps[0].Used != 0 {
			t.Fatalf("d's Inspect: %+v %v, want none of its cap used", st.Tenant, err)
		}
		if st.Limits[0].Used != 10 {
			t.Fatalf("the limiter's use %d, want 10", st.Limits[0].Used)
		}
	})
}

// Bad names and weights are refused before any call, with typed errors; Tenant of a
// tenant's handle is the limiter's tenant of that name.
func TestTenantChecksItsNameAndWeight(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	l, err := New(b.Client, "names", PerSecond(5), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"", strings.Repeat("x", 257)} {
		if _, err := l.Tenant(name).Allow(ctx); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Tenant(%d bytes).Allow: %v, want ErrInvalidKey", len(name), err)
		}
		if err := l.Tenant(name).Wait(ctx); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Tenant(%d bytes).Wait: %v, want ErrInvalidKey", len(name), err)
		}
	}
	for _, w := range []float64{0, -1, 1e7, 1e-9} {
		if _, err := l.Tenant("a", Weight(w)).Allow(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Weight(%v): %v, want ErrInvalidArgument", w, err)
		}
	}
	for _, name := range []string{"a b", "t:x}:l", "\n", strings.Repeat("y", 256)} { // any bytes
		if r, err := l.Tenant(name).Allow(ctx); err != nil || !r.Allowed {
			t.Errorf("Tenant(%q).Allow: %+v %v, want granted", name, r, err)
		}
	}
	if got := l.Tenant("a").Tenant("b"); got.tenant.name != "b" || got.t != l.t {
		t.Errorf("Tenant of a tenant's handle: %+v", got.tenant)
	}
	if err := l.OverrideWeight(ctx, time.Minute, 2); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("OverrideWeight on the limiter's own handle: %v, want ErrInvalidArgument", err)
	}
}

// A bad tenant's handle refuses every call, the control calls on the limiter's key
// included: Pause, Resume, Override and ClearOverride return its error and change
// nothing, in Redis or in the process (a pause's hold).
func TestTenantBadHandleControlsNothing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		l, err := New(b.Client, "bad-handle", PerSecond(5), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range []struct {
			h    *Limiter
			want error
		}{{l.Tenant(""), ErrInvalidKey}, {l.Tenant(strings.Repeat("x", 257)), ErrInvalidKey},
			{l.Tenant("a", Weight(0)), ErrInvalidArgument}} {
			calls := map[string]error{
				"Pause":         c.h.Pause(ctx, time.Minute),
				"Override":      c.h.Override(ctx, time.Minute, PerSecond(1)),
				"Resume":        c.h.Resume(ctx),
				"ClearOverride": c.h.ClearOverride(ctx),
			}
			for name, err := range calls {
				if !errors.Is(err, c.want) {
					t.Errorf("%s of a bad handle (%v): %v, want %v", name, c.h.tenant.err, err, c.want)
				}
			}
		}
		st, err := l.Inspect(ctx)
		if err != nil || st.PausedFor != 0 || st.Override != 0 {
			t.Fatalf("after the bad handles' calls: %+v %v, want no pause nor override", st, err)
		}
		if err := l.Wait(ctx); err != nil { // no hold of this process's either
			t.Fatalf("the limiter's Wait: %v", err)
		}
	})
}

// tenantWaiter is a waiter of a tenant on the fake timeline: it asks when its time comes,
// keeping its ticket while its turn has not come, and asks again when its permit takes
// effect.
type tenantWaiter struct {
	l      *Limiter
	next   time.Time
	ticket int64
}

// runHolders steps the timeline every step from where it stands until d, each holder
// asking when its time comes, and returns the permits each tenant got that took effect
// within [from, d). (It never turns the servers' clocks back.)
func runHolders(t *testing.T, tl *timeline, hs []*tenantWaiter, from, d, step time.Duration) map[string]int {
	t.Helper()
	ctx := context.Background()
	got := map[string]int{}
	for at := tl.now.Sub(redistest.Epoch); at < d; at += step {
		tl.at(at)
		for _, h := range hs {
			if tl.now.Before(h.next) {
				continue
			}
			g, err := h.l.acquire(ctx, 1, time.Hour, nil, h.ticket, true)
			if err != nil {
				t.Fatal(err)
			}
			if g.granted {
				if token := time.UnixMicro(g.token); !token.Before(redistest.Epoch.Add(from)) && token.Before(redistest.Epoch.Add(d)) {
					got[h.l.tenant.name]++
				}
				h.next, h.ticket = time.UnixMicro(g.token), 0
			} else {
				h.next, h.ticket = tl.now.Add(g.wait), g.ticket
			}
		}
	}
	return got
}

// Two backlogged tenants of weights 3 and 1, each with waiters in two processes (a
// client each), share the limit 3:1. On the fake timeline, every algorithm, every
// backend.
func TestTenantWeightsShareTheLimit(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		var procs []*Limiter
		for p := 0; p < 2; p++ {
			procs = append(procs, tl.limiter("weights", PerSecond(40), WithAlgorithm(alg)))
		}
		var hs []*tenantWaiter
		for _, w := range []struct {
			name   string
			weight float64
		}{{"heavy", 3}, {"light", 1}} {
			for i := 0; i < 8; i++ {
				hs = append(hs, &tenantWaiter{l: procs[i%2].Tenant(w.name, Weight(w.weight))})
			}
		}
		got := runHolders(t, tl, hs, time.Second, 6*time.Second, 5*ms)
		ratio := float64(got["heavy"]) / float64(got["light"])
		redistest.Figure(t, "%v %s: weights 3 and 1 got %d and %d permits in 5s at 40/s: %.3f", alg, b.Kind, got["heavy"], got["light"], ratio)
		if ratio < 2.8 || ratio > 3.2 || got["heavy"]+got["light"] < 190 {
			t.Fatalf("heavy %d, light %d: ratio %.3f, want about 3 and the limit used", got["heavy"], got["light"], ratio)
		}
	})
}

// A tenant whose first request comes while another has a deep backlog is granted a
// permit within the tenants' horizon, not behind the backlog; the backlogged tenant
// books no further ahead than the horizon.
func TestTenantNewcomerIsNotBehindABacklog(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("newcomer", PerSecond(20), WithAlgorithm(alg))
		var hs []*tenantWaiter
		for i := 0; i < 64; i++ {
			hs = append(hs, &tenantWaiter{l: l.Tenant("noisy")})
		}
		runHolders(t, tl, hs, 0, 2*time.Second, 5*ms)
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		horizon := 250 * ms
		if st.BookedAhead > horizon {
			t.Fatalf("the noisy tenant booked %v ahead, beyond the horizon %v", st.BookedAhead, horizon)
		}
		g, err := l.Tenant("quiet").acquire(ctx, 1, time.Hour, nil, 0, true)
		if err != nil || !g.granted || g.wait > horizon+50*ms {
			t.Fatalf("the quiet tenant's first request: %+v %v, want granted within %v", g, err, horizon)
		}
	})
}

// Inspect on a tenant's handle gives its caps and its place; on the limiter's, the
// tenants with the most queued, most first.
func TestTenantInspect(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("inspect-tenants", PerSecond(10), WithTenantLimits(PerSecond(5)))
		var hs []*tenantWaiter
		for i, name := range []string{"a", "a", "a", "a", "a", "a", "b", "b"} {
			_ = i
			hs = append(hs, &tenantWaiter{l: l.Tenant(name, Weight(2))})
		}
		runHolders(t, tl, hs, 0, 100*ms, 5*ms)
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Tenants) != 2 || st.Tenants[0].Name != "a" || st.Tenants[1].Name != "b" ||
			st.Tenants[0].Weight != 2 || st.Tenants[0].Queued < st.Tenants[1].Queued || st.Tenants[1].Queued <= 0 {
			t.Fatalf("the limiter's Tenants: %+v, want a then b, queued", st.Tenants)
		}
		if st.QueuedWeight != 4 {
			t.Fatalf("QueuedWeight %v, want 4 (a and b, 2 each)", st.QueuedWeight)
		}
		ta, err := l.Tenant("a", Weight(2)).Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if ta.Tenant == nil || ta.Tenant.Name != "a" || ta.Tenant.Queued != st.Tenants[0].Queued ||
			len(ta.Tenant.Caps) != 1 || ta.Tenant.Caps[0].Capacity != 5 || ta.Tenant.Caps[0].Used < 1 {
			t.Fatalf("a's Inspect: %+v, want its place and its cap", ta.Tenant)
		}
		if len(ta.Tenants) != 0 {
			t.Fatalf("a tenant's Inspect lists tenants: %+v", ta.Tenants)
		}
	})
}

// An operator's weight for a tenant applies in every process until it ends or is
// cleared: a tenant whose callers say 1 gets the share of 3 meanwhile.
func TestOverrideWeight(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("override-weight", PerSecond(40))
		var hs []*tenantWaiter
		for i := 0; i < 8; i++ {
			hs = append(hs, &tenantWaiter{l: l.Tenant("x")}, &tenantWaiter{l: l.Tenant("y")})
		}
		if err := l.Tenant("x").OverrideWeight(ctx, time.Hour, 3); err != nil {
			t.Fatal(err)
		}
		got := runHolders(t, tl, hs, time.Second, 6*time.Second, 5*ms)
		if ratio := float64(got["x"]) / float64(got["y"]); ratio < 2.7 || ratio > 3.3 {
			t.Fatalf("with x's weight set to 3: x %d, y %d (%.2f), want about 3:1", got["x"], got["y"], ratio)
		}
		if err := l.Tenant("x").ClearWeight(ctx); err != nil {
			t.Fatal(err)
		}
		got = runHolders(t, tl, hs, 8*time.Second, 13*time.Second, 5*ms)
		if ratio := float64(got["x"]) / float64(got["y"]); ratio < 0.85 || ratio > 1.15 {
			t.Fatalf("after ClearWeight: x %d, y %d (%.2f), want about 1:1", got["x"], got["y"], ratio)
		}
	})
}

// A tenant's state (its caps, its place in the queue) goes with its TTL once idle:
// nothing is left behind.
func TestTenantStateExpires(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	tl := newTimeline(t, b)
	l := tl.limiter("expires", PerSecond(10), WithTenantLimits(PerSecond(2)))
	var hs []*tenantWaiter
	for i := 0; i < 20; i++ {
		hs = append(hs, &tenantWaiter{l: l.Tenant(fmt.Sprintf("t%d", i%5))})
	}
	runHolders(t, tl, hs, 0, time.Second, 5*ms)
	if n := keysUnder(t, b); n < 6 {
		t.Fatalf("%d keys while tenants are busy, want the limiter's, the queue and the tenants'", n)
	}
	if _, err := l.Inspect(ctx); err != nil {
		t.Fatal(err)
	}
	tl.at(time.Minute)
	if n := keysUnder(t, b); n != 0 {
		t.Fatalf("%d keys left a minute after the last request: %v", n, scanKeys(t, b))
	}
}

// Under FailLocal, each process keeps to its share of the limits and of every tenant's
// caps, at once.
func TestFailLocalKeepsTenantsCaps(t *testing.T) {
	ctx := context.Background()
	l, err := New(downClient(t), "local-caps", PerSecond(10), WithTenantLimits(PerSecond(4)),
		WithFailurePolicy(FailLocal(2)), WithCallTimeout(50*ms))
	if err != nil {
		t.Fatal(err)
	}
	granted, byCap := map[string]int{}, map[string]int{}
	for _, name := range []string{"a", "a", "a", "a", "b", "b", "b", "c", "c"} {
		if r, err := l.Tenant(name).Allow(ctx); err != nil {
			t.Fatal(err)
		} else if r.Allowed {
			granted[name]++
		} else if r.ByCap {
			byCap[name]++
		}
	}
	// shares: the limits 10/2 = 5, each tenant's caps 4/2 = 2
	if granted["a"] != 2 || granted["b"] != 2 || granted["c"] != 1 {
		t.Fatalf("granted %v, want a 2 and b 2 (their caps' share), c 1 (the limits' share of 5)", granted)
	}
	// a denial says what denied it, as Redis's does: a's and b's their caps, c's the limits
	if byCap["a"] != 2 || byCap["b"] != 1 || byCap["c"] != 0 {
		t.Fatalf("denials by cap %v, want a 2, b 1, c 0", byCap)
	}
}

// A cancel gives back no more than it booked, even when a booking made since lies
// before it: a tenant's booking its cap held later, and then another tenant's permit now
// (x/time/rate's CancelAt would give back the refill between them too, and the bucket
// would grant beyond its burst and refill).
func TestTenantCancelGivesBackNoMore(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		// the limiter 10/s (a token each 100ms), each tenant 4/s with a burst of 1
		l := tl.limiter("giveback", PerSecond(10), WithAlgorithm(TokenBucket), WithTenantLimits(Limit{Rate: 4, Period: time.Second, Burst: 1}))
		x, y := l.Tenant("x"), l.Tenant("y")
		if r, err := x.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("x's first: %+v %v", r, err)
		}
		held, err := x.acquire(ctx, 1, time.Second, nil, 0, false) // its cap has a token again at 250ms
		if err != nil || !held.granted || held.wait != 250*ms {
			t.Fatalf("x's second: %+v %v, want booked at 250ms", held, err)
		}
		if r, err := y.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("y's: %+v %v", r, err)
		}
		tl.at(20 * ms)
		if err := x.giveBack(ctx, 1, held); err != nil {
			t.Fatal(err)
		}
		// 10, less x's 1, its booking's 1 and the 1.5 of refill the burst cuts before 250ms,
		// y's 1; then 20ms of refill and the 1 given back: 6.7 tokens (given back from the
		// booking to now as well, 9)
		if r, err := l.AllowN(ctx, 7); err != nil || r.Allowed || r.Remaining != 6 {
			t.Fatalf("AllowN(7) after the cancel: %+v %v, want denied with 6 remaining", r, err)
		}
	})
}

// Tenants in three processes (a client each) ask at random times for random n, now or
// booking ahead, half of them with a cost in tokens, holding their place when their turn
// has not come, and now and then give a booking back or settle a cost for less, while an
// operator pauses, resumes and sets tenants' weights: no grant made while paused takes
// effect before the pause's end, and what takes effect never exceeds the limiter's limits,
// nor any tenant's caps, in calls or in tokens, in any window (the token bucket: its burst
// and what it refills in any span). Every algorithm, every backend, on the fake timeline.
func TestTenantsNeverExceedLimitsOrCaps(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		limits := []Limit{{Rate: 6, Period: 500 * ms, Burst: 4}, {Rate: 20, Period: 2 * time.Second},
			{Rate: 1000, Period: time.Second, Unit: "tokens"}}
		caps := []Limit{{Rate: 3, Period: 400 * ms, Burst: 2}, {Rate: 8, Period: 2 * time.Second},
			{Rate: 400, Period: time.Second, Unit: "tokens"}}
		opts := []Option{WithAlgorithm(alg), WithLimits(limits[1:]...), WithTenantLimits(caps...), WithBuckets(4)}
		procs := []*Limiter{tl.limiter("exact", limits[0], opts...)}
		for range 2 {
			procs = append(procs, ctlLimiterOn(tl, ctlOtherClient(t, b), "exact", limits[0], opts...))
		}
		// a grant: its tenant, when it takes effect, what it charges in each unit
		type charge struct {
			tenant string
			at     int64
			n      map[string]int
			settle func(context.Context, map[string]int) error
			cancel func() error
		}
		tenants := []string{"a", "b", "c", "d"}
		weights := map[string]float64{"a": 1, "b": 3, "c": 1, "d": 0.5}
		var grants, open []*charge    // open: a settle or a cancel may still come
		var pauseEnd int64            // while paused, µs
		tickets := map[string]int64{} // each tenant's place, held while its turn has not come
		steps := 300
		if b.Kind != redistest.Standalone {
			steps = 120
		}
		rng := rand.New(rand.NewSource(int64(alg)))
		var at time.Duration
		for i := 0; i < steps; i++ {
			at += time.Duration(rng.Intn(40_000)) * time.Microsecond
			tl.at(at)
			switch p := procs[rng.Intn(len(procs))]; rng.Intn(100) {
			case 0: // a pause: no grant made during it takes effect before its end
				d := time.Duration(50+rng.Intn(250)) * ms
				if err := p.Pause(ctx, d); err != nil {
					t.Fatal(err)
				}
				pauseEnd = max(pauseEnd, tl.now.Add(d).UnixMicro())
				continue
			case 1:
				if err := p.Resume(ctx); err != nil {
					t.Fatal(err)
				}
				pauseEnd = 0
				continue
			case 2: // an operator's weight for a tenant, for a while
				w := []float64{0.5, 2, 4}[rng.Intn(3)]
				if err := p.Tenant(tenants[rng.Intn(len(tenants))]).OverrideWeight(ctx, time.Duration(rng.Intn(500))*ms, w); err != nil {
					t.Fatal(err)
				}
				continue
			}
			if len(open) > 0 && rng.Intn(4) == 0 { // give a booking still ahead back, or settle
				j := rng.Intn(len(open))
				c := open[j]
				open = slices.Delete(open, j, j+1)
				switch {
				case c.at > tl.now.UnixMicro() && rng.Intn(2) == 0:
					if err := c.cancel(); err != nil {
						t.Fatal(err)
					}
					grants = slices.DeleteFunc(grants, func(g *charge) bool { return g == c })
				case c.n["tokens"] > 0:
					actual := rng.Intn(c.n["tokens"] + 1)
					switch err := c.settle(ctx, map[string]int{"tokens": actual}); {
					case err == nil:
						c.n["tokens"] = actual
					case !errors.Is(err, waiter.ErrSettleTooLate):
						t.Fatal(err)
					}
				}
				continue
			}
			name := tenants[rng.Intn(len(tenants))]
			l := procs[rng.Intn(len(procs))].Tenant(name, Weight(weights[name]))
			c := &charge{tenant: name, n: map[string]int{"": 1 + rng.Intn(2)}}
			if rng.Intn(2) == 0 {
				c.n["tokens"] = 10 + rng.Intn(300)
				l = l.Cost(map[string]int{"tokens": c.n["tokens"]})
			}
			maxWait := time.Duration(0)
			if rng.Intn(2) == 0 {
				maxWait = time.Duration(rng.Intn(600)) * ms
			}
			var ticket int64 // a waiter holds its place when its turn has not come, and comes back with it
			hold := rng.Intn(2) == 0
			if hold {
				ticket = tickets[name]
			}
			g, err := l.acquire(ctx, c.n[""], maxWait, nil, ticket, hold)
			if err != nil {
				t.Fatal(err)
			}
			if hold {
				tickets[name] = g.ticket
			}
			if g.granted && g.token < pauseEnd {
				t.Fatalf("a grant made while paused until %v takes effect at %v", time.UnixMicro(pauseEnd), time.UnixMicro(g.token))
			}
			if g.granted {
				c.at, c.settle = g.token, l.settler(c.n[""], g)
				c.cancel = func() error { return l.giveBack(ctx, c.n[""], g) }
				grants, open = append(grants, c), append(open, c)
			}
		}
		byTenant := map[string][]*charge{}
		for _, c := range grants {
			byTenant[c.tenant] = append(byTenant[c.tenant], c)
		}
		check := func(what string, cs []*charge, limits []Limit) {
			for _, lim := range limits {
				g := &redistest.Grants{}
				for _, c := range cs {
					g.Add(redistest.Grant{At: time.UnixMicro(c.at), N: c.n[lim.Unit]})
				}
				checkNeverExceeds(t, alg, what, g, lim)
			}
		}
		for name, cs := range byTenant {
			check("tenant "+name+"'s caps", cs, caps)
		}
		check("the limits", grants, limits)
		redistest.Figure(t, "%v %s: %d grants in %v to %d tenants", alg, b.Kind, len(grants), at, len(byTenant))
	})
}

// checkNeverExceeds fails t if the grants g take effect beyond lim: more than Rate in a
// window of Period (FixedWindow: in a window aligned on it, maxInAlignedWindow), or, for
// the token bucket, more than Burst and what Rate refills in the span between two grants.
// (Not MaxOverBucket's exact conformance: a booking's time is its fit rounded up to the
// µs, so a grant may have been due up to 1µs before its time.)
func checkNeverExceeds(t *testing.T, alg Algorithm, what string, g *redistest.Grants, lim Limit) {
	t.Helper()
	switch alg {
	case FixedWindow:
		if most := maxInAlignedWindow(g, lim.Period); most > lim.Rate {
			t.Fatalf("%v, %s: %d in one aligned window of %v", alg, what, most, lim)
		}
	case TokenBucket:
		gs, p, burst := g.List(), lim.periodMicros(), cmp.Or(lim.Burst, lim.Rate)
		for i := range gs {
			sum := 0
			for j := i; j < len(gs); j++ {
				sum += gs[j].N
				if refill := (gs[j].At.Sub(gs[i].At).Microseconds() + 1) * int64(lim.Rate) / p; int64(sum) > int64(burst)+refill {
					t.Fatalf("%v, %s: %d from %v to %v, above %v's burst and refill", alg, what, sum, gs[i].At, gs[j].At, lim)
				}
			}
		}
	default:
		if most := g.MaxInWindow(lim.Period); most > lim.Rate {
			t.Fatalf("%v, %s: %d in one window of %v", alg, what, most, lim)
		}
	}
}

// A tenant's request told to ask again later than its caller may wait takes no place in
// the fair share, and one that held a place gives it back: 200 calls with a short
// deadline (a client's requests with a timeout) leave the tenant, alone on an idle
// limiter a second later, its permit within the horizon, not 200 places (10s) behind
// them; and the places of a backlog of 100 whose holders come back with too short a
// wait are given back (else 5s of places stand ahead).
func TestTenantCallerThatCannotWaitTakesNoPlace(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("leak", PerSecond(20))
		acme := l.Tenant("acme")
		var tickets []int64
		for range 100 { // a backlog: some granted within the horizon, the rest places
			g, err := acme.acquire(ctx, 1, time.Hour, nil, 0, true)
			if err != nil {
				t.Fatal(err)
			}
			if g.ticket != 0 {
				tickets = append(tickets, g.ticket)
			}
		}
		if len(tickets) == 0 {
			t.Fatal("no places taken by a backlog of 100 at 20/s")
		}
		for i := range 200 { // a 10ms deadline each: denied, as WaitN is
			g, err := acme.acquire(ctx, 1, 10*ms, nil, 0, true)
			if err != nil || g.granted || g.ticket != 0 {
				t.Fatalf("ask %d: %+v %v, want denied with no place", i, g, err)
			}
		}
		for i, k := range tickets { // the holders come back, and cannot wait: they leave
			g, err := acme.acquire(ctx, 1, time.Microsecond, nil, k, true)
			if err != nil || g.granted || g.ticket != 0 {
				t.Fatalf("holder %d back with 1µs to wait: %+v %v, want denied, its place given back", i, g, err)
			}
		}
		tl.at(time.Second)
		g, err := acme.acquire(ctx, 1, time.Hour, nil, 0, true)
		if err != nil || !g.granted || g.wait > 250*ms {
			t.Fatalf("acme alone on an idle limiter 1s later: %+v %v, want granted within the horizon", g, err)
		}
	})
}

// A tenant's WaitN that leaves while it waits for its turn gives its place back: 100
// waiters of one tenant, cancelled once each has its booking or place, leave it, alone
// on an idle limiter a second later, its permit within the horizon, not behind their
// places (5s at 20/s).
func TestTenantWaitCancelledGivesItsPlaceBack(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		var asked atomic.Int32
		l := tl.limiter("left", PerSecond(20), WithHooks(Hooks{
			Allowed: func(string, int, time.Duration) { asked.Add(1) },
			Denied:  func(string, int, Result) { asked.Add(1) },
		}))
		acme := l.Tenant("acme")
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for range 100 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = acme.Wait(ctx)
			}()
		}
		for asked.Load() < 100 { // each has its booking or its place
			time.Sleep(time.Millisecond)
		}
		cancel()
		wg.Wait()
		tl.at(time.Second)
		g, err := acme.acquire(context.Background(), 1, time.Hour, nil, 0, true) // (after the give-backs: settle)
		if err != nil || !g.granted || g.wait > 250*ms {
			t.Fatalf("acme alone on an idle limiter 1s later: %+v %v, want granted within the horizon", g, err)
		}
	})
}

// An operator's weight counts for the requests its tenant has queued: two processes'
// waiters of tenants x and y share a limit equally; an operator (in the second process)
// cuts x's weight to 0.25, and once x's waiters ask again x holds one place in the fair
// share, at its new weight (W 1.25, not x counted under both weights: a cut that first
// raised x's share), and gets a fifth of the limit.
func TestOverrideWeightCountsAtOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		procs := []*Limiter{tl.limiter("cut-weight", PerSecond(40))}
		procs = append(procs, ctlLimiterOn(tl, ctlOtherClient(t, b), "cut-weight", PerSecond(40)))
		var hs []*tenantWaiter
		for i := 0; i < 8; i++ {
			p := procs[i%2]
			hs = append(hs, &tenantWaiter{l: p.Tenant("x")}, &tenantWaiter{l: p.Tenant("y")})
		}
		got := runHolders(t, tl, hs, time.Second, 3*time.Second, 5*ms)
		if ratio := float64(got["x"]) / float64(got["y"]); ratio < 0.9 || ratio > 1.1 {
			t.Fatalf("x and y of equal weights: x %d, y %d (%.2f), want about 1:1", got["x"], got["y"], ratio)
		}
		if err := procs[1].Tenant("x").OverrideWeight(ctx, time.Hour, 0.25); err != nil {
			t.Fatal(err)
		}
		runHolders(t, tl, hs, 0, 3*time.Second+100*ms, 5*ms) // (x's waiters ask again)
		st, err := procs[0].Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ws []string
		for _, ts := range st.Tenants {
			ws = append(ws, fmt.Sprintf("%s %g", ts.Name, ts.Weight))
		}
		if sort.Strings(ws); fmt.Sprint(ws) != "[x 0.25 y 1]" || st.QueuedWeight != 1.25 {
			t.Fatalf("the fair share after the cut: tenants %v, W %g; want x once at 0.25, y at 1, W 1.25", ws, st.QueuedWeight)
		}
		got = runHolders(t, tl, hs, 3*time.Second+500*ms, 5*time.Second+500*ms, 5*ms)
		if ratio := float64(got["x"]) / float64(got["y"]); ratio < 0.2 || ratio > 0.3 {
			t.Fatalf("after x's weight was cut to 0.25: x %d, y %d (%.2f), want about 1:4", got["x"], got["y"], ratio)
		}
	})
}
