package main

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/bench/redisson"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Contention: W goroutines in a blocking acquire loop on one shared limit of R per
// second, each written the way its library's users write it.

// acquirer makes one worker's blocking acquire: it returns when the worker holds a
// permit, with the time the grant took effect when the limiter reports it in its reply
// (zero when the grant times come from the server through the hook instead).
type acquirer func(ctx context.Context) (time.Time, error)

// ccase is one contention subject.
type ccase struct {
	name string
	// server reports whether grant times come from jobthrottle's script replies
	// (server clock, read by redistest.RecordGrants); otherwise acquire returns them.
	server bool
	// clock says whose clock the grant times are on, for the table.
	clock string
	// make builds the limiter on a fresh client and returns the acquire loop.
	make func(ctx context.Context, rdb *redis.Client, key string, rate int) (acquirer, error)
}

func contentionCases() []ccase {
	jt := func(a throttle.Algorithm, burst int) func(ctx context.Context, rdb *redis.Client, key string, rate int) (acquirer, error) {
		return func(ctx context.Context, rdb *redis.Client, key string, rate int) (acquirer, error) {
			_, l, err := jobthrottleSubject(rdb, a, key, throttle.Limit{Rate: rate, Period: time.Second, Burst: burst})
			if err != nil {
				return nil, err
			}
			return func(ctx context.Context) (time.Time, error) { return time.Time{}, l.Wait(ctx) }, nil
		}
	}
	rr := func(burst int) func(ctx context.Context, rdb *redis.Client, key string, rate int) (acquirer, error) {
		return func(ctx context.Context, rdb *redis.Client, key string, rate int) (acquirer, error) {
			rl := redis_rate.NewLimiter(rdb)
			limit := redis_rate.Limit{Rate: rate, Burst: burst, Period: time.Second}
			if burst == 0 {
				limit.Burst = rate
			}
			// what redis_rate's users write: ask, sleep RetryAfter, ask again
			return func(ctx context.Context) (time.Time, error) {
				for {
					res, err := rl.Allow(ctx, keyPrefix+key, limit)
					if err != nil {
						return time.Time{}, err
					}
					if res.Allowed > 0 {
						return time.Now(), nil
					}
					time.Sleep(res.RetryAfter)
				}
			}, nil
		}
	}
	return []ccase{
		{name: "redis_rate, sleep RetryAfter and retry", clock: "client (reply received)", make: rr(0)},
		{name: "redis_rate (burst 1), sleep RetryAfter and retry", clock: "client (reply received)", make: rr(1)},
		{name: "Redisson-style log, retry after oldest expiry + 3 ms", clock: "client (score written)", make: func(ctx context.Context, rdb *redis.Client, key string, rate int) (acquirer, error) {
			_, rl, err := redissonSubject(ctx, rdb, key, rate, time.Second)
			if err != nil {
				return nil, err
			}
			if err := redisson.Script.Load(ctx, rdb).Err(); err != nil {
				return nil, err
			}
			return func(ctx context.Context) (time.Time, error) { return rl.Acquire(ctx, 1) }, nil
		}},
		{name: "jobthrottle SlidingWindow Wait", server: true, clock: "server (script reply)", make: jt(throttle.SlidingWindow, 0)},
		{name: "jobthrottle TokenBucket (burst 1) Wait", server: true, clock: "server (script reply)", make: jt(throttle.TokenBucket, 1)},
		{name: "jobthrottle TokenBucket Wait", server: true, clock: "server (script reply)", make: jt(throttle.TokenBucket, 0)},
		{name: "jobthrottle FixedWindow Wait", server: true, clock: "server (script reply)", make: jt(throttle.FixedWindow, 0)},
		{name: "jobthrottle SlidingCounter Wait", server: true, clock: "server (script reply)", make: jt(throttle.SlidingCounter, 0)},
	}
}

// scriptCalls counts the EVAL and EVALSHA calls made through a client.
type scriptCalls struct{ n atomic.Int64 }

func (c *scriptCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.count(cmd)
		return next(ctx, cmd)
	}
}

func (c *scriptCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			c.count(cmd)
		}
		return next(ctx, cmds)
	}
}

func (c *scriptCalls) count(cmd redis.Cmder) {
	if name := strings.ToLower(cmd.Name()); name == "evalsha" || name == "eval" {
		c.n.Add(1)
	}
}

// contResult is one contention run.
type contResult struct {
	name, clock     string
	workers, rate   int
	duration        time.Duration
	granted         int
	util            float64 // share of rate used in the whole seconds after the first
	max1s, max100ms int
	callsPerPermit  float64
	mean, p50, p99  time.Duration // time from asking to holding a permit
	fairMinMax      float64       // least / most permits of one worker
	jain            float64
}

// runContention runs c with w workers on one limit of rate per second for d.
func runContention(ctx context.Context, opts *redis.Options, c ccase, w, rate int, d time.Duration) (contResult, error) {
	rdb := redis.NewClient(opts)
	defer rdb.Close()
	key := "cont-" + strings.NewReplacer(" ", "-", ",", "", "(", "", ")", "").Replace(c.name)
	acquire, err := c.make(ctx, rdb, key, rate)
	if err != nil {
		return contResult{}, err
	}
	calls := &scriptCalls{}
	rdb.AddHook(calls)
	var grants *redistest.Grants
	if c.server {
		grants = redistest.RecordGrants(rdb)
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		waits    []time.Duration
		times    []time.Time
		perW     = make([]int, w)
		firstErr error
	)
	deadline := time.Now().Add(d)
	for i := 0; i < w; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var myWaits []time.Duration
			var myTimes []time.Time
			var err error
			for time.Now().Before(deadline) {
				t0 := time.Now()
				var at time.Time
				at, err = acquire(ctx)
				if err != nil {
					break
				}
				myWaits = append(myWaits, time.Since(t0))
				myTimes = append(myTimes, at)
				perW[i]++
			}
			mu.Lock()
			waits = append(waits, myWaits...)
			if !c.server {
				times = append(times, myTimes...)
			}
			if err != nil && firstErr == nil {
				firstErr = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return contResult{}, firstErr
	}
	if c.server {
		for _, g := range grants.List() {
			for j := 0; j < g.N; j++ {
				times = append(times, g.At)
			}
		}
	}
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	slices.Sort(waits)
	r := contResult{
		name: c.name, clock: c.clock, workers: w, rate: rate, duration: d,
		granted:        len(times),
		util:           utilization(times, time.Second, rate),
		max1s:          redistest.MaxTimesInWindow(times, time.Second),
		max100ms:       redistest.MaxTimesInWindow(times, 100*time.Millisecond),
		callsPerPermit: float64(calls.n.Load()) / float64(max(1, len(times))),
		mean:           meanOf(waits),
		p50:            percentile(waits, 50),
		p99:            percentile(waits, 99),
		jain:           jain(perW),
		fairMinMax:     math.NaN(),
	}
	if hi := slices.Max(perW); hi > 0 {
		r.fairMinMax = float64(slices.Min(perW)) / float64(hi)
	}
	return r, nil
}
