// Command tenants measures the fair share of a limiter's tenants (throttle.Limiter.Tenant)
// against the goals of its design: fleets of waiters (Wait in loops) on one limiter, a
// go-redis client per simulated process, every grant recorded by the server time it takes
// effect (redistest.RecordGrants). Each case prints its figures as a table row:
//
//	quiet     a noisy tenant's 128 waiters in 4 processes and 3 quiet tenants asking now
//	          and then, group 20/s: the quiet tenants' waits
//	weights   two backlogged tenants of weights 3 and 1, 2 processes each, 100/s: their ratio
//	jain      8 tenants of weight 1 with 2 to 32 waiters, 100/s: Jain's fairness index
//	lone      one tenant's 64 waiters, 100/s: the share of the rate it uses
//	caps      group 20/s, each tenant capped at 8/s: two backlogged tenants, then three
//	calls     64 waiters on a key without tenants, then 8 tenants of 8: script calls per permit
//	memory    10,000 tenants with a request each: Redis memory per tenant, keys left after
//
// and, for every case, the most grants in any window of the period, of the group and of
// each tenant (its cap), which must never be above the limit.
//
//	go run ./cmd/tenants                      # starts its own redis-server
//	go run ./cmd/tenants -cases quiet,weights -duration 20s -algorithm TokenBucket
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/bench/internal/redisinfo"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

var (
	addr     = flag.String("addr", "", "redis-server, host:port; empty starts one")
	cases    = flag.String("cases", "quiet,weights,jain,lone,caps,calls,memory", "the cases to run, comma-separated")
	duration = flag.Duration("duration", 15*time.Second, "how long each case measures, after its warm-up")
	warm     = flag.Duration("warmup", 3*time.Second, "how long each case runs before it measures")
	alg      = flag.String("algorithm", "SlidingWindow", "SlidingWindow, TokenBucket, FixedWindow or SlidingCounter")
)

var algorithm throttle.Algorithm

func main() {
	flag.Parse()
	log.SetFlags(0)
	a, ok := map[string]throttle.Algorithm{
		"SlidingWindow": throttle.SlidingWindow, "TokenBucket": throttle.TokenBucket,
		"FixedWindow": throttle.FixedWindow, "SlidingCounter": throttle.SlidingCounter,
	}[*alg]
	if !ok {
		log.Fatalf("unknown algorithm %q", *alg)
	}
	algorithm = a
	if *addr == "" {
		s, err := redistest.StartServer()
		if err != nil {
			log.Fatal(err)
		}
		defer redistest.StopAll()
		*addr = s.Addr
	}
	fmt.Printf("%s, %v measured after %v of warm-up, redis-server on %s\n\n", *alg, *duration, *warm, *addr)
	fmt.Println("| case | figure | value | goal | group: most in any period / limit | tenants: most in any period / cap |")
	fmt.Println("|---|---|---:|---:|---:|---:|")
	for _, c := range strings.Split(*cases, ",") {
		f, ok := map[string]func(){"quiet": quiet, "weights": weights, "jain": jain, "lone": lone, "caps": caps,
			"calls": calls, "memory": memory}[c]
		if !ok {
			log.Fatalf("unknown case %q", c)
		}
		f()
	}
}

// fleet is a limiter's processes: a client each, and what they granted.
type fleet struct {
	name    string
	limit   throttle.Limit
	caps    []throttle.Limit
	clients []*redis.Client
	grants  []*redistest.Grants
	lims    []*throttle.Limiter
	start   time.Time // when the measurement starts (after the warm-up)
}

func newFleet(name string, procs int, limit throttle.Limit, caps ...throttle.Limit) *fleet {
	f := &fleet{name: fmt.Sprintf("%s-%d", name, time.Now().UnixNano()), limit: limit, caps: caps}
	for range procs {
		c := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: 64})
		f.clients = append(f.clients, c)
		f.grants = append(f.grants, redistest.RecordGrants(c))
		opts := []throttle.Option{throttle.WithAlgorithm(algorithm)}
		if len(caps) > 0 {
			opts = append(opts, throttle.WithTenantLimits(caps...))
		}
		l, err := throttle.New(c, f.name, limit, opts...)
		if err != nil {
			log.Fatal(err)
		}
		f.lims = append(f.lims, l)
	}
	return f
}

func (f *fleet) close() {
	for _, c := range f.clients {
		c.Close()
	}
}

