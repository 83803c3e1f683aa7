package asynqmw_test

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
)

func TestMain(m *testing.M) {
	// go-redis's log without the dial failures the outage tests cause on purpose (one
	// line per failed dial while Redis is down)
	redis.SetLogger(logging.NewBlacklistLogger([]string{"failed to dial"}))
	// The parallel tests wait on asynq's clock (whole-second retries, 100ms polls), not
	// on the CPU.
	redistest.Parallel(8)
	redistest.Main(m)
}

// The end-to-end tests run real asynq servers on every backend (miniredis on the real
// clock, a real redis-server, a Redis Cluster). asynq's own timing sets their length:
// a handed-back task comes back after whole seconds (RetryDelay) plus the forwarder's
// interval, which the tests set to 100ms; so each takes a few seconds, kept short by
// small numbers of tasks.

// eachBackend runs f on every backend, as redistest.EachRealTime, the backends side by
// side: each run has a queue and keys of its own, and what the tests assert is counted,
// not timed (asynq's whole seconds, not CPU, set their length).
func eachBackend(t *testing.T, f func(t *testing.T, b *redistest.Backend)) {
	t.Helper()
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		t.Parallel()
		f(t, b)
	})
}

// fleet is asynq servers, a client and an inspector on one backend and one queue of
// its own.
type fleet struct {
	t       *testing.T
	b       *redistest.Backend
	queue   string
	client  *asynq.Client
	insp    *asynq.Inspector
	servers []*asynq.Server
	runs    *runLog
}

func newFleet(t *testing.T, b *redistest.Backend) *fleet {
	t.Helper()
	var r [4]byte
	_, _ = rand.Read(r[:])
	f := &fleet{
		t:      t,
		b:      b,
		queue:  "jt-" + hex.EncodeToString(r[:]),
		client: asynq.NewClientFromRedisClient(b.Client),
		insp:   asynq.NewInspectorFromRedisClient(b.Client),
		runs:   &runLog{runs: map[string][]int{}, taskIDs: map[string][]string{}},
	}
	t.Cleanup(func() {
		f.stop()
		_ = f.insp.DeleteQueue(f.queue, true)
	})
	return f
}

// limiter returns a limiter under the backend's test prefix.
func (f *fleet) limiter(key string, l throttle.Limit) *throttle.Limiter {
	f.t.Helper()
	lim, err := throttle.New(f.b.Client, key, l, throttle.WithKeyPrefix(f.b.Prefix))
	if err != nil {
		f.t.Fatal(err)
	}
	return lim
}

// serverConfig is the configuration every test server starts from, before a Setup's
// Config: a failure retried at once, a fast forwarder and poller (Config keeps them),
// and a quiet logger.
func (f *fleet) serverConfig(concurrency int) asynq.Config {
	return asynq.Config{
		Concurrency:              concurrency,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 0 },
		Queues:                   map[string]int{f.queue: 1},
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval:        50 * time.Millisecond,
		ShutdownTimeout:          2 * time.Second,
		LogLevel:                 asynq.ErrorLevel,
		Logger:                   testLogger{f.t},
	}
}

// run starts a server of n workers configured by jt, running h behind mws.
func (f *fleet) run(jt *asynqmw.Setup, n int, h asynq.Handler, mws ...asynq.MiddlewareFunc) *asynq.Server {
	f.t.Helper()
	return f.start(jt.Config(f.serverConfig(n)), h, mws...)
}

// start starts a server with cfg running h behind mws.
func (f *fleet) start(cfg asynq.Config, h asynq.Handler, mws ...asynq.MiddlewareFunc) *asynq.Server {
	f.t.Helper()
	mux := asynq.NewServeMux()
	mux.Use(mws...)
	mux.Handle("job", h)
	srv := asynq.NewServerFromRedisClient(f.b.Client, cfg)
	if err := srv.Start(mux); err != nil {
		f.t.Fatal(err)
	}
	f.servers = append(f.servers, srv)
	return srv
}

