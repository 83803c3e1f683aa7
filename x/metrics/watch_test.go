package metrics

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// tenantGauges scrapes reg and returns the watched key's queued weight and, by tenant,
// each tenant's queued seconds and weight.
func tenantGauges(t *testing.T, reg prometheus.Gatherer) (w float64, queued, weight map[string]float64) {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	queued, weight = map[string]float64{}, map[string]float64{}
	w = -1
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			switch v := m.GetGauge().GetValue(); mf.GetName() {
			case "jobthrottle_tenants_queued_weight":
				w = v
			case "jobthrottle_tenant_queued_seconds":
				queued[labels["tenant"]] = v
			case "jobthrottle_tenant_weight":
				weight[labels["tenant"]] = v
			}
		}
	}
	return w, queued, weight
}

// firstScrape is TestTenantGauges' first scrape on miniredis, whose clock stands still.
// Each tenant's one permit of a minute's slot puts its finish tag a minute / weight
// ahead: its place is that times the queued weight, 30. The 10 listed are those of
// weights 1 to 3 and, of the weight 4 ties, the name last in byte order.
const firstScrape = `
# HELP jobthrottle_tenant_queued_seconds How far the tenant's place in the fair share lies ahead of its turn, for the 10 tenants with the most queued and each watched tenant's handle.
# TYPE jobthrottle_tenant_queued_seconds gauge
jobthrottle_tenant_queued_seconds{key="fair",tenant="t00"} 1800
jobthrottle_tenant_queued_seconds{key="fair",tenant="t01"} 900
jobthrottle_tenant_queued_seconds{key="fair",tenant="t02"} 600
jobthrottle_tenant_queued_seconds{key="fair",tenant="t04"} 1800
jobthrottle_tenant_queued_seconds{key="fair",tenant="t05"} 900
jobthrottle_tenant_queued_seconds{key="fair",tenant="t06"} 600
jobthrottle_tenant_queued_seconds{key="fair",tenant="t08"} 1800
jobthrottle_tenant_queued_seconds{key="fair",tenant="t09"} 900
jobthrottle_tenant_queued_seconds{key="fair",tenant="t10"} 600
jobthrottle_tenant_queued_seconds{key="fair",tenant="t11"} 450
# HELP jobthrottle_tenant_weight The weight the tenant's requests were queued with, for the 10 tenants with the most queued and each watched tenant's handle.
# TYPE jobthrottle_tenant_weight gauge
jobthrottle_tenant_weight{key="fair",tenant="t00"} 1
jobthrottle_tenant_weight{key="fair",tenant="t01"} 2
jobthrottle_tenant_weight{key="fair",tenant="t02"} 3
jobthrottle_tenant_weight{key="fair",tenant="t04"} 1
jobthrottle_tenant_weight{key="fair",tenant="t05"} 2
jobthrottle_tenant_weight{key="fair",tenant="t06"} 3
jobthrottle_tenant_weight{key="fair",tenant="t08"} 1
jobthrottle_tenant_weight{key="fair",tenant="t09"} 2
jobthrottle_tenant_weight{key="fair",tenant="t10"} 3
jobthrottle_tenant_weight{key="fair",tenant="t11"} 4
# HELP jobthrottle_tenants_queued_weight The weights of all the tenants with requests queued in the fair share, summed.
# TYPE jobthrottle_tenants_queued_weight gauge
jobthrottle_tenants_queued_weight{key="fair"} 30
`

