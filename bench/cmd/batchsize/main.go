// Command batchsize shows how coalescing shares round trips: G goroutines call Allow
// back to back on K limiters (a limit never reached) for a while, and the server's own
// counts (INFO commandstats and cpu) say how many requests each script call and each
// round trip (EXEC) carried, how long a script run took, and Redis's CPU per Allow and
// per round trip.
//
//	go run ./cmd/batchsize                                # starts its own redis-server
//	go run ./cmd/batchsize -goroutines 64,256 -keys 1,64 -algorithm TokenBucket
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/bench/internal/redisinfo"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "", "redis-server, host:port; empty starts one")
	gs := flag.String("goroutines", "64,256", "goroutine counts, comma-separated")
	ks := flag.String("keys", "1,64", "limiter counts the goroutines spread over, comma-separated")
	alg := flag.String("algorithm", "TokenBucket", "SlidingWindow, TokenBucket, FixedWindow or SlidingCounter")
	d := flag.Duration("duration", 3*time.Second, "how long each case runs")
	flag.Parse()
	log.SetFlags(0)
	a, ok := map[string]throttle.Algorithm{
		"SlidingWindow": throttle.SlidingWindow, "TokenBucket": throttle.TokenBucket,
		"FixedWindow": throttle.FixedWindow, "SlidingCounter": throttle.SlidingCounter,
	}[*alg]
	if !ok {
		log.Fatalf("unknown algorithm %q", *alg)
	}
	if *addr == "" {
		s, err := redistest.StartServer()
		if err != nil {
			log.Fatal(err)
		}
		defer redistest.StopAll()
		*addr = s.Addr
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr})
	defer rdb.Close()
	fmt.Printf("%s Allow, %v per case, redis-server on %s\n\n", *alg, *d, *addr)
	fmt.Println("| goroutines | keys | Allow/s | requests per script call | requests per round trip | exec µs per script run | Redis CPU µs per Allow | Redis CPU µs per round trip |")
	fmt.Println("|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, g := range ints(*gs) {
		for _, k := range ints(*ks) {
			if err := run(rdb, a, g, k, *d); err != nil {
				log.Fatal(err)
			}
		}
	}
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			log.Fatalf("not a positive count: %q", f)
		}
		out = append(out, n)
	}
	return out
}

// snap is what the server has counted so far.
type snap struct {
	evals, evalUsec, execs int64
	cpu                    float64 // main thread, seconds
}

func read(ctx context.Context, rdb *redis.Client) (snap, error) {
	m, err := redisinfo.Read(ctx, rdb, "commandstats", "cpu")
	if err != nil {
		return snap{}, err
	}
	var s snap
	s.evals, s.evalUsec = redisinfo.CmdStat(m["cmdstat_evalsha"])
	s.execs, _ = redisinfo.CmdStat(m["cmdstat_exec"])
	for _, k := range []string{"used_cpu_user_main_thread", "used_cpu_sys_main_thread"} {
		f, _ := strconv.ParseFloat(m[k], 64)
		s.cpu += f
	}
	return s, nil
}

func run(rdb *redis.Client, a throttle.Algorithm, g, k int, d time.Duration) error {
	ctx := context.Background()
	lims := make([]*throttle.Limiter, k)
	for i := range lims {
		key := fmt.Sprintf("batchsize:%d:%d:%d", time.Now().UnixNano(), g, i)
		l, err := throttle.New(rdb, key, throttle.Limit{Rate: 1_000_000_000, Period: 100 * time.Millisecond}, throttle.WithAlgorithm(a))
		if err != nil {
			return err
		}
		lims[i] = l
	}
	s0, err := read(ctx, rdb)
	if err != nil {
		return err
	}
	var calls atomic.Int64
	var stop atomic.Bool
	var failed atomic.Pointer[error]
	var wg sync.WaitGroup
	start := time.Now()
	for i := range g {
		wg.Add(1)
		go func(l *throttle.Limiter) {
			defer wg.Done()
			for !stop.Load() {
				if _, err := l.Allow(ctx); err != nil {
					failed.CompareAndSwap(nil, &err)
					return
				}
				calls.Add(1)
			}
		}(lims[i%k])
	}
	time.Sleep(d)
	stop.Store(true)
	wg.Wait()
	el := time.Since(start)
	if e := failed.Load(); e != nil {
		return *e
	}
	s1, err := read(ctx, rdb)
	if err != nil {
		return err
	}
	n := float64(calls.Load())
	evals, execs := float64(s1.evals-s0.evals), float64(s1.execs-s0.execs)
	cpu := (s1.cpu - s0.cpu) * 1e6
	fmt.Printf("| %d | %d | %.0f | %.1f | %.1f | %.1f | %.2f | %.0f |\n", g, k, n/el.Seconds(), n/evals, n/execs,
		float64(s1.evalUsec-s0.evalUsec)/evals, cpu/n, cpu/execs)
	return nil
}
