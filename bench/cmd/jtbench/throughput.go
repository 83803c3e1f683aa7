package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Throughput: every case runs for a short slice at each goroutine count, all cases in
// a shuffled order per round, so that the no-op of the same round is the yardstick.

// noopScript is the physical limit of a script call: EVALSHA of "return 1" on one key.
var noopScript = redis.NewScript("return 1")

// noopTxName is the no-op as jobthrottle sends its scripts: in MULTI/EXEC, with the
// keys and arguments of a one-limit Allow (allowCall).
const noopTxName = "MULTI, EVALSHA return 1, EXEC"

var noopTxKeys, noopTxArgs = allowCall(throttle.SlidingWindow, "noop", 1_000_000_000, time.Second)

// tcase is one operation measured for throughput.
type tcase struct {
	name string
	path string // "allowed", "denied" or "" for the physical limit
	op   allowFunc
	// reset, when not nil, gives the case fresh keys before each measurement: a log
	// left idle between two rounds would otherwise have all its entries expire on the
	// first call of the next one (which the Redisson-style script cannot do: past ~8000
	// expired grants its unbounded unpack fails), rather than one or two per call.
	reset func(ctx context.Context) error
}

// manyKeyCount is how many keys the "over N keys" cases spread their calls over.
const manyKeyCount = 64

// Limits of the throughput cases: a limit the benchmark never reaches (every call is
// allowed; a short period, so that log entries expire while a case runs, as they do
// in a steady state) and one it always exceeds (almost every call is denied).
var (
	allowedRate, allowedPeriod = 1_000_000_000, 100 * time.Millisecond
	deniedRate, deniedPeriod   = 100, time.Second
)

// resetter returns a reset that deletes keys and runs setup (when not nil).
func resetter(rdb *redis.Client, keys []string, setup func(context.Context) error) func(context.Context) error {
	return func(ctx context.Context) error {
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			return err
		}
		if setup != nil {
			return setup(ctx)
		}
		return nil
	}
}