// waiters runs n goroutines on process p's handle of tenant (its weight w; "" is the
// limiter itself), each calling Wait back to back until ctx ends.
func (f *fleet) waiters(ctx context.Context, wg *sync.WaitGroup, p int, tenant string, w float64, n int) {
	l := f.lims[p]
	if tenant != "" {
		l = l.Tenant(tenant, throttle.Weight(w))
	}
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if err := l.Wait(ctx); err != nil && ctx.Err() == nil {
					log.Printf("%s: Wait: %v", tenant, err)
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	}
}

// run starts the fleet's goroutines (start), lets them warm up, measures for the
// duration, stops them and returns the grants that took effect while it measured.
func (f *fleet) run(start func(ctx context.Context, wg *sync.WaitGroup)) []redistest.Grant {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	start(ctx, &wg)
	time.Sleep(*warm)
	f.start = time.Now()
	time.Sleep(*duration)
	end := time.Now()
	cancel()
	wg.Wait()
	var out []redistest.Grant
	for _, g := range f.grants {
		for _, gr := range g.List() {
			if !gr.At.Before(f.start) && gr.At.Before(end) {
				out = append(out, gr)
			}
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].At.Before(out[j].At) })
	return out
}

// windows returns the most grants in any window of the group's period and of each
// tenant's (the first cap's period, else the limit's), as "most / limit" texts.
func (f *fleet) windows(gs []redistest.Grant) (group, tenants string) {
	var all []time.Time
	by := map[string][]time.Time{}
	for _, g := range gs {
		for range g.N {
			all = append(all, g.At)
			by[g.Tenant] = append(by[g.Tenant], g.At)
		}
	}
	group = fmt.Sprintf("%d / %d", redistest.MaxTimesInWindow(all, f.limit.Period), f.limit.Rate)
	if len(f.caps) == 0 {
		return group, "–"
	}
	most := 0
	for _, ts := range by {
		most = max(most, redistest.MaxTimesInWindow(ts, f.caps[0].Period))
	}
	return group, fmt.Sprintf("%d / %d", most, f.caps[0].Rate)
}

func counts(gs []redistest.Grant) map[string]int {
	out := map[string]int{}
	for _, g := range gs {
		out[g.Tenant] += g.N
	}
	return out
}

func row(c, figure, value, goal, group, tenants string) {
	fmt.Printf("| %s | %s | %s | %s | %s | %s |\n", c, figure, value, goal, group, tenants)
}

// quiet: the noisy tenant's 128 waiters in 4 processes keep the group busy; 3 quiet
// tenants, each in a process of its own, ask for a permit every 0.3 to 1s and time it.
func quiet() {
	f := newFleet("quiet", 7, throttle.PerSecond(20))
	defer f.close()
	var mu sync.Mutex
	var waits []time.Duration
	gs := f.run(func(ctx context.Context, wg *sync.WaitGroup) {
		for p := range 4 {
			f.waiters(ctx, wg, p, "noisy", 1, 32)
		}
		for q := range 3 {
			l := f.lims[4+q].Tenant(fmt.Sprintf("quiet-%d", q))
			wg.Add(1)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					time.Sleep(300*time.Millisecond + rand.N(700*time.Millisecond))
					t0 := time.Now()
					if err := l.Wait(ctx); err != nil {
						continue
					}
					if t0.After(f.start) {
						mu.Lock()
						waits = append(waits, time.Since(t0))
						mu.Unlock()
					}
				}
			}()
		}
	})
	group, tenants := f.windows(gs)
	slices.Sort(waits)
	q := func(p float64) time.Duration { return waits[int(p*float64(len(waits)-1))].Round(time.Millisecond) }
	row("quiet", fmt.Sprintf("quiet tenants' waits, %d: p50 / p90 / p99", len(waits)),
		fmt.Sprintf("%v / %v / %v", q(0.5), q(0.9), q(0.99)), "p99 ≤ 0.5s", group, tenants)
	c := counts(gs)
	total := 0
	for _, n := range c {
		total += n
	}
	row("quiet", fmt.Sprintf("group's use of its rate (noisy %d, quiet %d, %d, %d)", c["noisy"], c["quiet-0"], c["quiet-1"], c["quiet-2"]),
		pct(float64(total)/(20*duration.Seconds())), "", "", "")
}

// weights: two backlogged tenants of weights 3 and 1, each with 2 processes of 16
// waiters, on 100/s.
func weights() {
	f := newFleet("weights", 4, throttle.PerSecond(100))
	defer f.close()
	gs := f.run(func(ctx context.Context, wg *sync.WaitGroup) {
		f.waiters(ctx, wg, 0, "heavy", 3, 16)
		f.waiters(ctx, wg, 1, "heavy", 3, 16)
		f.waiters(ctx, wg, 2, "light", 1, 16)
		f.waiters(ctx, wg, 3, "light", 1, 16)
	})
	c := counts(gs)
	group, tenants := f.windows(gs)
	row("weights", fmt.Sprintf("permits of weight 3 ÷ weight 1 (%d / %d)", c["heavy"], c["light"]),
		fmt.Sprintf("%.3f", float64(c["heavy"])/float64(c["light"])), "3.00 ± 2 %", group, tenants)
}

