package throttle

import (
	"bufio"
	"context"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Helpers shared by the package's tests. A helper used by one test file stays in that
// file; the larger harnesses stay beside the tests they were built for: the fleet of
// child processes (runFleet) in limiter_fleet_test.go, the fuzz runner (fuzzRun, fuzzReader)
// in limiter_fuzz_test.go. The reference models are in refmodel_window_test.go (sliding
// window, sliding counter, fixed window), refmodel_bucket_test.go (token bucket) and
// refmodel_semaphore_test.go (semaphore).

// ---- time, steps and the fake-clock scripts

const ms = time.Millisecond

// step is one call on a timeline: at t0+at, AllowN(n) must answer want.
type step struct {
	at   time.Duration
	n    int
	want Result
}

// runSteps runs the steps in order on tl and fails at the first answer that differs.
func runSteps(t *testing.T, tl *timeline, l *Limiter, steps []step) {
	t.Helper()
	for i, s := range steps {
		tl.at(s.at)
		got, err := l.AllowN(context.Background(), s.n)
		if err != nil {
			t.Fatalf("step %d (t0+%v, n=%d): %v", i, s.at, s.n, err)
		}
		if got != s.want {
			t.Fatalf("step %d (t0+%v, n=%d): got %+v, want %+v", i, s.at, s.n, got, s.want)
		}
	}
}

// allAlgorithms lists every Algorithm, for tests that run a scenario on each.
var allAlgorithms = []Algorithm{SlidingWindow, TokenBucket, FixedWindow, SlidingCounter}

// eachAlgorithm runs f for every Algorithm (a subtest named after it) on every backend
// (each, redistest.Each or redistest.EachRealTime, a subtest named after the backend).
func eachAlgorithm(t *testing.T, each func(*testing.T, func(*testing.T, *redistest.Backend)),
	f func(t *testing.T, alg Algorithm, b *redistest.Backend)) {
	t.Helper()
	for _, alg := range allAlgorithms {
		t.Run(alg.String(), func(t *testing.T) {
			each(t, func(t *testing.T, b *redistest.Backend) { f(t, alg, b) })
		})
	}
}

// scriptOf returns the script of src as the tests run it (a fake clock's, an audit's).
func scriptOf(src string) *script {
	sum := sha1.Sum([]byte(src))
	return &script{src: src, sha: hex.EncodeToString(sum[:])}
}

// fakeClock holds each script with the clock a test sets (see
// redistest.FakeClockScript): the production Lua on a timeline the test controls, for
// real servers. On miniredis timelines run the production scripts: its clock moves
// TIME and TTLs together.
var fakeClock = map[*script]*script{
	logScript:       scriptOf(redistest.FakeClockSource(logScript.src)),
	bucketScript:    scriptOf(redistest.FakeClockSource(bucketScript.src)),
	windowScript:    scriptOf(redistest.FakeClockSource(windowScript.src)),
	semaphoreScript: scriptOf(redistest.FakeClockSource(semaphoreScript.src)),
}

// audited holds each limiter script with a server-side record of its grants
// (redistest.AuditSource): what the server charged, to compare with what the callers
// were told.
var audited = map[*script]*script{
	logScript:    scriptOf(redistest.AuditSource(logScript.src)),
	bucketScript: scriptOf(redistest.AuditSource(bucketScript.src)),
	windowScript: scriptOf(redistest.AuditSource(windowScript.src)),
}

// ---- timelines: limiters and semaphores on a clock the test moves

// timeline runs limiters on one backend with a clock the test moves: t0 is
// redistest.Epoch, at(d) sets the clock to t0 + d for every limiter made so far.
type timeline struct {
	t    *testing.T
	b    *redistest.Backend
	now  time.Time
	tags []string
}

// parallelTests counts the parallel tests running (see parallel).
var parallelTests atomic.Int32

// parallel marks t a parallel test (t.Parallel). Parallel tests start once every other
// test has ended; they must not set the Go side's clock, which is the package's and
// would move under the tests beside them: setGoClock fails while one runs.
func parallel(t *testing.T) {
	t.Parallel()
	parallelTests.Add(1)
	t.Cleanup(func() { parallelTests.Add(-1) })
}

// setGoClock makes c the Go side's clock (clock.Set) until t ends; never in a parallel
// test.
func setGoClock(t testing.TB, c clock.Clock) {
	t.Helper()
	if parallelTests.Load() > 0 {
		t.Fatal("setGoClock while parallel tests run: the Go side's clock is the package's, shared by every test running")
	}
	t.Cleanup(clock.Set(c))
}

// The Go side's clock (when a booking is due, how long a lease was held) stands at the
// timeline's time while the test runs; its timers are real.
func newTimeline(t *testing.T, b *redistest.Backend) *timeline {
	tl := &timeline{t: t, b: b, now: redistest.Epoch}
	b.SetTime(t, tl.now)
	setGoClock(t, goClock{tl})
	return tl
}

// limiter makes a limiter under the backend's test prefix, on the fake-clock scripts
// (its decisions and Inspect).
func (tl *timeline) limiter(key string, limit Limit, opts ...Option) *Limiter {
	tl.t.Helper()
	opts = append([]Option{WithKeyPrefix(tl.b.Prefix)}, opts...)
	l, err := New(tl.b.Client, key, limit, opts...)
	if err != nil {
		tl.t.Fatalf("New(%q, %v): %v", key, limit, err)
	}
	if tl.b.Real() {
		l.useScript(fakeClock[l.t.script])
	}
	tag := "{" + tl.b.Prefix + key + "}"
	tl.tags = append(tl.tags, tag)
	tl.b.SetTime(tl.t, tl.now, tag)
	return l
}

// semaphore makes a semaphore under the backend's test prefix, on the fake-clock
// script (Go code keeps the real clock: Acquire's waiters run beside the test).
func (tl *timeline) semaphore(key string, max int, opts ...SemaphoreOption) *Semaphore {
	tl.t.Helper()
	opts = append([]SemaphoreOption{WithKeyPrefix(tl.b.Prefix)}, opts...)
	s, err := NewSemaphore(tl.b.Client, key, max, opts...)
	if err != nil {
		tl.t.Fatalf("NewSemaphore(%q, %d): %v", key, max, err)
	}
	if tl.b.Real() {
		s.useScript(fakeClock[s.t.script])
	}
	tag := "{" + tl.b.Prefix + key + "}"
	tl.tags = append(tl.tags, tag)
	tl.b.SetTime(tl.t, tl.now, tag)
	return s
}

// modelCase is an algorithm and its limits, for the tests that run a limiter against
// a reference model (newModel, newBucketModel) on a random timeline.
type modelCase struct {
	alg    Algorithm
	limits []Limit
}

// limiter makes the case's limiter on tl, with the 4 buckets the tests' models of the
// sliding counter are built with.
func (c modelCase) limiter(tl *timeline, key string) *Limiter {
	tl.t.Helper()
	return tl.limiter(key, c.limits[0], WithAlgorithm(c.alg), WithLimits(c.limits[1:]...), WithBuckets(4))
}

// eachModelCase runs check for each case on every backend (redistest.Each): on a fresh
// timeline, with the case's limiter under key and the case's index, a random source
// seeded with seed plus the index, and steps steps to take on the redis-server; fewer
// on the cluster, whose round trips are slower, and on miniredis, whose Lua runs in the
// test's own process (under -race, about five times the server's time).
func eachModelCase(t *testing.T, cases []modelCase, key string, seed int64, steps, fewer int,
	check func(t *testing.T, tl *timeline, l *Limiter, c modelCase, rng *rand.Rand, steps int)) {
	t.Helper()
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		n := steps
		if b.Kind != redistest.Standalone {
			n = fewer
		}
		for ci, c := range cases {
			tl := newTimeline(t, b)
			check(t, tl, c.limiter(tl, fmt.Sprintf("%s%d", key, ci)), c, rand.New(rand.NewSource(seed+int64(ci))), n)
		}
	})
}

