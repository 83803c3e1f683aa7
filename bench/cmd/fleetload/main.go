// Command fleetload measures a fleet on one hot key: P processes × G goroutines
// calling Allow on one limiter (a limit never reached) for D; it reports the permits
// per second of the whole fleet and the Redis server's CPU (main thread, INFO cpu) per
// permit, and the same for a no-op EVALSHA fleet. (The rows with coalescing off went
// with WithCoalescing: every call of a process now shares its round trips.)
//
//	go run ./cmd/fleetload                          # starts its own redis-server
//	go run ./cmd/fleetload -procs 8 -goroutines 64 -duration 5s
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"os/exec"
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
	procs := flag.Int("procs", 8, "processes")
	gs := flag.Int("goroutines", 64, "goroutines per process")
	d := flag.Duration("duration", 5*time.Second, "how long each case runs")
	child := flag.String("child", "", "internal: run one process of the case named")
	flag.Parse()
	log.SetFlags(0)
	if *child != "" {
		runChild(*addr, *child, *gs, *d)
		return
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
	fmt.Printf("%d processes × %d goroutines on one key, %v per case, redis-server on %s\n\n", *procs, *gs, *d, *addr)
	fmt.Println("| case | permits/s (all processes) | Redis CPU µs per permit | permits per Redis CPU s |")
	fmt.Println("|---|---:|---:|---:|")
	for _, c := range []string{"noop", "TokenBucket", "SlidingWindow"} {
		permits, cpu := runCase(rdb, *addr, c, *procs, *gs, *d)
		name := map[string]string{
			"noop": "no-op EVALSHA", "TokenBucket": "jobthrottle TokenBucket Allow, coalesced",
			"SlidingWindow": "jobthrottle SlidingWindow Allow, coalesced",
		}[c]
		fmt.Printf("| %s | %.0f | %.2f | %.0f |\n", name, float64(permits)/d.Seconds(), cpu*1e6/float64(permits), float64(permits)/cpu)
	}
}

// runCase starts the processes, lets them go at once, and returns the permits they
// got and the Redis CPU seconds the case took.
func runCase(rdb *redis.Client, addr, c string, procs, gs int, d time.Duration) (int64, float64) {
	ctx := context.Background()
	var kids []*exec.Cmd
	var outs []*bufio.Reader
	var ins []interface{ Write([]byte) (int, error) }
	for range procs {
		cmd := exec.Command(os.Args[0], "-child", c, "-addr", addr, "-goroutines", strconv.Itoa(gs), "-duration", d.String())
		in, _ := cmd.StdinPipe()
		out, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			log.Fatal(err)
		}
		r := bufio.NewReader(out)
		if line, err := r.ReadString('\n'); err != nil || strings.TrimSpace(line) != "READY" {
			log.Fatalf("child: %q %v", line, err)
		}
		kids, outs, ins = append(kids, cmd), append(outs, r), append(ins, in)
	}
	cpu0 := cpuSeconds(ctx, rdb)
	for _, in := range ins {
		_, _ = in.Write([]byte("go\n"))
	}
	var total int64
	for i, r := range outs {
		line, err := r.ReadString('\n')
		if err != nil {
			log.Fatalf("child %d: %v", i, err)
		}
		n, _ := strconv.ParseInt(strings.TrimSpace(line), 10, 64)
		total += n
	}
	cpu1 := cpuSeconds(ctx, rdb)
	for _, k := range kids {
		_ = k.Wait()
	}
	return total, cpu1 - cpu0
}

func cpuSeconds(ctx context.Context, rdb *redis.Client) float64 {
	m, err := redisinfo.Read(ctx, rdb, "cpu")
	if err != nil {
		log.Fatal(err)
	}
	var s float64
	for _, k := range []string{"used_cpu_user_main_thread", "used_cpu_sys_main_thread"} {
		f, _ := strconv.ParseFloat(m[k], 64)
		s += f
	}
	return s
}

// runChild runs one process of case c: READY, wait for a line, run, print the permits.
func runChild(addr, c string, gs int, d time.Duration) {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	var allow func() bool
	if c == "noop" {
		s := redis.NewScript("return 1")
		keys := []string{"{jtbench:fleet}:noop"}
		allow = func() bool { return s.Run(ctx, rdb, keys).Err() == nil }
	} else {
		alg := throttle.SlidingWindow
		if c == "TokenBucket" {
			alg = throttle.TokenBucket
		}
		l, err := throttle.New(rdb, "fleet-"+c, throttle.Limit{Rate: 1_000_000_000, Period: 100 * time.Millisecond},
			throttle.WithAlgorithm(alg), throttle.WithKeyPrefix("jtbench:"))
		if err != nil {
			log.Fatal(err)
		}
		allow = func() bool { r, err := l.Allow(ctx); return err == nil && r.Allowed }
	}
	allow() // loads the script
	fmt.Println("READY")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		log.Fatal(err)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for range gs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				if allow() {
					n.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	fmt.Println(n.Load())
}