// jain: 8 tenants of weight 1 with 2 to 32 waiters each, 2 processes, on 100/s.
func jain() {
	f := newFleet("jain", 2, throttle.PerSecond(100))
	defer f.close()
	backlogs := []int{2, 3, 4, 6, 8, 12, 16, 32}
	gs := f.run(func(ctx context.Context, wg *sync.WaitGroup) {
		for i, n := range backlogs {
			f.waiters(ctx, wg, 0, fmt.Sprintf("t%d", i), 1, (n+1)/2)
			f.waiters(ctx, wg, 1, fmt.Sprintf("t%d", i), 1, n/2)
		}
	})
	c := counts(gs)
	var sum, sq float64
	var each []string
	for i := range backlogs {
		x := float64(c[fmt.Sprintf("t%d", i)])
		sum, sq = sum+x, sq+x*x
		each = append(each, fmt.Sprint(int(x)))
	}
	group, tenants := f.windows(gs)
	row("jain", "Jain's index of 8 tenants' permits ("+strings.Join(each, ", ")+")",
		fmt.Sprintf("%.4f", sum*sum/(float64(len(backlogs))*sq)), "≥ 0.99", group, tenants)
}

// lone: one tenant's 64 waiters in 2 processes, on 100/s; and 128 in 4 processes, on
// 20/s.
func lone() {
	for _, c := range []struct{ procs, rate int }{{2, 100}, {4, 20}} {
		f := newFleet("lone", c.procs, throttle.PerSecond(c.rate))
		gs := f.run(func(ctx context.Context, wg *sync.WaitGroup) {
			for p := range c.procs {
				f.waiters(ctx, wg, p, "alone", 1, 32)
			}
		})
		group, tenants := f.windows(gs)
		row("lone", fmt.Sprintf("a lone tenant's use of %d/s, %d waiters", c.rate, 32*c.procs),
			pct(float64(len(gs))/(float64(c.rate)*duration.Seconds())), "≥ 98 %", group, tenants)
		f.close()
	}
}

// caps: group 20/s, each tenant capped at 8/s; two backlogged tenants, then three.
func caps() {
	for _, n := range []int{2, 3} {
		f := newFleet("caps", 2, throttle.PerSecond(20), throttle.PerSecond(8))
		gs := f.run(func(ctx context.Context, wg *sync.WaitGroup) {
			for i := range n {
				f.waiters(ctx, wg, 0, fmt.Sprintf("t%d", i), 1, 8)
				f.waiters(ctx, wg, 1, fmt.Sprintf("t%d", i), 1, 8)
			}
		})
		c := counts(gs)
		var each []string
		for i := range n {
			each = append(each, fmt.Sprintf("%.2f", float64(c[fmt.Sprintf("t%d", i)])/duration.Seconds()))
		}
		goal := "8 + 8 ± 10 %"
		if n == 3 {
			goal = "6.67 each ± 10 %"
		}
		group, tenants := f.windows(gs)
		row("caps", fmt.Sprintf("%d backlogged tenants' permits/s", n), strings.Join(each, " + "), goal, group, tenants)
		f.close()
	}
}

// calls: 64 waiters on a key without tenants, then 8 tenants of 8 waiters, on 200/s, in
// 2 processes: the script calls the server ran per permit granted.
func calls() {
	for _, tenants := range []int{0, 8} {
		f := newFleet("calls", 2, throttle.PerSecond(200))
		ctx := context.Background()
		var c0 int64
		gs := f.run(func(ctx context.Context, wg *sync.WaitGroup) {
			for p := range 2 {
				if tenants == 0 {
					f.waiters(ctx, wg, p, "", 1, 32)
					continue
				}
				for i := range tenants {
					f.waiters(ctx, wg, p, fmt.Sprintf("t%d", i), 1, 4)
				}
			}
			go func() { // the count at the measurement's start
				time.Sleep(*warm)
				c0, _, _ = redisinfo.EvalStats(ctx, f.clients[0])
			}()
		})
		c1, _, _ := redisinfo.EvalStats(ctx, f.clients[0])
		what := "64 waiters on a key without tenants"
		if tenants > 0 {
			what = "8 tenants of 8 waiters"
		}
		group, ts := f.windows(gs)
		row("calls", what+": script calls per permit", fmt.Sprintf("%.2f", float64(c1-c0)/float64(len(gs))),
			map[int]string{0: "unchanged", 8: "≤ 1.5"}[tenants], group, ts)
		f.close()
	}
}

