// Command jtbench measures jobthrottle against the physical limit of one Redis key and
// against its peers (go-redis/redis_rate and a Redisson-style permit log), in one run:
// Allow throughput as a ratio to a no-op EVALSHA measured in the same round, blocking
// acquire loops under contention, memory per key and permit, and script execution time
// on a big log. It prints markdown tables and how the figures compare with the goals.
//
//	go run ./cmd/jtbench                       # starts its own redis-server
//	go run ./cmd/jtbench -addr 127.0.0.1:6379  # uses a running one (keys "jtbench:")
//	go run ./cmd/jtbench -quick                # under a minute
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/bench/redisson"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

func main() {
	var (
		addr       = flag.String("addr", "", "redis-server to use, host:port; empty starts one on a free 127.0.0.1 port")
		sections   = flag.String("sections", "throughput,contention,memory,big", "what to measure, comma-separated")
		quick      = flag.Bool("quick", false, "short settings, under a minute: -rounds 3 -slice 100ms -workers 64 -duration 2.5s -big-entries 5000")
		rounds     = flag.Int("rounds", 7, "throughput: rounds (after one warm-up round)")
		slice      = flag.Duration("slice", 300*time.Millisecond, "throughput: time per case per round")
		goroutines = flag.String("goroutines", "1,8,64", "throughput: goroutine counts")
		workers    = flag.String("workers", "8,64", "contention: worker counts W")
		rate       = flag.Int("rate", 200, "contention: the shared limit R, permits per second")
		duration   = flag.Duration("duration", 10*time.Second, "contention: how long each case runs")
		memRates   = flag.String("mem-rates", "100,1000,10000", "memory: rates, permits per second")
		bigEntries = flag.Int("big-entries", 10000, "big keys: live entries in the log")
		pool       = flag.Int("pool", 0, "go-redis PoolSize; 0 keeps go-redis's default (10 per GOMAXPROCS)")
		out        = flag.String("out", "", "also write the markdown report to this file")
		only       = flag.String("cases", "", "throughput: only the cases whose names contain one of these comma-separated texts (and the no-op yardsticks)")
	)
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		for name, v := range map[string]string{"rounds": "3", "slice": "100ms", "workers": "64", "duration": "2500ms", "big-entries": "5000"} {
			if !set[name] {
				_ = flag.Set(name, v)
			}
		}
	}
	log.SetFlags(log.Ltime)
	if err := run(*addr, *sections, *rounds, *slice, ints(*goroutines), ints(*workers), *rate, *duration, ints(*memRates), *bigEntries, *pool, *out, *only); err != nil {
		log.Fatal(err)
	}
}

func ints(s string) []int {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			log.Fatalf("%q: not a list of positive integers", s)
		}
		out = append(out, n)
	}
	return out
}

func run(addr, sections string, rounds int, slice time.Duration, gs, ws []int, rate int, duration time.Duration, memRates []int, bigEntries, pool int, out, only string) error {
	ctx := context.Background()
	if addr == "" {
		s, err := redistest.StartServer()
		if err != nil {
			return fmt.Errorf("no -addr and redis-server could not be started: %w", err)
		}
		defer redistest.StopAll()
		addr = s.Addr
		log.Printf("started redis-server on %s", addr)
	}
	// generous timeouts: on a shared, loaded machine a stall should show as latency in
	// the tables, not end the run
	opts := &redis.Options{Addr: addr, PoolSize: pool, DialTimeout: 30 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second}
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("redis at %s: %w", addr, err)
	}
	mine := []string{"{" + keyPrefix + "*", "rate:" + keyPrefix + "*"}
	if err := deleteKeys(ctx, rdb, mine...); err != nil {
		return err
	}
	defer deleteKeys(ctx, rdb, mine...)
	if err := loadScripts(ctx, rdb); err != nil {
		return err
	}

	rep := &report{
		command: "go run ./cmd/jtbench " + strings.Join(os.Args[1:], " "),
		machine: describeMachine(ctx, rdb),
		gs:      gs,
	}
	var parts []string
	want := map[string]bool{}
	for _, s := range strings.Split(sections, ",") {
		want[strings.TrimSpace(s)] = true
	}
	if want["throughput"] {
		parts = append(parts, fmt.Sprintf("throughput %d rounds × %v per case at %v goroutines", rounds, slice, gs))
	}
	if want["contention"] {
		parts = append(parts, fmt.Sprintf("contention W = %v, R = %d/s, %v each", ws, rate, duration))
	}
	if want["memory"] {
		parts = append(parts, fmt.Sprintf("memory at %v permits/s", memRates))
	}
	if want["big"] {
		parts = append(parts, fmt.Sprintf("big log of %d entries", bigEntries))
	}
	rep.settings = strings.Join(parts, "; ")
	log.Printf("machine: %s", rep.machine)

	if want["throughput"] {
		cases, err := throughputCases(ctx, rdb)
		if err != nil {
			return err
		}
		if only != "" {
			cases = slices.DeleteFunc(cases, func(c tcase) bool {
				for _, t := range strings.Split(only, ",") {
					if c.path == "" || strings.Contains(c.name, strings.TrimSpace(t)) {
						return false
					}
				}
				return true
			})
		}
		rep.cases = cases
		rep.tp, err = runThroughput(ctx, rdb, cases, gs, rounds, slice, log.Printf)
		if err != nil {
			return err
		}
	}
	if want["contention"] {
		for _, w := range ws {
			for _, c := range contentionCases() {
				r, err := runContention(ctx, opts, c, w, rate, duration)
				if err != nil {
					return fmt.Errorf("contention %s W=%d: %w", c.name, w, err)
				}
				log.Printf("contention W=%d %s: %d permits, utilization %s, %.2f calls/permit", w, c.name, r.granted, pct(r.util), r.callsPerPermit)
				rep.cont = append(rep.cont, r)
			}
		}
	}
	if want["memory"] {
		for _, r := range memRates {
			subs, err := memSubjects(ctx, rdb, r)
			if err != nil {
				return err
			}
			for _, s := range subs {
				m, err := measureMemory(ctx, rdb, s, r)
				if err != nil {
					return err
				}
				log.Printf("memory %d/s %s: %d B for %d permits", r, s.name, m.total, m.granted)
				rep.mem = append(rep.mem, m)
			}
		}
	}
	if want["big"] {
		big, err := runBigKeys(ctx, rdb, bigEntries)
		if err != nil {
			return fmt.Errorf("big keys: %w", err)
		}
		rep.big = big
	}

	w := io.Writer(os.Stdout)
	if out != "" {
		f, err := os.Create(out)
		if err != nil {
			return err
		}
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	rep.write(w)
	return nil
}

// loadScripts loads every script the benchmark runs, so that no measured call is an
// EVALSHA answered NOSCRIPT and sent again as EVAL.
func loadScripts(ctx context.Context, rdb *redis.Client) error {
	for _, s := range []*redis.Script{noopScript, redisson.Script, lua.Script("log"), lua.Script("bucket"), lua.Script("window")} {
		if err := s.Load(ctx, rdb).Err(); err != nil {
			return err
		}
	}
	// redis_rate's script is not exported: one call loads it
	_, err := redis_rate.NewLimiter(rdb).Allow(ctx, keyPrefix+"warm", redis_rate.PerSecond(1))
	return err
}