// at moves the clock to t0 + d.
func (tl *timeline) at(d time.Duration) {
	tl.t.Helper()
	tl.now = redistest.Epoch.Add(d)
	tl.b.SetTime(tl.t, tl.now, tl.tags...)
}

// goClock is a clock.Clock standing at the timeline's time (timers are real; the
// tests that use it do not sleep).
type goClock struct{ tl *timeline }

func (c goClock) Now() time.Time                       { return c.tl.now }
func (c goClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// stillClock is a clock.Clock whose time stands still (timers are real; the tests
// that use it do not sleep).
type stillClock struct{ now time.Time }

func (c stillClock) Now() time.Time                       { return c.now }
func (c stillClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// signalWait is how long a test waits for something that must happen after a round
// trip or two to Redis (a wake, a timer being set): a busy machine only makes the test
// slower.
const signalWait = 10 * time.Second

// wantInspected fails the test unless l.Inspect reports want (a reference model's
// state), TTL aside: real servers under a test clock stretch TTLs (see
// redistest.FakeTTL), but the state key must have one. format and args say where in
// the run the state was read.
func wantInspected(t *testing.T, l *Limiter, want LimiterState, format string, args ...any) {
	t.Helper()
	got, err := l.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.TTL < 0 {
		t.Fatalf("%s: TTL %v: the state key has no TTL", fmt.Sprintf(format, args...), got.TTL)
	}
	got.TTL = 0
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("%s:\n got %+v\nwant %+v", fmt.Sprintf(format, args...), got, want)
	}
}

// ---- semaphores

// mustTry takes a lease with TryAcquire, or fails the test.
func mustTry(t *testing.T, s *Semaphore) *Lease {
	t.Helper()
	l, wait, err := s.TryAcquire(context.Background())
	if err != nil || l == nil {
		t.Fatalf("TryAcquire: lease %v, wait %v, err %v; want a lease", l, wait, err)
	}
	return l
}

// wantDenied fails the test unless TryAcquire grants nothing and answers wait.
func wantDenied(t *testing.T, s *Semaphore, wait time.Duration) {
	t.Helper()
	l, got, err := s.TryAcquire(context.Background())
	if err != nil || l != nil || got != wait {
		t.Fatalf("TryAcquire: lease %v, wait %v, err %v; want no lease, wait %v", l, got, err, wait)
	}
}

// ---- servers and their keys

// keysUnder counts the backend's keys under its test prefix, fake-clock keys aside.
func keysUnder(t *testing.T, b *redistest.Backend) int {
	t.Helper()
	n := 0
	for _, k := range scanKeys(t, b) {
		if !strings.HasSuffix(k, ":clock") {
			n++
		}
	}
	return n
}

// scanKeys returns the backend's keys under its test prefix, from every master of a
// cluster.
func scanKeys(t *testing.T, b *redistest.Backend) []string {
	t.Helper()
	ctx := context.Background()
	var keys []string
	scan := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "{"+b.Prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		return iter.Err()
	}
	var err error
	switch c := b.Client.(type) {
	case *redis.ClusterClient:
		var mu = make(chan struct{}, 1)
		err = c.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			mu <- struct{}{}
			defer func() { <-mu }()
			return scan(ctx, c)
		})
	case *redis.Client:
		err = scan(ctx, c)
	}
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