// memory: 10,000 tenants of one limiter ask for a permit at once (Wait, each on a
// deadline of 2s). On 1000/s, every tenant is then in the fair share's queue (granted,
// or holding its place); on 100,000/s with each tenant capped at 10 a minute, every
// tenant is granted at once, and has its caps' state. Reported: Redis's used memory per tenant
// (the queue's entries, the tenants' keys), and the keys left once the queue has drained
// and every TTL has passed.
func memory() {
	const n = 10000
	c := redis.NewClient(&redis.Options{Addr: *addr, PoolSize: 64})
	defer c.Close()
	ctx := context.Background()
	for _, withCaps := range []bool{false, true} {
		name := fmt.Sprintf("mem%d", time.Now().UnixNano()%1000000)
		opts := []throttle.Option{throttle.WithAlgorithm(algorithm)}
		limit := throttle.PerSecond(1000)
		if withCaps {
			opts, limit = append(opts, throttle.WithTenantLimits(throttle.PerMinute(10))), throttle.PerSecond(100000)
		}
		l, err := throttle.New(c, name, limit, opts...)
		if err != nil {
			log.Fatal(err)
		}
		if err := l.Tenant("first").Wait(ctx); err != nil { // the limiter's own state, before measuring
			log.Fatal(err)
		}
		tag := "{jobthrottle:" + name + "}"
		before, keys0 := usedMemory(ctx, c), c.DBSize(ctx).Val()
		var wg sync.WaitGroup
		wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				_ = l.Tenant(fmt.Sprintf("tenant-%05d", i)).Wait(wctx)
			}()
		}
		// measured once 99 % of them are in (a few of the first the fair share's clock has
		// passed already), well before their deadline ends their Waits, which gives their
		// places back
		var queued, tenantKeys int64
		for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
			queued = c.ZCard(ctx, tag+":q").Val()
			tenantKeys = c.DBSize(ctx).Val() - keys0 - 1 // the queue
			if !withCaps && queued >= n*99/100 || withCaps && tenantKeys >= n*99/100 {
				break
			}
		}
		after := usedMemory(ctx, c)
		cancel()
		wg.Wait()
		var left []string
		for wait := time.Duration(0); wait < 2*time.Minute; wait += time.Second {
			if left = c.Keys(ctx, tag+"*").Val(); len(left) == 0 {
				break
			}
			time.Sleep(time.Second)
		}
		what := "Redis memory per queued tenant"
		if withCaps {
			what = "Redis memory per tenant with a cap (its state key)"
		}
		row("memory", what+"; keys left after the TTLs", fmt.Sprintf("%.0f B; %d keys", float64(after-before)/n, len(left)),
			"≤ 200 B; 0", "", fmt.Sprintf("%d queued, %d tenants' keys when measured", queued, tenantKeys))
		if withCaps { // what any state in a key of its own costs: the key's name, its entries, a TTL
			// (in an empty database of its own, as the tenants' keys were, so that both pay
			// for the growth of its tables alike)
			db1 := redis.NewClient(&redis.Options{Addr: *addr, DB: 1})
			defer db1.Close()
			before := usedMemory(ctx, c)
			pipe := db1.Pipeline()
			for i := range n {
				pipe.Set(ctx, fmt.Sprintf("%s:t:tenant-%05d", tag, i), "x", time.Minute)
			}
			if _, err := pipe.Exec(ctx); err != nil {
				log.Fatal(err)
			}
			after := usedMemory(ctx, c)
			for i := range n {
				pipe.Del(ctx, fmt.Sprintf("%s:t:tenant-%05d", tag, i))
			}
			if _, err := pipe.Exec(ctx); err != nil {
				log.Fatal(err)
			}
			row("memory", "Redis memory per key of the same names holding \"x\" with a TTL (the floor of a state in a key of its own)",
				fmt.Sprintf("%.0f B", float64(after-before)/n), "", "", "")
		}
	}
}

func usedMemory(ctx context.Context, c *redis.Client) int64 {
	m, err := redisinfo.Read(ctx, c, "memory")
	if err != nil {
		log.Fatal(err)
	}
	var v int64
	fmt.Sscan(m["used_memory"], &v)
	return v
}

func pct(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

var _ = math.Inf
