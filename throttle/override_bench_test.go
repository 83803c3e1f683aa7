package throttle

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// BenchmarkAllowOverride is Allow on the sliding window (allowed path) with no control
// key (the usual case: the GET every acquire makes finds nothing) and with an override
// of its rate set (the same GET finds it and the script parses it): what enforcing an
// override costs the hot path.
func BenchmarkAllowOverride(b *testing.B) {
	be := benchBackend(b)
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
// override) costs the hot path when none is set, the usual case: the fast paths'
// EXISTS of the control key (sliding window, sliding counter) and the MGET that reads
// it with the state (token bucket, fixed window), against a copy of the same script
// that does not read it (a variant made for this measurement only: it would miss a
// pause). Each op is one EVALSHA of an allowed single-permit acquire, sent in
// pipelines of 100; server-µs/op is Redis's own execution time per call (INFO
// commandstats), free of the network and of the client. The machine is shared: run
// with -count to interleave the variants, and compare like with like.
//
//	go test -run '^$' -bench BenchmarkControlCheck -count 5 ./throttle/
func BenchmarkControlCheck(b *testing.B) {
	be := benchBackend(b)
	if !be.Real() {
		b.Skip("needs a real redis-server: miniredis's timings say nothing of Redis's")
	}
	rdb := be.Client.(*redis.Client)
	ctx := context.Background()
	variant := func(src, old, new string) string {
		if strings.Count(src, old) != 1 {
			b.Fatalf("the fast path no longer reads the control key with %q: update the benchmark", old)
		}
		return strings.Replace(src, old, new, 1)
	}
	sw := lua.SlidingWindow.Source()
	tb := lua.GCRA.Source()
	for _, c := range []struct {
		name   string
		src    string
		suffix string
		args   []any
	}{
		{"SlidingWindow/shipped", sw, "sw", []any{0, 1, 0, 1, 1_000_000_000, 1_000_000}},
		{"SlidingWindow/no-control-read", variant(sw, "redis.call('EXISTS', K[2]) == 0", "true"), "sw", []any{0, 1, 0, 1, 1_000_000_000, 1_000_000}},
		{"TokenBucket/shipped", tb, "tb", []any{0, 1, 0, 1, 1_000_000_000, 1_000_000, 1_000_000_000}},
		{"TokenBucket/no-control-read", variant(tb, "redis.call('MGET', jf_K[1], jf_K[2])", "{redis.call('GET', jf_K[1]), false}"), "tb", []any{0, 1, 0, 1, 1_000_000_000, 1_000_000, 1_000_000_000}},
	} {
		b.Run(c.name, func(b *testing.B) {
			s := redis.NewScript(c.src)
			if err := s.Load(ctx, rdb).Err(); err != nil {
				b.Fatal(err)
			}
			tag := "{" + be.Prefix + "ctlcost-" + strings.ReplaceAll(c.name, "/", "-") + "}"
			keys := algorithmKeys(tag, c.suffix)
			if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
				b.Fatal(err)
			}
			b.ResetTimer()
			for done := 0; done < b.N; {
				k := min(100, b.N-done)
				pipe := rdb.Pipeline()
				cmds := make([]*redis.Cmd, k)
				for i := range cmds {
					cmds[i] = s.EvalSha(ctx, pipe, keys, c.args...)
				}
				if _, err := pipe.Exec(ctx); err != nil {
					b.Fatal(err)
				}
				if v, err := cmds[0].Int64Slice(); err != nil || v[0] != 1 {
					b.Fatalf("not granted: %v %v", v, err)
				}
				done += k
			}
			b.StopTimer()
			calls, usec := evalshaStat(b, rdb)
			if calls < int64(b.N) {
				b.Fatalf("commandstats counted %d EVALSHA, sent %d", calls, b.N)
			}
			b.ReportMetric(float64(usec)/float64(calls), "server-µs/op")
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