// The fair share's gauges of a watched limiter: the queued weight of every tenant, and
// the place and weight of the 10 with the most queued, by tenant, as Inspect reads them,
// whichever process queued them. A tenant pushed out of the 10 has no series at the next
// scrape; a name that is not UTF-8 is made one; the names and help pass Prometheus's
// linter. The limit is 60 an hour: a slot of a minute, so that the real servers' clocks
// move no tenant out of the queue while the test runs.
func TestTenantGauges(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m := New()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		rdb2, m2 := process(t, b)
		l1 := limiter(t, b, b.Client, m, "fair", throttle.PerHour(60))
		l2 := limiter(t, b, rdb2, m2, "fair", throttle.PerHour(60))
		m.Watch(l1)
		allow := func(l *throttle.Limiter) {
			t.Helper()
			if r, err := l.Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("Allow: %+v %v", r, err)
			}
		}
		for i := 0; i < 12; i++ { // weights 1, 2, 3, 4, ... from both processes: 30 in all
			allow([]*throttle.Limiter{l1, l2}[i%2].Tenant(fmt.Sprintf("t%02d", i), throttle.Weight(float64(i%4+1))))
		}
		// check scrapes between two Inspects: the same tenants and weights, the places
		// between the two (a place only comes closer as the clock moves)
		check := func(wantW float64) (listed []string) {
			t.Helper()
			before, err := l1.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			w, queued, weight := tenantGauges(t, reg)
			after, err := l1.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(before.Tenants) != 10 || before.QueuedWeight != wantW || after.QueuedWeight != wantW {
				t.Fatalf("Inspect: %d tenants, queued weight %v then %v; want 10 of weight %v", len(before.Tenants),
					before.QueuedWeight, after.QueuedWeight, wantW)
			}
			if w != wantW {
				t.Errorf("queued weight %v, want %v", w, wantW)
			}
			if len(queued) != 10 || len(weight) != 10 {
				t.Errorf("%d queued and %d weight series, want 10 each: %v %v", len(queued), len(weight), queued, weight)
			}
			for i, ts := range before.Tenants {
				name := labelValue(ts.Name)
				if after.Tenants[i].Name != ts.Name {
					t.Fatalf("Inspect listed %+v, then %+v", before.Tenants, after.Tenants)
				}
				q, ok := queued[name]
				if !ok || q > ts.Queued.Seconds() || q < after.Tenants[i].Queued.Seconds() || q <= 0 {
					t.Errorf("tenant %q queued %v (%v), want within %v..%v", name, q, ok, after.Tenants[i].Queued, ts.Queued)
				}
				if weight[name] != ts.Weight {
					t.Errorf("tenant %q weight %v, want %v", name, weight[name], ts.Weight)
				}
				listed = append(listed, name)
			}
			return listed
		}
		first := check(30)
		if b.Kind == redistest.Mini { // the clock stands still: the places, exactly
			if err := testutil.GatherAndCompare(reg, strings.NewReader(firstScrape), "jobthrottle_tenants_queued_weight",
				"jobthrottle_tenant_queued_seconds", "jobthrottle_tenant_weight"); err != nil {
				t.Fatal(err)
			}
		}
		// a newcomer of weight 0.1 is queued furthest ahead: the last of the 10 leaves
		// the list, and its series go
		allow(l2.Tenant("late\xff", throttle.Weight(0.1)))
		second := check(30.1)
		gone := first[len(first)-1]
		if second[0] != "late\uFFFD" || slices.Contains(second, gone) {
			t.Fatalf("tenants listed %q, then %q: want late first, %q gone", first, second, gone)
		}
		_, queued, weight := tenantGauges(t, reg)
		if _, ok := queued[gone]; ok {
			t.Errorf("%q, out of the 10, still has a queued series", gone)
		}
		if _, ok := weight[gone]; ok {
			t.Errorf("%q, out of the 10, still has a weight series", gone)
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

// gauges scrapes reg and returns each gauge's value by its name (without the
// jobthrottle_ prefix) and its labels' values, comma-separated in the order of their names.
func gauges(t *testing.T, reg prometheus.Gatherer) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	g := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if m.GetGauge() == nil {
				continue
			}
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetValue())
			}
			g[strings.TrimPrefix(mf.GetName(), "jobthrottle_")+"{"+strings.Join(labels, ",")+"}"] = m.GetGauge().GetValue()
		}
	}
	return g
}

// Tenants' handles watched beside their limiter's own each give their own part under
// their tenant label: a tenant whose cap is spent waits an hour for its next permit while
// another, and the key, have one now; each tenant's cap is its own. The key's next free
// permit is the limiter's, whichever handle Inspect reads first. The limit and cap are
// hours long, so that the real servers' clocks move nothing while the test runs.
func TestTenantHandleGauges(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		m := New()
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(m)
		lim := limiter(t, b, b.Client, m, "vendor", throttle.PerHour(6), throttle.WithTenantLimits(throttle.PerHour(1)))
		a, bb := lim.Tenant("a"), lim.Tenant("b", throttle.Weight(2))
		if r, err := a.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("Allow: %+v %v", r, err)
		}
		m.Watch(a, bb, lim)
		for scrape := 0; scrape < 5; scrape++ { // the handles' order differs from scrape to scrape
			g := gauges(t, reg)
			for series, want := range map[string]float64{
				"remaining{vendor}":                  5,
				"next_free_seconds{vendor}":          0,
				"tenant_next_free_seconds{vendor,b}": 0,
				"tenant_weight{vendor,b}":            2,
				"tenant_cap_capacity{vendor,0,a}":    1,
				"tenant_cap_used{vendor,0,a}":        1,
				"tenant_cap_capacity{vendor,0,b}":    1,
				"tenant_cap_used{vendor,0,b}":        0,
			} {
				if got, ok := g[series]; !ok || got != want {
					t.Errorf("scrape %d: %s = %v (%v), want %v", scrape, series, got, ok, want)
				}
			}
			if got := g["tenant_next_free_seconds{vendor,a}"]; got < 3000 || got > 3600 {
				t.Errorf("scrape %d: tenant a, its cap spent, has its next permit in %vs, want about an hour", scrape, got)
			}
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
