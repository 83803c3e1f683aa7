// Command worker runs a simulated fleet that shares one rate limit through Redis: two
// or more asynq servers (as in separate processes) whose tasks call a vendor API, a
// plain goroutine worker loop and an HTTP client, all against a local API that
// enforces the limit itself and answers 429 when it is exceeded. Behind the throttled
// backlog, in the same queue, come unthrottled tasks, which must not wait for it. It
// prints a line of progress a second and a summary, and exits 0 only if the limit
// held and no task was lost, failed or archived.
//
//	go run ./examples/worker                         # embedded miniredis
//	REDIS_ADDR=127.0.0.1:6379 go run ./examples/worker
//	go run ./examples/worker -tasks 1000 -rate 50    # see -help for the numbers
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// config holds the numbers; main sets them from flags and REDIS_ADDR.
type config struct {
	redisAddr   string        // a real Redis; empty: embedded miniredis
	tasks       int           // throttled asynq tasks
	final       float64       // share of them enqueued with MaxRetry(0)
	free        int           // unthrottled asynq tasks, enqueued after the throttled ones
	freeWork    time.Duration // the work of each unthrottled task
	rate        int           // the vendor API's limit: rate per period
	period      time.Duration // the vendor API's limit period
	margin      time.Duration // added to the limiter's period: the way from Redis to the API
	servers     int           // asynq servers
	concurrency int           // workers per server
	check       time.Duration // asynq.Config.DelayedTaskCheckInterval and TaskCheckInterval
	loop        int           // calls made by the goroutine loop
	httpCalls   int           // calls made through the throttling HTTP client
	httpWorkers int           // goroutines sharing that client
	timeout     time.Duration // give up (and fail) after this long
}

func main() {
	cfg := config{redisAddr: os.Getenv("REDIS_ADDR")}
	flag.IntVar(&cfg.tasks, "tasks", 150, "throttled asynq tasks to run")
	flag.Float64Var(&cfg.final, "final", 0.25, "share of the tasks enqueued with MaxRetry(0)")
	flag.IntVar(&cfg.free, "free", 200, "unthrottled asynq tasks, enqueued after the throttled ones in the same queue")
	flag.DurationVar(&cfg.freeWork, "free-work", 20*time.Millisecond, "the work of each unthrottled task")
	flag.IntVar(&cfg.rate, "rate", 10, "the vendor API's limit: requests per -period")
	flag.DurationVar(&cfg.period, "period", time.Second, "the vendor API's limit period")
	flag.DurationVar(&cfg.margin, "margin", 100*time.Millisecond, "added to the shared limiter's period, to cover the time from a grant to the request's arrival")
	flag.IntVar(&cfg.servers, "servers", 2, "asynq servers (as separate processes would run)")
	flag.IntVar(&cfg.concurrency, "concurrency", 20, "workers per asynq server")
	flag.DurationVar(&cfg.check, "check", 100*time.Millisecond, "asynq's DelayedTaskCheckInterval and TaskCheckInterval: how soon due tasks reach a worker")
	flag.IntVar(&cfg.loop, "loop", 30, "calls made by a plain goroutine loop with lim.Wait")
	flag.IntVar(&cfg.httpCalls, "http", 30, "calls made through the throttling http.Client")
	flag.IntVar(&cfg.httpWorkers, "http-workers", 4, "goroutines sharing the throttling http.Client")
	flag.DurationVar(&cfg.timeout, "timeout", 55*time.Second, "give up after this long")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		os.Exit(1)
	}
}

func (c config) validate() error {
	switch {
	case c.tasks < 0 || c.free < 0 || c.loop < 0 || c.httpCalls < 0 || c.tasks+c.loop+c.httpCalls == 0:
		return errors.New("-tasks, -free, -loop and -http must be >= 0, and not all of -tasks, -loop and -http 0")
	case c.freeWork < 0:
		return errors.New("-free-work must be >= 0")
	case c.final < 0 || c.final > 1:
		return fmt.Errorf("-final %v is not in [0, 1]", c.final)
	case c.servers < 1 || c.concurrency < 1 || c.httpWorkers < 1:
		return errors.New("-servers, -concurrency and -http-workers must be >= 1")
	case c.margin < 0 || c.check <= 0 || c.timeout <= 0:
		return errors.New("-margin must be >= 0, -check and -timeout > 0")
	}
	return nil
}