func (f *fleet) stop() {
	for _, s := range f.servers {
		s.Shutdown()
	}
	f.servers = nil
}

// enqueue adds a task of type "job" with payload id.
func (f *fleet) enqueue(id string, opts ...asynq.Option) *asynq.TaskInfo {
	f.t.Helper()
	info, err := f.client.Enqueue(asynq.NewTask("job", []byte(id)), append([]asynq.Option{asynq.Queue(f.queue)}, opts...)...)
	if err != nil {
		f.t.Fatalf("enqueue %s: %v", id, err)
	}
	return info
}

// info returns the queue's stats.
func (f *fleet) info() *asynq.QueueInfo {
	f.t.Helper()
	qi, err := f.insp.GetQueueInfo(f.queue)
	if err != nil {
		f.t.Fatalf("GetQueueInfo: %v", err)
	}
	return qi
}

// idleLimit bounds how long a test waits for its tasks. They take a few seconds; the
// bound is far longer so that a starved host (asynq's syncer retries a failed write
// every 5 s) slows a test down instead of failing it.
const idleLimit = 60 * time.Second

// waitIdle waits until no task of the queue is pending, active, scheduled or due
// for retry, and cond (if not nil) holds; it fails the test after limit.
//
// A failed GetQueueInfo is tried again until limit: after a Redis restart the
// inspector's client may still fail at once for up to a second (go-redis, having
// failed PoolSize dials, returns the last dial error without dialing until its
// background dial, once a second, succeeds).
func (f *fleet) waitIdle(limit time.Duration, cond func() bool) *asynq.QueueInfo {
	f.t.Helper()
	deadline := time.Now().Add(limit)
	for {
		qi, err := f.insp.GetQueueInfo(f.queue)
		if err == nil && qi.Pending+qi.Active+qi.Scheduled+qi.Retry+qi.Aggregating == 0 && (cond == nil || cond()) {
			return qi
		}
		if time.Now().After(deadline) {
			if err != nil {
				f.t.Fatalf("GetQueueInfo: %v", err)
			}
			f.t.Fatalf("queue not idle after %v: %+v", limit, qi)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ranOnce checks that each task ran exactly once, with no retry spent, and that the
// queue has nothing archived or failed.
func (f *fleet) ranOnce(qi *asynq.QueueInfo, ids ...string) {
	f.t.Helper()
	for _, id := range ids {
		if got := f.runs.get(id); len(got) != 1 || got[0] != 0 {
			f.t.Errorf("task %s: retry counts of its runs %v, want [0] (one run, no retry spent)", id, got)
		}
	}
	if qi.Archived != 0 || qi.FailedTotal != 0 {
		var errs []string
		if arch, err := f.insp.ListArchivedTasks(f.queue); err == nil {
			for _, a := range arch {
				errs = append(errs, fmt.Sprintf("%s: %s", a.Payload, a.LastErr))
			}
		}
		f.t.Errorf("queue: archived %d %q, failed %d; want 0", qi.Archived, errs, qi.FailedTotal)
	}
}

// handler records each run (payload → retry counts seen) and returns fail's error.
func (f *fleet) handler(fail func(ctx context.Context, id string, retried int) error) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		retried, _ := asynq.GetRetryCount(ctx)
		taskID, _ := asynq.GetTaskID(ctx)
		id := string(t.Payload())
		f.runs.add(id, retried, taskID)
		if fail != nil {
			return fail(ctx, id, retried)
		}
		return nil
	})
}

// runLog is what the handler saw: for each payload, the retry count and task ID of
// each run.
type runLog struct {
	mu      sync.Mutex
	runs    map[string][]int
	taskIDs map[string][]string
}

func (r *runLog) add(id string, retried int, taskID string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.runs[id] = append(r.runs[id], retried)
	r.taskIDs[id] = append(r.taskIDs[id], taskID)
}

func (r *runLog) getTaskIDs(id string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.taskIDs[id]...)
}

func (r *runLog) get(id string) []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.runs[id]...)
}