func throughputCases(ctx context.Context, rdb *redis.Client) ([]tcase, error) {
	o := *rdb.Options()
	o.MaxRetries = -1
	noRetry := redis.NewClient(&o) // lives as long as the run
	o = *rdb.Options()
	o.ContextTimeoutEnabled = true
	ctxTimeout := redis.NewClient(&o) // lives as long as the run
	o.MaxRetries = -1
	leanest := redis.NewClient(&o) // both: lives as long as the run
	if err := noopScript.Load(ctx, rdb).Err(); err != nil {
		return nil, err
	}
	noopKeys := []string{"{" + keyPrefix + "noop}"}
	cases := []tcase{
		{"PING", "", func(ctx context.Context) (bool, error) { return true, rdb.Ping(ctx).Err() }, nil},
		{"EVALSHA return 1 (no-op)", "", func(ctx context.Context) (bool, error) {
			return true, noopScript.Run(ctx, rdb, noopKeys).Err()
		}, nil},
		// jobthrottle runs every script in MULTI/EXEC (at most once, never re-sent by a
		// go-redis retry): the floor of that call, with the limiters' keys and arguments
		{noopTxName, "", func(ctx context.Context) (bool, error) {
			pipe := rdb.TxPipeline()
			cmd := noopScript.EvalSha(ctx, pipe, noopTxKeys, noopTxArgs...)
			if _, err := pipe.Exec(ctx); err != nil {
				return false, err
			}
			return true, cmd.Err()
		}, nil},
	}
	for _, path := range []string{"allowed", "denied"} {
		rate, period := allowedRate, allowedPeriod
		if path == "denied" {
			rate, period = deniedRate, deniedPeriod
		}
		key := "tp-" + path
		rr := redisRateSubject(rdb, key, redis_rate.Limit{Rate: rate, Burst: rate, Period: period})
		rs, _, err := redissonSubject(ctx, rdb, key+"-redisson", rate, period)
		if err != nil {
			return nil, err
		}
		cases = append(cases,
			tcase{rr.name, path, rr.allow, resetter(rdb, rr.keys, nil)},
			tcase{rs.name, path, rs.allow, resetter(rdb, rs.keys, rs.setup)})
		for _, a := range algorithms {
			s, _, err := jobthrottleSubject(rdb, a, key+"-"+a.String(), throttle.Limit{Rate: rate, Period: period})
			if err != nil {
				return nil, err
			}
			cases = append(cases, tcase{s.name, path, s.allow, resetter(rdb, s.keys, nil)})
		}
		if path == "allowed" { // many keys, each lightly used: the per-tenant case
			var rrs []subject
			for i := range manyKeyCount {
				rrs = append(rrs, redisRateSubject(rdb, fmt.Sprintf("%s-k%d", key, i), redis_rate.Limit{Rate: rate, Burst: rate, Period: period}))
			}
			m := manyKeys(rr.name, rrs)
			cases = append(cases, tcase{m.name, path, m.allow, resetter(rdb, m.keys, nil)})
			for _, a := range algorithms {
				var subs []subject
				for i := range manyKeyCount {
					s, _, err := jobthrottleSubject(rdb, a, fmt.Sprintf("%s-%s-k%d", key, a, i), throttle.Limit{Rate: rate, Period: period})
					if err != nil {
						return nil, err
					}
					subs = append(subs, s)
				}
				m := manyKeys("jobthrottle "+a.String(), subs)
				cases = append(cases, tcase{m.name, path, m.allow, resetter(rdb, m.keys, nil)})
			}
			for _, a := range algorithms {
				s, err := tenantsSubject(rdb, a, key+"-"+a.String()+"-tenants", throttle.Limit{Rate: rate, Period: period}, manyKeyCount)
				if err != nil {
					return nil, err
				}
				cases = append(cases, tcase{s.name, path, s.allow, resetter(rdb, s.keys, nil)})
			}
		}
		// a client that never re-sends (MaxRetries -1) gets plain EVALSHA, no MULTI/EXEC
		for _, a := range []throttle.Algorithm{throttle.SlidingWindow, throttle.TokenBucket} {
			s, _, err := jobthrottleSubject(noRetry, a, key+"-"+a.String()+"-noretry", throttle.Limit{Rate: rate, Period: period})
			if err != nil {
				return nil, err
			}
			cases = append(cases, tcase{s.name + ", client MaxRetries -1", path, s.allow, resetter(rdb, s.keys, nil)})
		}
		// a client that honours deadlines (go-redis then bounds each round trip by the
		// deadline of the calls it carries)
		for _, a := range algorithms {
			s, _, err := jobthrottleSubject(ctxTimeout, a, key+"-"+a.String()+"-ctxtimeout", throttle.Limit{Rate: rate, Period: period})
			if err != nil {
				return nil, err
			}
			cases = append(cases, tcase{s.name + ", client ContextTimeoutEnabled", path, s.allow, resetter(rdb, s.keys, nil)})
		}
		// both: plain EVALSHA, no MULTI/EXEC, bounded by the calls' deadlines
		for _, a := range []throttle.Algorithm{throttle.SlidingWindow, throttle.TokenBucket} {
			s, _, err := jobthrottleSubject(leanest, a, key+"-"+a.String()+"-lean", throttle.Limit{Rate: rate, Period: period})
			if err != nil {
				return nil, err
			}
			cases = append(cases, tcase{s.name + ", client MaxRetries -1 + ContextTimeoutEnabled", path, s.allow, resetter(rdb, s.keys, nil)})
		}
		for _, a := range algorithms {
			cases = append(cases, scriptCase(rdb, a, key+"-"+a.String()+"-script", rate, period, path))
		}
	}
	return cases, nil
}

// scriptCase runs algorithm a's script as a plain EVALSHA with a lone Allow's keys and
// arguments (allowCall): the script's cost without the Limiter's MULTI/EXEC.
func scriptCase(rdb *redis.Client, a throttle.Algorithm, key string, rate int, period time.Duration, path string) tcase {
	keys, args := allowCall(a, key, rate, period)
	script := lua.Script(scripts[a])
	return tcase{"jobthrottle " + a.String() + " script alone, plain EVALSHA", path, func(ctx context.Context) (bool, error) {
		v, err := script.Run(ctx, rdb, keys, args...).Int64Slice()
		if err != nil {
			return false, err
		}
		return len(v) >= 6 && v[0] == 1, nil
	}, resetter(rdb, keys, nil)}
}

// sample is one case measured once at one goroutine count.
type sample struct {
	ops       int
	granted   int
	elapsed   time.Duration
	p50, p99  time.Duration
	redisCPU  time.Duration // server main thread, per call
	exec      time.Duration // script (or PING) execution time per call, from commandstats
	clientCPU time.Duration // this process, per call
	allocs    float64       // heap allocations per call, this process
}

func (s sample) opsPerSec() float64 { return float64(s.ops) / s.elapsed.Seconds() }

