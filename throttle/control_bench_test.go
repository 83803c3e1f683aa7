package throttle

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// ctlBenchBackend is the real redis-server, or miniredis when there is none.
func ctlBenchBackend(b *testing.B) *redistest.Backend {
	b.Helper()
	if _, err := redistest.StandaloneAddr(); err != nil {
		b.Logf("no real redis-server (%v): benchmarking on miniredis, whose timings say little about Redis", err)
		return redistest.NewMiniRealTime(b)
	}
	return redistest.NewStandalone(b)
}

// BenchmarkAllowOverride is Allow on the sliding window (allowed path) with no control
// key (the usual case: the GET every acquire makes finds nothing) and with an override
// of its rate set (the same GET finds it and the script parses it): what enforcing an
// override costs the hot path.
func BenchmarkAllowOverride(b *testing.B) {
	be := ctlBenchBackend(b)
	ctx := context.Background()
	limit := Limit{Rate: 500_000_000, Period: time.Second}
	for _, c := range []struct {
		name     string
		override bool
	}{{"none", false}, {"set", true}} {
		b.Run(c.name, func(b *testing.B) {
			l, err := New(be.Client, "override-bench-"+c.name, limit, WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			if c.override {
				if err := l.Override(ctx, time.Hour, Limit{Rate: 1_000_000_000}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if r, err := l.Allow(ctx); err != nil || !r.Allowed {
					b.Fatal(r, err)
				}
			}
		})
	}
}