// stateMeta returns the meta of l's state key (a log's first element, a string's text
// after its numbers), as internal/keys reads it; the test fails when the key is absent
// or not ours.
func stateMeta(t *testing.T, c redis.UniversalClient, l *Limiter) keys.Meta {
	t.Helper()
	ctx := context.Background()
	text, err := c.Get(ctx, l.stateKey()).Result()
	if redis.HasErrorPrefix(err, "WRONGTYPE") {
		text, err = c.LIndex(ctx, l.stateKey(), 0).Result()
	} else if err == nil {
		_, text, _ = strings.Cut(text, "\n")
	}
	if err != nil {
		t.Fatalf("the state %s: %v", l.stateKey(), err)
	}
	m, err := keys.ParseMeta(text)
	if err != nil {
		t.Fatalf("the state %s: %v", l.stateKey(), err)
	}
	return m
}

// startOwnServer starts a redis-server for one test (its keyspace, memory and
// configuration are the test's alone) and returns a client; the server stops with
// the test. Without redis-server the test is skipped (or fails under
// JOBTHROTTLE_REQUIRE_REAL).
func startOwnServer(t *testing.T, args ...string) (*redistest.Server, *redis.Client) {
	t.Helper()
	s, err := redistest.StartServer(args...)
	if err != nil {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatalf("real Redis required: %v", err)
		}
		t.Skipf("no redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, PoolSize: 64, ReadTimeout: redistest.ClientTimeout, WriteTimeout: redistest.ClientTimeout})
	t.Cleanup(func() { c.Close(); s.Kill(); os.RemoveAll(s.Dir) })
	return s, c
}

// hungServer starts a Redis that accepts connections and never answers; it stops with
// the test.
func hungServer(t *testing.T) *redistest.Proxy {
	t.Helper()
	hung, err := redistest.NewHungServer()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(hung.Close)
	return hung
}

// startHelperProcess starts cmd, this test binary run again as a helper process (the
// fleet's and the semaphore holders' children), with the test's stderr, and calls line
// with each line of its stdout, in order, on a goroutine of its own; eof is closed when
// the stdout ends. The process is killed when the test ends.
func startHelperProcess(t *testing.T, cmd *exec.Cmd, line func(string)) (stdin io.WriteCloser, eof <-chan struct{}) {
	t.Helper()
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
	done := make(chan struct{})
	go func() {
		defer close(done)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line(sc.Text())
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done; _ = cmd.Wait() })
	return stdin, done
}

