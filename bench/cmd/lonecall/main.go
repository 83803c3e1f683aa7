// Command lonecall measures a lone caller: one goroutine calling a Limiter's Allow
// back to back (a limit it never reaches), against a no-op EVALSHA and redis_rate's
// Allow on the same server, in alternating rounds, and prints the median over rounds
// of each round's p50 latency. It uses only the API jobthrottle has had since before
// coalescing (throttle.New, WithAlgorithm), so that bench/lonecall-compare.sh can build
// it against an earlier commit too and run the two in turns on one redis-server.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"slices"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:6379", "redis-server, host:port")
	alg := flag.String("alg", "TokenBucket", "SlidingWindow, TokenBucket, FixedWindow or SlidingCounter")
	client := flag.String("client", "default", "the go-redis client: default, cte (ContextTimeoutEnabled) or lean (that and MaxRetries -1)")
	n := flag.Int("n", 2000, "calls per case per round")
	rounds := flag.Int("rounds", 5, "rounds (after one warm-up round)")
	tag := flag.String("tag", "", "a name for this build, printed first")
	flag.Parse()

	algs := map[string]throttle.Algorithm{
		"SlidingWindow": throttle.SlidingWindow, "TokenBucket": throttle.TokenBucket,
		"FixedWindow": throttle.FixedWindow, "SlidingCounter": throttle.SlidingCounter,
	}
	a, ok := algs[*alg]
	if !ok {
		log.Fatalf("unknown algorithm %q", *alg)
	}
	o := &redis.Options{Addr: *addr}
	switch *client {
	case "default":
	case "cte":
		o.ContextTimeoutEnabled = true
	case "lean":
		o.ContextTimeoutEnabled, o.MaxRetries = true, -1
	default:
		log.Fatalf("unknown client %q", *client)
	}
	rdb := redis.NewClient(o)
	defer rdb.Close()
	ctx := context.Background()

	key := fmt.Sprintf("lonecall:%s:%d", *tag, time.Now().UnixNano())
	rate, period := 1_000_000_000, 100*time.Millisecond // never reached
	lim, err := throttle.New(rdb, key, throttle.Limit{Rate: rate, Period: period}, throttle.WithAlgorithm(a))
	if err != nil {
		log.Fatal(err)
	}
	noop := redis.NewScript("return 1")
	noopKeys := []string{"{" + key + ":noop}"}
	rl := redis_rate.NewLimiter(rdb)
	rlLimit := redis_rate.Limit{Rate: rate, Burst: rate, Period: period}

	cases := []func() error{
		func() error { _, err := lim.Allow(ctx); return err },
		func() error { return noop.Run(ctx, rdb, noopKeys).Err() },
		func() error { _, err := rl.Allow(ctx, key+":rr", rlLimit); return err },
	}
	p50 := func(f func() error) float64 {
		lat := make([]time.Duration, *n)
		for i := range lat {
			t0 := time.Now()
			if err := f(); err != nil {
				log.Fatal(err)
			}
			lat[i] = time.Since(t0)
		}
		slices.Sort(lat)
		return float64(lat[len(lat)/2]) / float64(time.Microsecond)
	}
	got := make([][]float64, len(cases))
	for r := -1; r < *rounds; r++ {
		for i, f := range cases {
			v := p50(f)
			if r >= 0 {
				got[i] = append(got[i], v)
			}
		}
	}
	med := make([]float64, len(cases))
	for i, v := range got {
		slices.Sort(v)
		med[i] = v[len(v)/2]
	}
	fmt.Printf("%s %s client=%s: p50 µs (median of %d rounds × %d calls): Allow %.0f, no-op EVALSHA %.0f, redis_rate %.0f; Allow ÷ no-op %.2f, ÷ redis_rate %.2f\n",
		*tag, *alg, *client, *rounds, *n, med[0], med[1], med[2], med[1]/med[0], med[2]/med[0])
}
