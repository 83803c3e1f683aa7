package metrics

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
)

func TestMain(m *testing.M) { redistest.Main(m) }

// The hooks count decisions by outcome; the live gauges match Inspect; names and
// help pass Prometheus's linter.
func TestCountsAndGauges(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m := New()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		lim, err := throttle.New(b.Client, "vendor-api", throttle.PerMinute(2), throttle.WithKeyPrefix(b.Prefix), throttle.WithHooks(m.Hooks()))
		if err != nil {
			t.Fatal(err)
		}
		m.Watch(lim)
		for i := 0; i < 3; i++ {
			if _, err := lim.Allow(ctx); err != nil {
				t.Fatal(err)
			}
		}
		r, err := lim.Reserve(ctx, 2, 2*time.Minute) // booked a minute ahead
		if err != nil || !r.OK() {
			t.Fatal(r, err)
		}
		for _, c := range []struct {
			result, reason  string
			requests, perms float64
		}{{ResultAcquired, "", 3, 4}, {ResultLimited, "limit", 1, 1}, {ResultCanceled, "", 0, 0}} {
			if got := testutil.ToFloat64(m.requests.WithLabelValues("vendor-api", c.result, c.reason)); got != c.requests {
				t.Errorf("requests %s = %v, want %v", c.result, got, c.requests)
			}
			if got := testutil.ToFloat64(m.permits.WithLabelValues("vendor-api", c.result, c.reason)); got != c.perms {
				t.Errorf("permits %s = %v, want %v", c.result, got, c.perms)
			}
		}
		st, err := lim.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		want := fmt.Sprintf(`
# HELP jobthrottle_booked Permits booked to take effect later (the queue's depth).
# TYPE jobthrottle_booked gauge
jobthrottle_booked{key="vendor-api"} 2
# HELP jobthrottle_limit_capacity The limit's Rate (Burst for a token bucket), at scrape time.
# TYPE jobthrottle_limit_capacity gauge
jobthrottle_limit_capacity{key="vendor-api",limit="0"} 2
# HELP jobthrottle_limit_used Permits of the limit taken, bookings included, at scrape time.
# TYPE jobthrottle_limit_used gauge
jobthrottle_limit_used{key="vendor-api",limit="0"} %d
# HELP jobthrottle_remaining Permits a call could take now.
# TYPE jobthrottle_remaining gauge
jobthrottle_remaining{key="vendor-api"} 0
`, st.Limits[0].Used)
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jobthrottle_booked", "jobthrottle_limit_capacity",
			"jobthrottle_limit_used", "jobthrottle_remaining"); err != nil {
			t.Fatal(err)
		}
		if err := r.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(m.permits.WithLabelValues("vendor-api", ResultCanceled, "")); got != 2 {
			t.Errorf("permits canceled = %v, want 2", got)
		}
		if err := lim.Pause(ctx, time.Second); err != nil {
			t.Fatal(err)
		}
		if got := testutil.ToFloat64(m.pauses.WithLabelValues("vendor-api")); got != 1 {
			t.Errorf("pauses = %v, want 1", got)
		}
		problems, err := testutil.GatherAndLint(reg)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("lint: %s: %s", p.Metric, p.Text)
		}
	})
}

