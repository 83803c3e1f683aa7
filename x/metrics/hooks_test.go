package metrics

import (
	"context"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

// process stands for another process of the fleet: a client of its own on b's server,
// closed with the test, and a Collector of its own.
func process(t *testing.T, b *redistest.Backend) (redis.UniversalClient, *Collector) {
	t.Helper()
	c := redistest.Dial(b.Addrs())
	t.Cleanup(func() { c.Close() })
	return c, New()
}

// limiter makes a limiter on rdb under b's test prefix, counted by m's hooks.
func limiter(t *testing.T, b *redistest.Backend, rdb redis.UniversalClient, m *Collector, key string, limit throttle.Limit, opts ...throttle.Option) *throttle.Limiter {
	t.Helper()
	opts = append([]throttle.Option{throttle.WithKeyPrefix(b.Prefix), throttle.WithHooks(m.Hooks())}, opts...)
	l, err := throttle.New(rdb, key, limit, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// A denial is counted by what denied it: a tenant's cap, its fair turn, or the
// limiter's limits; each process counts its own calls. The limits are hours long, so
// that the real servers' clocks move nothing while the test runs.
func TestDenialReasons(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m1 := New()
		rdb2, m2 := process(t, b)
		// 6 an hour: a slot of 10 minutes, and a tenant books 20 minutes ahead at most
		opts := []throttle.Option{throttle.WithTenantLimits(throttle.PerHour(2))}
		l1 := limiter(t, b, b.Client, m1, "vendor", throttle.PerHour(6), opts...)
		l2 := limiter(t, b, rdb2, m2, "vendor", throttle.PerHour(6), opts...)
		allow := func(l *throttle.Limiter, n int, want throttle.Result) {
			t.Helper()
			r, err := l.AllowN(ctx, n)
			if err != nil || r.Allowed != want.Allowed || r.ByCap != want.ByCap || r.Turn != want.Turn {
				t.Fatalf("AllowN(%d): %+v %v, want %+v", n, r, err, want)
			}
		}
		granted, byCap, turn, byLimit := throttle.Result{Allowed: true}, throttle.Result{ByCap: true}, throttle.Result{Turn: true}, throttle.Result{}
		a := l1.Tenant("a")
		allow(a, 1, granted)
		allow(a, 1, granted)
		allow(a, 1, byCap) // its 2 an hour taken
		// b, of weight 1/4, is queued 40 minutes ahead by its first permit, beyond the
		// 20 minutes' worth a tenant may book
		b2 := l2.Tenant("b", throttle.Weight(0.25))
		allow(b2, 1, granted)
		allow(b2, 1, turn)
		allow(l1, 4, byLimit) // 3 of 6 taken
		allow(l2, 3, granted)
		allow(l2.Tenant("c"), 1, byLimit)

		for _, c := range []struct {
			m              *Collector
			result, reason string
			requests, n    float64
		}{
			{m1, ResultAcquired, "", 2, 2}, {m1, ResultLimited, "cap", 1, 1}, {m1, ResultLimited, "limit", 1, 4},
			{m1, ResultLimited, "turn", 0, 0},
			{m2, ResultAcquired, "", 2, 4}, {m2, ResultLimited, "turn", 1, 1}, {m2, ResultLimited, "limit", 1, 1},
			{m2, ResultLimited, "cap", 0, 0},
		} {
			p := map[*Collector]int{m1: 1, m2: 2}[c.m]
			if got := testutil.ToFloat64(c.m.requests.WithLabelValues("vendor", c.result, c.reason)); got != c.requests {
				t.Errorf("process %d: requests %s %q = %v, want %v", p, c.result, c.reason, got, c.requests)
			}
			if got := testutil.ToFloat64(c.m.permits.WithLabelValues("vendor", c.result, c.reason)); got != c.n {
				t.Errorf("process %d: permits %s %q = %v, want %v", p, c.result, c.reason, got, c.n)
			}
		}
	})
}

// Two deployments with other limits on one key: each process's counter moves once for
// each new set of limits it finds, however often the two take turns on the key, and
// not when a new deployment agrees with it.
func TestLimitsDriftCounted(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m1 := New()
		rdb2, m2 := process(t, b)
		l1 := limiter(t, b, b.Client, m1, "vendor", throttle.PerMinute(1000))
		l2 := limiter(t, b, rdb2, m2, "vendor", throttle.PerMinute(2000))
		turns := func(ls ...*throttle.Limiter) {
			t.Helper()
			for i := 0; i < 3; i++ {
				for _, l := range ls {
					if r, err := l.Allow(ctx); err != nil || !r.Allowed {
						t.Fatalf("Allow: %+v %v", r, err)
					}
				}
			}
		}
		want := func(m *Collector, n float64) {
			t.Helper()
			if got := testutil.ToFloat64(m.drift.WithLabelValues("vendor")); got != n {
				t.Errorf("drift = %v, want %v", got, n)
			}
		}
		turns(l1)
		want(m1, 0) // alone on the key
		turns(l2, l1)
		want(m1, 1)
		want(m2, 1)
		// a third deployment, 3000 a minute: the first process sees a new set once
		rdb3, m3 := process(t, b)
		l3 := limiter(t, b, rdb3, m3, "vendor", throttle.PerMinute(3000))
		turns(l3, l1)
		want(m1, 2)
		want(m3, 1)
		// a fourth that agrees with the first: nothing new for either
		rdb4, m4 := process(t, b)
		l4 := limiter(t, b, rdb4, m4, "vendor", throttle.PerMinute(1000))
		turns(l4, l1)
		want(m1, 2)
		want(m4, 0)
	})
}