// downClient is a client of a port nobody listens on: every call is refused at once.
func downClient(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: redistest.RefusedAddr, MaxRetries: -1, DialTimeout: 100 * ms})
	t.Cleanup(func() { c.Close() })
	return c
}

// noteMissingServers says in the output when a test cannot reach a real server of
// one of the kinds given, and what that costs (consequence). redistest.Each skips a
// real-server subtest it cannot run, and go test prints nothing of a passing test, so
// a property checked on miniredis alone, or a fuzz target whose every input was
// skipped, would pass silently. The note goes through redistest.Figure: t.Log, and
// under CI the figures file that .ci/run prints after the tests. (With
// JOBTHROTTLE_REQUIRE_REAL set, as in CI, the missing server fails the test anyway.)
func noteMissingServers(t testing.TB, consequence string, kinds ...redistest.Kind) {
	t.Helper()
	var missing []string
	for _, k := range kinds {
		var err error
		switch k {
		case redistest.Standalone:
			_, err = redistest.StandaloneAddr()
		case redistest.Cluster:
			_, err = redistest.ClusterAddrs()
		}
		if err != nil {
			missing = append(missing, fmt.Sprintf("no %s (%v)", k, err))
		}
	}
	if len(missing) > 0 {
		redistest.Figure(t, "NOT CHECKED on real Redis: %s; %s", strings.Join(missing, ", "), consequence)
	}
}

// ---- scripts

// cmdCount is a go-redis hook that counts the commands that reached the server
// without an error and match, sent alone or in a pipeline.
type cmdCount struct {
	match func(cmd redis.Cmder) bool
	n     atomic.Int64
}

func (c *cmdCount) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *cmdCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c.see(cmd)
		return err
	}
}

func (c *cmdCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			c.see(cmd)
		}
		return err
	}
}

func (c *cmdCount) see(cmd redis.Cmder) {
	if cmd.Err() == nil && c.match(cmd) {
		c.n.Add(1)
	}
}

// evalCount counts the script calls that reached the server as EVAL (the script text)
// rather than EVALSHA: the fallbacks after the server lost the script.
func evalCount() *cmdCount {
	return &cmdCount{match: func(cmd redis.Cmder) bool { return cmd.Name() == "eval" }}
}

// scriptFlush empties the script cache of every server behind c (every master of a
// cluster).
func scriptFlush(ctx context.Context, c redis.UniversalClient) error {
	if cc, ok := c.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, m *redis.Client) error {
			return m.ScriptFlush(ctx).Err()
		})
	}
	return c.ScriptFlush(ctx).Err()
}

// ---- small things

// longFaultTests reports whether the long fault campaigns run (JOBTHROTTLE_LONG set);
// by default each fault test runs for seconds.
func longFaultTests() bool { return os.Getenv("JOBTHROTTLE_LONG") != "" }

// bound is the most permits that may take effect in one period: the rate, the rate and
// the burst less one for the token bucket, two rates for the fixed window.
func bound(alg Algorithm, l Limit) int {
	switch alg {
	case TokenBucket:
		return l.Rate + l.Burst - 1
	case FixedWindow:
		return 2 * l.Rate
	}
	return l.Rate
}

// keyNames returns n keys base-00, base-01, ...
func keyNames(base string, n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%02d", base, i)
	}
	return keys
}

func itoa(i int) string { return strconv.Itoa(i) }
