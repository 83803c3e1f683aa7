package throttle

import (
	"context"
	"fmt"
	"runtime"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// The send path's cost. Besides ns/op (wall time, bound by Redis and the client
// together on a small machine) each reports the client's own CPU per call (user +
// system time of this process, redis-server's not included):
//
//	go test -run '^$' -bench 'Send' -benchmem ./throttle/

// sendCPU is the CPU time this process has used, user and system.
func sendCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// sendBench runs op b.N times from g goroutines (one: a plain loop) and reports the
// client's CPU per op.
func sendBench(b *testing.B, g int, op func(i int) error) {
	b.ReportAllocs()
	cpu := sendCPU()
	b.ResetTimer()
	if g == 1 {
		for i := 0; i < b.N; i++ {
			if err := op(i); err != nil {
				b.Fatal(err)
			}
		}
	} else {
		b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
		var next atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(next.Add(1))
			for pb.Next() {
				if err := op(i); err != nil {
					b.Error(err)
					return
				}
				i++
			}
		})
	}
	b.StopTimer()
	b.ReportMetric(float64(sendCPU()-cpu)/float64(b.N), "client-cpu-ns/op")
}

// BenchmarkSendAllowParallel is Allow on the allowed path against a real
// redis-server, from 1, 64 and 256 goroutines, on one key and spread over 64 keys.
func BenchmarkSendAllowParallel(b *testing.B) {
	be := redistest.NewStandalone(b)
	ctx := context.Background()
	for _, alg := range []Algorithm{SlidingWindow, TokenBucket} {
		for _, keys := range []int{1, 64} {
			for _, g := range []int{1, 64, 256} {
				b.Run(fmt.Sprintf("%v/keys=%d/goroutines=%d", alg, keys, g), func(b *testing.B) {
					lims := make([]*Limiter, keys)
					for k := range lims {
						l, err := New(be.Client, fmt.Sprintf("bench-%v-%d-%d-%d", alg, keys, g, k), PerSecond(1_000_000_000),
							WithAlgorithm(alg), WithKeyPrefix(be.Prefix))
						if err != nil {
							b.Fatal(err)
						}
						if _, err := l.Allow(ctx); err != nil { // the script loaded, the record written
							b.Fatal(err)
						}
						lims[k] = l
					}
					sendBench(b, g, func(i int) error {
						_, err := lims[i%keys].Allow(ctx)
						return err
					})
				})
			}
		}
	}
}

// BenchmarkSendSemaphoreParallel is TryAcquire and Release of a lease on one
// semaphore that always has room (max 10^6), from 1, 64 and 256 goroutines: an op is
// the pair, two requests.
func BenchmarkSendSemaphoreParallel(b *testing.B) {
	be := redistest.NewStandalone(b)
	ctx := context.Background()
	for _, g := range []int{1, 64, 256} {
		b.Run(fmt.Sprintf("goroutines=%d", g), func(b *testing.B) {
			s, err := NewSemaphore(be.Client, fmt.Sprintf("bench-sem-%d", g), 1_000_000, WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			op := func(int) error {
				l, _, err := s.TryAcquire(ctx)
				if err != nil {
					return err
				}
				if l == nil {
					return fmt.Errorf("denied with room for 10^6, want a lease")
				}
				return l.Release(ctx)
			}
			if err := op(0); err != nil { // the script loaded
				b.Fatal(err)
			}
			sendBench(b, g, op)
		})
	}
}

// BenchmarkSendAllowDeadline is a lone Allow with a context that never ends and with
// one that has a deadline: the one send path serves both alike.
func BenchmarkSendAllowDeadline(b *testing.B) {
	be := redistest.NewStandalone(b)
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			l, err := New(be.Client, "bench-deadline-"+c.name, PerSecond(1_000_000_000), WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := c.ctx()
			defer cancel()
			if _, err := l.Allow(ctx); err != nil {
				b.Fatal(err)
			}
			sendBench(b, 1, func(int) error {
				_, err := l.Allow(ctx)
				return err
			})
		})
	}
}
