package throttle

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// BenchmarkAllowCoalesced is Allow on the allowed path of one key from 1, 64 and 256
// goroutines, with coalescing on (the default): the path issue 11 measures. Besides
// ns/op (wall time, bound by Redis and the client together on a small machine) it
// reports the client's own CPU per call (user + system time of this process,
// redis-server not included), what coalescing costs the client:
//
//	go test -run '^$' -bench AllowCoalesced -benchmem ./throttle/
func BenchmarkAllowCoalesced(b *testing.B) {
	be := benchBackend(b)
	ctx := context.Background()
	for _, alg := range []Algorithm{TokenBucket, SlidingWindow} {
		for _, g := range []int{1, 64, 256} {
			b.Run(fmt.Sprintf("%v/%d", alg, g), func(b *testing.B) {
				l, err := New(be.Client, fmt.Sprintf("coalesced-%v-%d", alg, g), benchLimits[0].limit,
					WithAlgorithm(alg), WithKeyPrefix(be.Prefix))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := l.Allow(ctx); err != nil { // the script loaded
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
				cpu := cpuTime()
				b.ResetTimer()
				if g == 1 {
					for i := 0; i < b.N; i++ {
						if _, err := l.Allow(ctx); err != nil {
							b.Fatal(err)
						}
					}
				} else {
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							if _, err := l.Allow(ctx); err != nil {
								b.Error(err)
								return
							}
						}
					})
				}
				b.StopTimer()
				b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "client-cpu-ns/op")
			})
		}
	}
}

// cpuTime is the CPU time this process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSemaphoreCoalesced is TryAcquire and Release of a lease on one semaphore
// that always has room (max 10^6), from 1, 64 and 256 goroutines, with coalescing on:
// an op is the pair, two script calls. It reports the client's CPU per op as
// BenchmarkAllowCoalesced does:
//
//	go test -run '^$' -bench SemaphoreCoalesced -benchmem ./throttle/
func BenchmarkSemaphoreCoalesced(b *testing.B) {
	be := benchBackend(b)
	ctx := context.Background()
	for _, g := range []int{1, 64, 256} {
		b.Run(fmt.Sprint(g), func(b *testing.B) {
			s, err := NewSemaphore(be.Client, fmt.Sprintf("coalesced-sem-%d", g), 1000000, WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			op := func() error {
				l, _, err := s.TryAcquire(ctx)
				if err != nil {
					return err
				}
				if l == nil {
					return fmt.Errorf("denied with room for 10^6")
				}
				return l.Release(ctx)
			}
			if err := op(); err != nil { // the script loaded
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.SetParallelism(max(1, g/runtime.GOMAXPROCS(0)))
			cpu := cpuTime()
			b.ResetTimer()
			if g == 1 {
				for i := 0; i < b.N; i++ {
					if err := op(); err != nil {
						b.Fatal(err)
					}
				}
			} else {
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						if err := op(); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(float64(cpuTime()-cpu)/float64(b.N), "client-cpu-ns/op")
		})
	}
}
