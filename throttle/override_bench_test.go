package throttle

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
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

// evalshaStat reads INFO commandstats' calls and usec of EVALSHA.
func evalshaStat(b *testing.B, rdb *redis.Client) (calls, usec int64) {
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		v, ok := strings.CutPrefix(line, "cmdstat_evalsha:")
		if !ok {
			continue
		}
		for _, f := range strings.Split(v, ",") {
			k, n, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				calls, _ = strconv.ParseInt(n, 10, 64)
			case "usec":
				usec, _ = strconv.ParseInt(n, 10, 64)
			}
		}
	}
	return calls, usec
}