func (r *runLog) total() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, v := range r.runs {
		n += len(v)
	}
	return n
}

// counters counts the middleware's decisions, by payload.
type counters struct {
	mu        sync.Mutex
	throttled map[string]int
	requeued  map[string]int
	// lastRetried counts hand-backs of a task on its last attempt that were not a
	// copy: asynq archives such a task.
	lastRetried map[string]int
	waited      map[string]time.Duration
}

func newCounters() *counters {
	return &counters{throttled: map[string]int{}, requeued: map[string]int{}, lastRetried: map[string]int{}, waited: map[string]time.Duration{}}
}

func (c *counters) hooks() asynqmw.Hooks {
	return asynqmw.Hooks{
		Waited: func(ctx context.Context, t *asynq.Task, d time.Duration) {
			c.mu.Lock()
			defer c.mu.Unlock()
			c.waited[string(t.Payload())] += d
		},
		Throttled: func(ctx context.Context, t *asynq.Task, err *asynqmw.ThrottledError) {
			c.mu.Lock()
			defer c.mu.Unlock()
			id := string(t.Payload())
			c.throttled[id]++
			if err.Requeued {
				c.requeued[id]++
			}
			retried, _ := asynq.GetRetryCount(ctx)
			if maxRetry, ok := asynq.GetMaxRetry(ctx); ok && retried >= maxRetry && !err.Requeued {
				c.lastRetried[id]++
			}
		},
	}
}

// get returns m[id] under the lock.
func get[V any](c *counters, m map[string]V, id string) V {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m[id]
}

// lastAttemptsAsCopies checks that every last attempt handed back of tasks ids went
// back as a copy (asynq archives one that does not), and that some did.
func (c *counters) lastAttemptsAsCopies(t *testing.T, ids ...string) {
	t.Helper()
	copies := 0
	for _, id := range ids {
		if n := get(c, c.lastRetried, id); n != 0 {
			t.Errorf("task %s was handed back %d times on its last attempt without a copy", id, n)
		}
		copies += get(c, c.requeued, id)
	}
	if copies == 0 {
		t.Errorf("no last attempt of %d was handed back as a copy: the test did not exercise that path", len(ids))
	}
}

func (c *counters) sum(m map[string]int) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// testLogger sends asynq's log to the test log.
type testLogger struct{ t *testing.T }

func (l testLogger) Debug(args ...any) { l.t.Log(append([]any{"asynq debug:"}, args...)...) }
func (l testLogger) Info(args ...any)  { l.t.Log(append([]any{"asynq info:"}, args...)...) }
func (l testLogger) Warn(args ...any)  { l.t.Log(append([]any{"asynq warn:"}, args...)...) }
func (l testLogger) Error(args ...any) { l.t.Log(append([]any{"asynq error:"}, args...)...) }
func (l testLogger) Fatal(args ...any) { l.t.Error(append([]any{"asynq fatal:"}, args...)...) }

// ids returns n payloads "<prefix>-0" … "<prefix>-(n-1)".
func ids(prefix string, n int) []string {
	s := make([]string, n)
	for i := range s {
		s[i] = fmt.Sprintf("%s-%d", prefix, i)
	}
	return s
}

// workerEnv names the environment of TestWorkerProcess: a worker process that a test
// starts, and kills.
const workerEnv = "JOBTHROTTLE_ASYNQ_WORKER"

