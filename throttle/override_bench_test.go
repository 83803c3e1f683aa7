package throttle

import (
	"context"
	"math"
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

// BenchmarkControlCheck measures what reading the control key (the pause and the
// override) costs every call when none is set, the usual case, against a copy of the
// same script that does not read it (a variant made for this measurement only: it
// would miss a pause). Each call is one EVALSHA of an allowed single-permit acquire,
// sent in pipelines of 100; the two scripts take turns in rounds of 500 calls each
// (the machine is shared and noisy: the rounds see the same load). Reported, from
// Redis's own execution time (INFO commandstats, free of the network and the client):
// the mean µs per call of each (shipped-µs, noread-µs), the same of each one's fastest
// round (the least disturbed), and the check's share of the shipped script's time
// (check-%, from the fastest rounds).
//
//	go test -run '^$' -bench BenchmarkControlCheck -benchtime 20000x -count 3 ./throttle/
func BenchmarkControlCheck(b *testing.B) {
	be := ctlBenchBackend(b)
	if !be.Real() {
		b.Skip("needs a real redis-server: miniredis's timings say nothing of Redis's")
	}
	rdb := be.Client.(*redis.Client)
	ctx := context.Background()
	const read = "call.pause, call.over = control_read(KEYS[2])"
	variant := func(src string) string {
		if strings.Count(src, read) != 1 {
			b.Fatalf("the driver no longer reads the control key with %q: update the benchmark", read)
		}
		return strings.Replace(src, read, "call.pause, call.over = 0, nil", 1)
	}
	for _, c := range []struct {
		name   string
		src    string
		suffix string
		args   []any // after the request: the limits, parameters, A and the record
	}{
		{"SlidingWindow", logScript.src, "sw", []any{1, 1_000_000_000, 1_000_000, 0, 0, "", 0}},
		{"TokenBucket", bucketScript.src, "tb", []any{1, 1_000_000_000, 1_000_000, 1_000_000_000, 0, "", 0}},
	} {
		b.Run(c.name, func(b *testing.B) {
			var sum, best [2]float64 // µs: shipped, noread
			var n [2]int64
			best = [2]float64{math.Inf(1), math.Inf(1)}
			scripts := [2]*redis.Script{redis.NewScript(c.src), redis.NewScript(variant(c.src))}
			var keys [2][]string
			for i, s := range scripts {
				if err := s.Load(ctx, rdb).Err(); err != nil {
					b.Fatal(err)
				}
				tag := "{" + be.Prefix + "ctlcost-" + c.name + strconv.Itoa(i) + "}"
				keys[i] = []string{tag + ":" + c.suffix, tag + ":pause", tag + ":conf"}
			}
			args := append([]any{1, opAcquire, 1, 0, 0, 0}, c.args...)
			const round = 500
			b.ResetTimer()
			for done, r := 0, 0; done < b.N; r++ {
				k := min(round, b.N-done)
				for j := 0; j < 2; j++ {
					i := (j + r) % 2 // alternate which goes first
					_, u0 := evalshaStat(b, rdb)
					for sent := 0; sent < k; sent += 100 {
						pipe := rdb.Pipeline()
						cmds := make([]*redis.Cmd, min(100, k-sent))
						for x := range cmds {
							cmds[x] = scripts[i].EvalSha(ctx, pipe, keys[i], args...)
						}
						if _, err := pipe.Exec(ctx); err != nil {
							b.Fatal(err)
						}
						if v, err := cmds[0].Int64Slice(); err != nil || v[0] != 1 {
							b.Fatalf("not granted: %v %v", v, err)
						}
					}
					_, u1 := evalshaStat(b, rdb)
					us := float64(u1 - u0)
					sum[i] += us
					n[i] += int64(k)
					if k == round {
						best[i] = min(best[i], us/float64(k))
					}
				}
				done += k
			}
			b.StopTimer()
			b.ReportMetric(sum[0]/float64(n[0]), "shipped-µs")
			b.ReportMetric(sum[1]/float64(n[1]), "noread-µs")
			if !math.IsInf(best[0], 1) {
				b.ReportMetric(best[0], "shipped-best-µs")
				b.ReportMetric(best[1], "noread-best-µs")
				b.ReportMetric(100*(best[0]-best[1])/best[0], "check-%")
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