// Semaphores report their leases and waiters; a limiter and a semaphore on one key
// do not make a duplicate series (the pedantic registry would fail the scrape). The
// semaphore's hooks count leases acquired, denied and given up; unwatched, a limiter's
// and a semaphore's gauges are gone from the next scrape.
func TestSemaphoreGauges(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	m := New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	sem, err := throttle.NewSemaphore(b.Client, "reports", 3, throttle.WithKeyPrefix(b.Prefix), throttle.WithSemaphoreHooks(m.SemaphoreHooks()))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := throttle.New(b.Client, "reports", throttle.PerSecond(5), throttle.WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	m.WatchSemaphore(sem)
	m.Watch(lim, lim)
	l, _, err := sem.TryAcquire(ctx)
	if err != nil || l == nil {
		t.Fatal(l, err)
	}
	defer l.Release(ctx)
	want := `
# HELP jobthrottle_semaphore_leases Live leases of the semaphore (active leases).
# TYPE jobthrottle_semaphore_leases gauge
jobthrottle_semaphore_leases{key="reports"} 1
# HELP jobthrottle_semaphore_max The semaphore's Max.
# TYPE jobthrottle_semaphore_max gauge
jobthrottle_semaphore_max{key="reports"} 3
# HELP jobthrottle_semaphore_waiting Callers queued for a lease.
# TYPE jobthrottle_semaphore_waiting gauge
jobthrottle_semaphore_waiting{key="reports"} 0
# HELP jobthrottle_paused_seconds Time until a pause on the key ends.
# TYPE jobthrottle_paused_seconds gauge
jobthrottle_paused_seconds{key="reports"} 0
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jobthrottle_semaphore_leases",
		"jobthrottle_semaphore_max", "jobthrottle_semaphore_waiting", "jobthrottle_paused_seconds"); err != nil {
		t.Fatal(err)
	}
	// the other two leases, then a TryAcquire denied and an Acquire that gives up
	for range 2 {
		if l, _, err := sem.TryAcquire(ctx); err != nil || l == nil {
			t.Fatal(l, err)
		} else {
			defer l.Release(ctx)
		}
	}
	if l, _, err := sem.TryAcquire(ctx); err != nil || l != nil {
		t.Fatalf("a fourth lease of 3: %v %v, want none", l, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := sem.Acquire(short); err == nil {
		t.Fatal("Acquire of a full semaphore returned before its context ended")
	}
	if _, err := sem.Inspect(ctx); err != nil { // after the give-up, which goes in the background
		t.Fatal(err)
	}
	for _, c := range []struct {
		result, reason string
		want           float64
	}{{ResultAcquired, "", 3}, {ResultLimited, reasonLimit, 1}, {ResultCanceled, "", 1}} {
		if got := testutil.ToFloat64(m.requests.WithLabelValues("reports", c.result, c.reason)); got != c.want {
			t.Errorf("lease requests %s = %v, want %v", c.result, got, c.want)
		}
	}
	// unwatched, their gauges are gone from the next scrape
	m.UnwatchSemaphore(sem)
	m.Unwatch(lim)
	if n, err := testutil.GatherAndCount(reg, "jobthrottle_semaphore_leases", "jobthrottle_paused_seconds"); err != nil || n != 0 {
		t.Fatalf("gauges after Unwatch and UnwatchSemaphore: %d series, %v; want none", n, err)
	}
}

// Keys beyond MaxKeys share key="_other" in the counters and get no gauges; a key
// whose Inspect fails is counted and left out.
func TestCardinalityBound(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	m := New(WithMaxKeys(2))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	for i := 0; i < 5; i++ {
		lim, err := throttle.New(b.Client, fmt.Sprintf("tenant-%d", i), throttle.PerSecond(5), throttle.WithKeyPrefix(b.Prefix), throttle.WithHooks(m.Hooks()))
		if err != nil {
			t.Fatal(err)
		}
		m.Watch(lim)
		if _, err := lim.Allow(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues(OtherKey, ResultAcquired, "")); got != 3 {
		t.Errorf("_other acquired = %v, want 3", got)
	}
	if n := testutil.CollectAndCount(m, "jobthrottle_remaining"); n != 2 {
		t.Errorf("%d remaining gauges, want 2 (MaxKeys)", n)
	}
	// another algorithm on a key with state: its Inspect fails (*throttle.AlgorithmError)
	bad, _ := throttle.New(b.Client, "tenant-0", throttle.PerSecond(5), throttle.WithKeyPrefix(b.Prefix), throttle.WithAlgorithm(throttle.TokenBucket))
	m.Watch(bad)
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.inspectErrors.WithLabelValues("tenant-0")); got != 1 {
		t.Errorf("inspect errors = %v, want 1", got)
	}
}

func TestTransportHooks(t *testing.T) {
	m := New()
	th := m.TransportHooks()
	req := &http.Request{URL: &url.URL{Scheme: "https", Host: "api.vendor.example"}}
	th.Paused(req, 429, time.Second)
	th.NotSent(req, context.DeadlineExceeded)
	if got := testutil.ToFloat64(m.transportPauses.WithLabelValues("api.vendor.example", "429")); got != 1 {
		t.Errorf("transport pauses = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.notSent.WithLabelValues("api.vendor.example")); got != 1 {
		t.Errorf("not sent = %v, want 1", got)
	}
}

// BenchmarkScrape1000 is one scrape (Gather) of a collector watching 1,000 limiters
// on redis-server: 1,000 Inspect calls, 16 at a time.
func BenchmarkScrape1000(b *testing.B) {
	be := redistest.NewStandalone(b)
	ctx := context.Background()
	m := New(WithMaxKeys(2000))
	reg := prometheus.NewRegistry()
	reg.MustRegister(m)
	for i := 0; i < 1000; i++ {
		lim, err := throttle.New(be.Client, fmt.Sprintf("k%d", i), throttle.PerMinute(100), throttle.WithKeyPrefix(be.Prefix))
		if err != nil {
			b.Fatal(err)
		}
		if _, err := lim.AllowN(ctx, 1+i%50); err != nil {
			b.Fatal(err)
		}
		m.Watch(lim)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := reg.Gather(); err != nil {
			b.Fatal(err)
		}
	}
}

// A key that is not UTF-8 (a key may be any bytes) is counted and watched under a
// label made UTF-8, as Prometheus requires; it neither panics the limiter's call nor
// fails the scrape.
func TestKeyLabelIsUTF8(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	m := New()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	lim, err := throttle.New(b.Client, "vendor\xff", throttle.PerSecond(5), throttle.WithKeyPrefix(b.Prefix), throttle.WithHooks(m.Hooks()))
	if err != nil {
		t.Fatal(err)
	}
	m.Watch(lim)
	if _, err := lim.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.requests.WithLabelValues("vendor\uFFFD", ResultAcquired, "")); got != 1 {
		t.Errorf("requests = %v, want 1", got)
	}
	want := `
# HELP jobthrottle_remaining Permits a call could take now.
# TYPE jobthrottle_remaining gauge
jobthrottle_remaining{key="vendor` + "\uFFFD" + `"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "jobthrottle_remaining"); err != nil {
		t.Fatal(err)
	}
}

// WithInspectTimeout bounds a scrape's Inspect calls: a watched limiter whose Redis never
// answers (its calls may take a minute) costs the scrape the timeout, and is counted.
func TestInspectTimeoutBoundsAScrape(t *testing.T) {
	hung, err := redistest.NewHungServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hung.Close() })
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, ReadTimeout: -1, ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	lim, err := throttle.New(rdb, "hung", throttle.PerSecond(5), throttle.WithCallTimeout(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	m := New(WithInspectTimeout(100 * time.Millisecond))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(m)
	m.Watch(lim)
	start := time.Now()
	if _, err := reg.Gather(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 3*time.Second { // (the default is 5s)
		t.Fatalf("a scrape of a limiter on a hung Redis took %v, want about the inspect timeout (100ms)", d)
	}
	if got := testutil.ToFloat64(m.inspectErrors.WithLabelValues("hung")); got != 1 {
		t.Errorf("inspect errors = %v, want 1", got)
	}
}