// TestWorkerProcess is the worker process of the tests that kill one: an asynq server
// of 10 workers configured by a Setup, running every task of its queue through Throttle
// of a limiter of RATE per second (recordRun is the handler). It prints
// "sleeping <n>" each time the number of tasks asleep in its middleware changes, and
// exits when its stdin closes.
func TestWorkerProcess(t *testing.T) {
	if os.Getenv(workerEnv) == "" {
		t.Skip("helper process of TestLastAttemptSurvivesItsWorkersDeath")
	}
	env := func(k string) string { return os.Getenv(workerEnv + "_" + k) }
	rate, err := strconv.Atoi(env("RATE"))
	if err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Dial(strings.Split(env("ADDRS"), ","), env("CLUSTER") != "")
	defer rdb.Close()
	lim, err := throttle.New(rdb, env("KEY"), throttle.PerSecond(rate), throttle.WithKeyPrefix(env("PREFIX")))
	if err != nil {
		t.Fatal(err)
	}
	jt := asynqmw.New(rdb)
	srv := asynq.NewServerFromRedisClient(rdb, jt.Config(workerConfig(env("QUEUE"), 10, testLogger{t})))
	mux := asynq.NewServeMux()
	mux.Use(jt.Throttle(lim))
	mux.Handle("job", recordRun(rdb, env("PREFIX")))
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(eof) }() // the parent closes stdin, or dies
	last := -1
	for {
		select {
		case <-eof:
			return
		case <-time.After(5 * time.Millisecond):
		}
		if n := jt.Stats().Sleeping; n != last {
			fmt.Printf("sleeping %d\n", n)
			last = n
		}
	}
}

// workerConfig is the server configuration of a worker of queue, before a Setup's
// Config: a failure retried at once, fast forwarder and poller, and a quiet logger.
func workerConfig(queue string, concurrency int, log asynq.Logger) asynq.Config {
	return asynq.Config{
		Concurrency:              concurrency,
		RetryDelayFunc:           func(int, error, *asynq.Task) time.Duration { return 0 },
		Queues:                   map[string]int{queue: 1},
		DelayedTaskCheckInterval: 100 * time.Millisecond,
		TaskCheckInterval:        50 * time.Millisecond,
		ShutdownTimeout:          2 * time.Second,
		LogLevel:                 asynq.ErrorLevel,
		Logger:                   log,
	}
}

// recordRun is a handler that records each run in Redis, where every process's runs
// are read from (see runsOf): "<payload> <task ID> <retry count>".
func recordRun(rdb redis.UniversalClient, prefix string) asynq.Handler {
	return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		id, _ := asynq.GetTaskID(ctx)
		retried, _ := asynq.GetRetryCount(ctx)
		return rdb.RPush(context.WithoutCancel(ctx), "{"+prefix+"}runs", fmt.Sprintf("%s %s %d", t.Payload(), id, retried)).Err()
	})
}

// runsOf returns the runs recordRun recorded: payload → the task IDs it ran as.
func runsOf(t *testing.T, rdb redis.UniversalClient, prefix string) map[string][]string {
	t.Helper()
	lines, err := rdb.LRange(context.Background(), "{"+prefix+"}runs", 0, -1).Result()
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string][]string{}
	for _, l := range lines {
		f := strings.Fields(l)
		runs[f[0]] = append(runs[f[0]], f[1])
	}
	return runs
}

// worker is a worker process started by startWorker.
type worker struct {
	cmd      *exec.Cmd
	sleeping chan int // what it printed
}

// startWorker starts TestWorkerProcess on b's server, for queue and a limiter key of
// rate per second under b's prefix. The test's cleanup kills it.
func startWorker(t *testing.T, b *redistest.Backend, queue, key string, rate int) *worker {
	t.Helper()
	addrs, cluster := b.Addrs()
	cmd := exec.Command(os.Args[0], "-test.run=^TestWorkerProcess$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(os.Environ(), workerEnv+"=1",
		workerEnv+"_ADDRS="+strings.Join(addrs, ","), workerEnv+"_CLUSTER="+map[bool]string{true: "1"}[cluster],
		workerEnv+"_QUEUE="+queue, workerEnv+"_KEY="+key, workerEnv+"_PREFIX="+b.Prefix, workerEnv+"_RATE="+strconv.Itoa(rate),
		"GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, sleeping: make(chan int, 1000)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var n int
			if _, err := fmt.Sscanf(sc.Text(), "sleeping %d", &n); err == nil {
				w.sleeping <- n
			}
		}
	}()
	t.Cleanup(func() { stdin.Close(); _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
	return w
}