// run starts the fleet, waits for its work, and prints the summary; it returns an
// error if the fleet could not run or the summary shows a broken promise.
func run(parent context.Context, cfg config, out io.Writer) error {
	if err := cfg.validate(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(parent, cfg.timeout)
	defer cancel()

	// One go-redis client, shared by asynq and the limiter.
	rdb, where, closeRedis, err := connect(ctx, cfg.redisAddr)
	if err != nil {
		return err
	}
	defer closeRedis()
	grants := redistest.RecordGrants(rdb) // reads each grant's server time from the script replies

	// The vendor's limit, shared by every caller below through Redis.
	runID := randomID()
	limit := throttle.Limit{Rate: cfg.rate, Period: cfg.period + cfg.margin}
	lim, err := throttle.New(rdb, "vendor-api", limit, throttle.WithKeyPrefix("jobthrottle-example:"+runID+":"))
	if err != nil {
		return err
	}
	api := newUpstream(cfg.rate, cfg.period)
	defer api.Close()
	plain := api.Client() // for callers that already hold a permit
	plain.Transport.(*http.Transport).MaxIdleConnsPerHost = 100
	fmt.Fprintf(out, "jobthrottle worker example on %s: vendor API limit %d per %v, shared limiter %v\n",
		where, cfg.rate, cfg.period, limit)

	var st stats
	queue := "jobthrottle-example-" + runID
	servers, setups, err := startServers(cfg, rdb, lim, queue, plain, api.URL, &st, out)
	defer func() { shutdown(servers) }()
	if err != nil {
		return err
	}
	nFinal, err := enqueue(ctx, cfg, rdb, queue, &st)
	if err != nil {
		return err
	}

	// A plain goroutine worker loop: wait for a permit, then call.
	var wg sync.WaitGroup
	wg.Add(1)
	go work(ctx, &wg, cfg.loop, &st.loopTried, &st.loopDone, &st, func() error {
		if err := lim.Wait(ctx); err != nil {
			return err
		}
		return callAgainOn429(ctx, plain, api.URL+"/call?src=loop", lim.Wait)
	})

	// An HTTP client whose transport waits for a permit before each request, used by
	// a few goroutines. Should the vendor answer 429 (a request that reached it later
	// than the margin allows: a starved host), the transport pauses the fleet for its
	// Retry-After and sends the request again, with a new permit.
	throttled := &http.Client{Transport: waiter.NewTransport(lim, plain.Transport, waiter.WithRetries(2))}
	var httpLeft atomic.Int64
	httpLeft.Store(int64(cfg.httpCalls))
	for range cfg.httpWorkers {
		wg.Add(1)
		go work(ctx, &wg, -1, &st.httpTried, &st.httpDone, &st, func() error {
			if httpLeft.Add(-1) < 0 {
				return errNoMoreWork
			}
			return call(ctx, throttled, api.URL+"/call?src=http")
		})
	}

	// One line of progress a second until the work is done or time is up.
	start := time.Now()
	progress(ctx, cfg, &st, api, lim, start, out)
	elapsed := time.Since(start)
	stopped := ""
	switch {
	case parent.Err() != nil:
		stopped = "interrupted"
	case ctx.Err() != nil:
		stopped = fmt.Sprintf("timed out after %v", cfg.timeout)
	}
	cancel()
	wg.Wait()
	shutdown(servers)
	servers = nil

	// What asynq itself says about the queue.
	insp := asynq.NewInspectorFromRedisClient(rdb)
	qi, err := insp.GetQueueInfo(queue)
	if err != nil {
		return fmt.Errorf("inspecting the queue: %w", err)
	}
	forget(rdb, insp, queue)

	s := summary{cfg: cfg, where: where, limit: limit, elapsed: elapsed, stopped: stopped,
		st: &st, nFinal: nFinal, grants: grants, api: api, queue: qi}
	for _, jt := range setups {
		ms := jt.Stats()
		s.peakSleeping = max(s.peakSleeping, ms.PeakSleeping)
		s.bounced += ms.Bounced
		s.sleepBound = ms.SleepBound
	}
	return s.print(out)
}

// startServers starts cfg.servers asynq servers on queue, as separate processes
// would run them: each built with asynqmw.New from the Redis client it shares with
// asynq, which supplies the middleware and fills in the server's Config. Their
// "vendor:call" tasks call the vendor API at url under the limit; their "report:build"
// tasks are not limited. It returns the servers and Setups started, also with an
// error.
func startServers(cfg config, rdb redis.UniversalClient, lim *throttle.Limiter, queue string,
	plain *http.Client, url string, st *stats, out io.Writer) ([]*asynq.Server, []*asynqmw.Setup, error) {
	onError := func(ctx context.Context, t *asynq.Task, err error) {
		st.failures.Add(1)
		retried, _ := asynq.GetRetryCount(ctx)
		maxRetry, _ := asynq.GetMaxRetry(ctx)
		if retried >= maxRetry || errors.Is(err, asynq.SkipRetry) { // a last attempt's copy fails with SkipRetry
			st.archived.Add(1) // asynq archives it now
		}
		fmt.Fprintf(out, "task %s failed: %v\n", t.Payload(), err)
	}
	// only the vendor calls are limited
	pick := func(_ context.Context, t *asynq.Task) (*throttle.Limiter, error) {
		if t.Type() == "vendor:call" {
			return lim, nil
		}
		return nil, nil
	}
	var (
		servers []*asynq.Server
		setups  []*asynqmw.Setup
	)
	for range cfg.servers {
		jt := asynqmw.New(rdb, asynqmw.WithHooks(asynqmw.Hooks{
			Waited:    func(context.Context, *asynq.Task, time.Duration) { st.slept.Add(1) },
			Throttled: func(context.Context, *asynq.Task, *asynqmw.ThrottledError) { st.handedBack.Add(1) },
		}))
		srv := asynq.NewServerFromRedisClient(rdb, jt.Config(asynq.Config{
			Concurrency:              cfg.concurrency,
			Queues:                   map[string]int{queue: 1},
			ErrorHandler:             asynq.ErrorHandlerFunc(onError),
			DelayedTaskCheckInterval: cfg.check,
			TaskCheckInterval:        cfg.check,
			LogLevel:                 asynq.WarnLevel,
		}))
		mux := asynq.NewServeMux()
		mux.Use(jt.ThrottleFunc(pick))
		mux.HandleFunc("vendor:call", func(ctx context.Context, t *asynq.Task) error {
			if n, _ := asynq.GetRetryCount(ctx); n > 0 {
				st.retriesSpent.Add(1)
			}
			if err := callAgainOn429(ctx, plain, url+"/call?src=asynq", lim.Wait); err != nil {
				return err
			}
			st.taskRan(string(t.Payload()))
			return nil
		})
		mux.HandleFunc("report:build", func(ctx context.Context, t *asynq.Task) error {
			time.Sleep(cfg.freeWork)
			st.freeRan(string(t.Payload()))
			return nil
		})
		if err := srv.Start(mux); err != nil {
			return servers, setups, err
		}
		servers = append(servers, srv)
		setups = append(setups, jt)
	}
	return servers, setups, nil
}

// enqueue adds cfg.tasks throttled tasks to queue, a share cfg.final of them with
// MaxRetry(0), then cfg.free unthrottled ones, and returns how many have MaxRetry(0).
func enqueue(ctx context.Context, cfg config, rdb redis.UniversalClient, queue string, st *stats) (int, error) {
	client := asynq.NewClientFromRedisClient(rdb)
	nFinal := 0
	for i := range cfg.tasks {
		opts := []asynq.Option{asynq.Queue(queue)}
		if float64(nFinal) < cfg.final*float64(i+1) {
			opts = append(opts, asynq.MaxRetry(0)) // a throttle error would archive it: the middleware must not return one
			nFinal++
		}
		if err := enqueueOnce(ctx, client, asynq.NewTask("vendor:call", fmt.Appendf(nil, "task-%d", i)), opts...); err != nil {
			return nFinal, err
		}
	}
	st.freeStart(time.Now())
	for i := range cfg.free {
		st.freeEnqueued(fmt.Sprintf("free-%d", i), time.Now())
		if err := enqueueOnce(ctx, client, asynq.NewTask("report:build", fmt.Appendf(nil, "free-%d", i)), asynq.Queue(queue)); err != nil {
			return nFinal, err
		}
	}
	return nFinal, nil
}

// enqueueOnce enqueues task. asynq gives each call a new task ID before it sends its
// script, and go-redis sends the script again when a reply is slow to come (its read
// timeout on a starved host): the second send then finds the task the first one
// enqueued and fails with ErrTaskIDConflict. That task is this call's, enqueued once.
func enqueueOnce(ctx context.Context, client *asynq.Client, task *asynq.Task, opts ...asynq.Option) error {
	if _, err := client.EnqueueContext(ctx, task, opts...); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("enqueue: %w", err)
	}
	return nil
}