// measure runs c on g goroutines for d.
func measure(ctx context.Context, rdb *redis.Client, c tcase, g int, d time.Duration) (sample, error) {
	if c.reset != nil {
		if err := c.reset(ctx); err != nil {
			return sample{}, err
		}
	}
	s0, err := snapServer(ctx, rdb)
	if err != nil {
		return sample{}, err
	}
	c0 := snapClient()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		lats    []time.Duration
		granted int
		first   error
	)
	perG := int(d.Seconds()*200_000)/g + 64
	start := time.Now()
	deadline := start.Add(d)
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, perG)
			ok := 0
			var err error
			for { // at least one call each, however late the goroutine starts
				t0 := time.Now()
				var allowed bool
				allowed, err = c.op(ctx)
				t1 := time.Now()
				lat = append(lat, t1.Sub(t0))
				if err != nil {
					break
				}
				if allowed {
					ok++
				}
				if !t1.Before(deadline) {
					break
				}
			}
			mu.Lock()
			lats = append(lats, lat...)
			granted += ok
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	c1 := snapClient()
	s1, err := snapServer(ctx, rdb)
	if err != nil {
		return sample{}, err
	}
	if first != nil {
		return sample{}, fmt.Errorf("%s: %w", c.name, first)
	}
	slices.Sort(lats)
	n := len(lats)
	execCalls, execUsec := s1.evalCalls-s0.evalCalls, s1.evalUsec-s0.evalUsec
	if c.name == "PING" {
		execCalls, execUsec = s1.otherCalls-s0.otherCalls, s1.otherUsec-s0.otherUsec
	}
	smp := sample{
		ops:       n,
		granted:   granted,
		elapsed:   elapsed,
		p50:       percentile(lats, 50),
		p99:       percentile(lats, 99),
		redisCPU:  time.Duration((s1.cpu - s0.cpu) * 1e9 / float64(n)),
		clientCPU: (c1.cpu - c0.cpu) / time.Duration(n),
		allocs:    float64(c1.mallocs-c0.mallocs) / float64(n),
	}
	if execCalls > 0 {
		smp.exec = time.Duration(execUsec) * time.Microsecond / time.Duration(execCalls)
	}
	return smp, nil
}

// tpResult is every round's samples of one case at one goroutine count, with the
// no-op's samples of the same rounds.
type tpResult struct {
	samples []sample
	noop    []sample
}

// ratios returns each round's ops/s over the same round's no-op ops/s.
func (r tpResult) ratios() []float64 {
	out := make([]float64, len(r.samples))
	for i := range r.samples {
		out[i] = r.samples[i].opsPerSec() / r.noop[i].opsPerSec()
	}
	return out
}

// med returns the median over rounds of f.
func (r tpResult) med(f func(sample) float64) float64 {
	xs := make([]float64, len(r.samples))
	for i, s := range r.samples {
		xs[i] = f(s)
	}
	return median(xs)
}

type tpKey struct {
	c int // index into cases
	g int // goroutines
}

// runThroughput measures every case at every goroutine count for rounds rounds of
// slice each (after one warm-up round that is not counted).
func runThroughput(ctx context.Context, rdb *redis.Client, cases []tcase, gs []int, rounds int, slice time.Duration, logf func(string, ...any)) (map[tpKey]*tpResult, error) {
	noop := slices.IndexFunc(cases, func(c tcase) bool { return c.name == "EVALSHA return 1 (no-op)" })
	res := map[tpKey]*tpResult{}
	var order []tpKey
	for _, g := range gs {
		for i := range cases {
			order = append(order, tpKey{i, g})
			res[tpKey{i, g}] = &tpResult{}
		}
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for r := 0; r <= rounds; r++ {
		warm := r == 0
		d := slice
		if warm {
			d = min(slice, 50*time.Millisecond)
		}
		rng.Shuffle(len(order), func(i, j int) { order[i], order[j] = order[j], order[i] })
		round := map[tpKey]sample{}
		for _, k := range order {
			s, err := measure(ctx, rdb, cases[k.c], k.g, d)
			if err != nil {
				return nil, err
			}
			round[k] = s
		}
		if warm {
			logf("throughput: warm-up round done")
			continue
		}
		for k, s := range round {
			res[k].samples = append(res[k].samples, s)
			res[k].noop = append(res[k].noop, round[tpKey{noop, k.g}])
		}
		logf("throughput: round %d/%d done (no-op at %d goroutines: %.0f ops/s)", r, rounds, gs[len(gs)-1], round[tpKey{noop, gs[len(gs)-1]}].opsPerSec())
	}
	return res, nil
}
