package throttle

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The hot paths against a real redis-server (started by redistest, or REDIS_ADDR), so
// that regressions in the scripts or the call path show with
//
//	go test -run '^$' -bench . -benchmem ./throttle/
//
// Each op of one goroutine is one round trip; compare with BenchmarkNoopScript, the same
// round trip running `return 1`. bench/ compares throughput with the peers.

// benchBackend returns a real redis-server, or miniredis (saying so) when there is none.
func benchBackend(b *testing.B) *redistest.Backend {
	b.Helper()
	if _, err := redistest.StandaloneAddr(); err != nil {
		b.Logf("no real redis-server (%v): benchmarking on miniredis, whose timings say little about Redis", err)
		return redistest.NewMiniRealTime(b)
	}
	return redistest.NewStandalone(b)
}

// benchLimits: a limit the benchmark never reaches (every call allowed) and one it
// always exceeds (almost every call denied).
var benchLimits = []struct {
	path  string
	limit Limit
}{
	{"allowed", Limit{Rate: 1_000_000_000, Period: time.Second}},
	{"denied", Limit{Rate: 100, Period: time.Second}},
}

// BenchmarkNoopScript is the floor: EVALSHA of "return 1" with a limiter's keys and
// the arguments of one Allow (those of a sliding window's script call), alone and in
// MULTI/EXEC, as a lone call of the limiters runs.
func BenchmarkNoopScript(b *testing.B) {
	be := benchBackend(b)
	ctx := context.Background()
	noop := redis.NewScript("return 1")
	l, err := New(be.Client, "noop", PerSecond(100), WithKeyPrefix(be.Prefix))
	if err != nil {
		b.Fatal(err)
	}
	keys := l.t.keys
	args := []any{l.t.head, l.t.caps, "a 1 0"}
	if err := noop.Load(ctx, be.Client).Err(); err != nil {
		b.Fatal(err)
	}
	b.Run("EVALSHA", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			if err := noop.EvalSha(ctx, be.Client, keys, args...).Err(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("MULTI-EVALSHA-EXEC", func(b *testing.B) {
		b.ReportAllocs()
		for i := 0; i < b.N; i++ {
			pipe := be.Client.TxPipeline()
			cmd := noop.EvalSha(ctx, pipe, keys, args...)
			if _, err := pipe.Exec(ctx); err != nil || cmd.Err() != nil {
				b.Fatal(err, cmd.Err())
			}
		}
	})
}

// BenchmarkAllow is Allow on every algorithm, on the allowed and the denied path.
func BenchmarkAllow(b *testing.B) {
	be := benchBackend(b)
	benchAllow(b, be.Client, be.Prefix, "allow-")
}

// benchAllow runs Allow on rdb on every algorithm, on the allowed and the denied
// path, each on a key of its own named from name.
func benchAllow(b *testing.B, rdb redis.UniversalClient, prefix, name string) {
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		for _, bl := range benchLimits {
			b.Run(alg.String()+"/"+bl.path, func(b *testing.B) {
				l, err := New(rdb, name+bl.path+"-"+alg.String(), bl.limit, WithAlgorithm(alg), WithKeyPrefix(prefix))
				if err != nil {
					b.Fatal(err)
				}
				granted := 0
				b.ReportAllocs()
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					res, err := l.Allow(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if res.Allowed {
						granted++
					}
				}
				b.StopTimer()
				if bl.path == "allowed" && granted != b.N {
					b.Fatalf("%d of %d allowed on the allowed path", granted, b.N)
				}
				b.ReportMetric(float64(granted)/float64(b.N), "granted/op")
			})
		}
	}
}

// BenchmarkAllowParallel is the allowed path from many goroutines on one key.
func BenchmarkAllowParallel(b *testing.B) {
	be := benchBackend(b)
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		b.Run(alg.String(), func(b *testing.B) {
			l, err := New(be.Client, "parallel-"+alg.String(), benchLimits[0].limit, WithAlgorithm(alg), WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := l.Allow(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkReserve books one permit a period ahead and gives it back: the path of a
// waiter (Reserve) and of one that gives up (Cancel), two script calls per op.
func BenchmarkReserve(b *testing.B) {
	be := benchBackend(b)
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		b.Run(alg.String(), func(b *testing.B) {
			l, err := New(be.Client, "reserve-"+alg.String(), Limit{Rate: 1, Period: time.Hour}, WithAlgorithm(alg), WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			if _, err := l.Allow(ctx); err != nil { // the one permit of the hour is taken
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r, err := l.Reserve(ctx, 1, 2*time.Hour)
				if err != nil {
					b.Fatal(err)
				}
				if !r.OK() || r.Delay() <= 0 {
					b.Fatalf("reservation OK %v, delay %v: want one booked ahead", r.OK(), r.Delay())
				}
				if err := r.Cancel(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkNew is the cost of building a Limiter, as ThrottleFunc's pick may per task:
// "reused" on a key a Limiter still alive uses, "fresh" on a new key each time (no
// Redis call either way; New finds the process's client of the Redis client, and a
// key's state is made at its first call, not by New).
func BenchmarkNew(b *testing.B) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	keep, err := New(rdb, "bench-new", PerSecond(10), WithFailurePolicy(FailLocal(4)))
	if err != nil {
		b.Fatal(err)
	}
	b.Run("reused", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := New(rdb, "bench-new", PerSecond(10), WithFailurePolicy(FailLocal(4))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("fresh", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			if _, err := New(rdb, "bench-new-"+itoa(i), PerSecond(10)); err != nil {
				b.Fatal(err)
			}
		}
	})
	_ = keep.Key()
}

// BenchmarkReserveDuringPause is Reserve's latency while another goroutine of the
// process pauses the key (1ms pauses, one begun every pauseEvery Reserves), as an
// HTTP transport does on each 429: "idle" with no other booking on the key (every
// Reserve granted outside the pauses), "booked" with 8 tasks' bookings hours ahead that
// nobody waits on, as asynqmw's handed-back tasks are (every Reserve denied: the limit
// is 1 an hour). It reports the median, the 99th percentile and the longest Reserve in
// µs.
func BenchmarkReserveDuringPause(b *testing.B) {
	const pauseEvery = 20
	be := benchBackend(b)
	ctx := context.Background()
	for _, booked := range []int{0, 8} {
		name := "idle"
		if booked > 0 {
			name = "booked"
		}
		b.Run(name, func(b *testing.B) {
			limit := Limit{Rate: 1_000_000_000, Period: time.Second}
			if booked > 0 { // the bookings lie ahead, and every Reserve below is denied
				limit = Limit{Rate: 1, Period: time.Hour}
			}
			l, err := New(be.Client, "pausebench-"+name, limit, WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < booked; i++ {
				task := booking.With(ctx, &booking.Task{ID: "held-" + itoa(i)})
				if r, err := l.Reserve(task, 1, 24*time.Hour); err != nil || !r.OK() {
					b.Fatalf("booking %d: OK %v, %v", i, r != nil && r.OK(), err)
				}
			}
			kick := make(chan struct{}, 1) // a pause to make
			done := make(chan struct{})
			go func() {
				defer close(done)
				for range kick {
					if err := l.Pause(ctx, time.Millisecond); err != nil {
						b.Error(err)
					}
				}
			}()
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if i%pauseEvery == 0 {
					select {
					case kick <- struct{}{}:
					default: // the last pause is still being made
					}
				}
				start := time.Now()
				if _, err := l.Reserve(ctx, 1, 0); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			close(kick)
			<-done
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), "max-µs")
		})
	}
}