// errNoMoreWork ends a worker goroutine whose shared supply of calls ran out.
var errNoMoreWork = errors.New("no more work")

// work runs do n times (until it returns errNoMoreWork, for n < 0), counting the
// calls in tried and those that succeeded in ok; it stops early when ctx ends.
func work(ctx context.Context, wg *sync.WaitGroup, n int, tried, ok *atomic.Int64, st *stats, do func() error) {
	defer wg.Done()
	for i := 0; n < 0 || i < n; i++ {
		err := do()
		if errors.Is(err, errNoMoreWork) {
			return
		}
		tried.Add(1)
		if err != nil {
			st.otherErr(err)
			if ctx.Err() != nil {
				return
			}
			continue
		}
		ok.Add(1)
	}
}

// progress prints a line a second until every task ran (or was archived), every
// call was made, or ctx ends. The limiter's figures come from lim.Inspect (the
// server's count of its window, and the bookings waiting); the API's are the requests
// it saw in its own window.
func progress(ctx context.Context, cfg config, st *stats, api *upstream, lim *throttle.Limiter, start time.Time, out io.Writer) {
	tick, poll := time.NewTicker(time.Second), time.NewTicker(20*time.Millisecond)
	defer tick.Stop()
	defer poll.Stop()
	for {
		if st.tasksDone()+int(st.archived.Load()) >= cfg.tasks && st.freeDone() >= cfg.free &&
			int(st.loopTried.Load()) == cfg.loop && int(st.httpTried.Load()) == cfg.httpCalls {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-tick.C:
			window := "?"
			if s, err := lim.Inspect(ctx); err == nil {
				l := s.Limits[0]
				window = fmt.Sprintf("%d/%d in its %v window, %d booked", l.Used-s.Booked, l.Capacity, l.Limit.Period, s.Booked)
				if s.Booked > 0 {
					window += fmt.Sprintf(" (to %v ahead)", s.BookedAhead.Round(time.Millisecond))
				}
			}
			total, rejected, recent := api.counts(cfg.period)
			fmt.Fprintf(out, "%3.0fs  tasks %d/%d  loop %d/%d  http %d/%d  limiter %s  API %d in the last %v, %d in all, %d × 429  handed back %d  slept %d\n",
				time.Since(start).Seconds(), st.tasksDone(), cfg.tasks, st.loopDone.Load(), cfg.loop, st.httpDone.Load(), cfg.httpCalls,
				window, recent, cfg.period, total, rejected, st.handedBack.Load(), st.slept.Load())
		}
	}
}

// connect returns a client to the Redis at addr or, when addr is empty, to an
// embedded miniredis whose TTLs follow the real clock.
func connect(ctx context.Context, addr string) (redis.UniversalClient, string, func(), error) {
	if addr == "" {
		m, err := miniredis.Run()
		if err != nil {
			return nil, "", nil, fmt.Errorf("starting miniredis: %w", err)
		}
		m.ClockTTL(true) // keys expire on the real clock, as in Redis
		rdb := redis.NewClient(&redis.Options{Addr: m.Addr()})
		return rdb, "embedded miniredis (REDIS_ADDR is unset)", func() { rdb.Close(); m.Close() }, nil
	}
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	if err := rdb.Ping(ctx).Err(); err != nil {
		rdb.Close()
		return nil, "", nil, fmt.Errorf("REDIS_ADDR=%s: %w", addr, err)
	}
	return rdb, "Redis at " + addr, func() { rdb.Close() }, nil
}

// call makes one request to the vendor API; a status other than 200 is an error.
func call(ctx context.Context, c *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode == http.StatusTooManyRequests {
		return errTooMany
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("vendor API answered %s", resp.Status)
	}
	return nil
}

// callAgainOn429 calls url with c, holding a permit already. When the vendor answers
// 429 (the request reached it later than the margin allows, on a starved host: the
// grants themselves keep the limit), it waits for a new permit with wait and calls
// again, as a client of a real vendor would, up to twice.
func callAgainOn429(ctx context.Context, c *http.Client, url string, wait func(context.Context) error) error {
	err := call(ctx, c, url)
	for try := 0; try < 2 && errors.Is(err, errTooMany); try++ {
		if err := wait(ctx); err != nil {
			return err
		}
		err = call(ctx, c, url)
	}
	return err
}

// errTooMany is the vendor's 429 Too Many Requests.
var errTooMany = errors.New("vendor API answered 429 Too Many Requests")

// forget deletes the queue and what asynq keeps of it beyond DeleteQueue (its
// processed and failed counters), so runs on a real Redis leave nothing behind; the
// limiter's keys expire by themselves.
func forget(rdb redis.UniversalClient, insp *asynq.Inspector, queue string) {
	_ = insp.DeleteQueue(queue, true)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	iter := rdb.Scan(ctx, 0, "asynq:{"+queue+"}:*", 100).Iterator()
	for iter.Next(ctx) {
		rdb.Del(ctx, iter.Val())
	}
}

// shutdown stops the asynq servers, all at once.
func shutdown(servers []*asynq.Server) {
	var wg sync.WaitGroup
	for _, s := range servers {
		wg.Add(1)
		go func() { defer wg.Done(); s.Shutdown() }()
	}
	wg.Wait()
}

func randomID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
