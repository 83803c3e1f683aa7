package asynqmw_test

import (
	"bytes"
	"context"
	"errors"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// While the limiter's Redis is unreachable (FailClosed, the default), tasks are not
// failed: those with retries left are handed back as throttled (retry count
// unchanged), those on their last attempt keep trying in the handler; none runs,
// none is archived, and every one runs exactly once when Redis returns.
func TestLimiterRedisDownReschedules(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lm := miniredis.RunT(t) // the limiter's own Redis, which goes away
		rdb := redis.NewClient(&redis.Options{Addr: lm.Addr(), DialTimeout: 100 * time.Millisecond})
		t.Cleanup(func() { rdb.Close() })
		lim, err := throttle.New(rdb, "down", throttle.PerSecond(100))
		if err != nil {
			t.Fatal(err)
		}
		lm.Close()

		c := newCounters()
		var mu sync.Mutex
		var causes []error
		hooks := c.hooks()
		throttled := hooks.Throttled
		hooks.Throttled = func(ctx context.Context, t *asynq.Task, err *asynqmw.ThrottledError) {
			throttled(ctx, t, err)
			mu.Lock()
			causes = append(causes, err)
			mu.Unlock()
		}
		f.start(f.serverConfig(8), f.handler(nil),
			asynqmw.Throttle(lim, append(fleetOpts(10), asynqmw.MaxInlineWait(200*time.Millisecond), asynqmw.WithHooks(hooks))...))
		final, retrying := ids("final", 4), ids("retrying", 4)
		for i := range final {
			f.enqueue(final[i], asynq.MaxRetry(0))
			f.enqueue(retrying[i], asynq.MaxRetry(2))
		}

		// Redis stays down until every task with retries left was handed back twice.
		deadline := time.Now().Add(idleLimit)
		for c.sum(c.throttled) < 2*len(retrying) {
			if time.Now().After(deadline) {
				t.Fatalf("hand-backs while Redis is down: %d, want %d", c.sum(c.throttled), 2*len(retrying))
			}
			time.Sleep(20 * time.Millisecond)
		}
		if n := f.runs.total(); n != 0 {
			t.Fatalf("%d tasks ran while the limiter's Redis was down", n)
		}
		if qi := f.info(); qi.Archived != 0 || qi.FailedTotal != 0 {
			t.Fatalf("while Redis is down: archived %d, failed %d; want 0", qi.Archived, qi.FailedTotal)
		}
		for _, id := range final {
			if n := get(c, c.throttled, id); n != 0 {
				t.Errorf("task %s (MaxRetry(0)) was handed back %d times; a last attempt keeps trying in the handler", id, n)
			}
		}
		mu.Lock()
		for _, err := range causes {
			if !errors.Is(err, throttle.ErrUnavailable) {
				t.Errorf("hand-back %v: want it to wrap throttle.ErrUnavailable", err)
			}
		}
		mu.Unlock()

		if err := lm.Restart(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= len(final)+len(retrying) })
		f.ranOnce(qi, append(final, retrying...)...)
		redistest.Figure(t, "asynqmw, limiter Redis down (%s): %d hand-backs, 0 runs, 0 archived, 0 failed; all %d tasks ran once within %v of its return",
			b.Kind, c.sum(c.throttled), f.runs.total(), time.Since(back).Round(time.Millisecond))
	})
}

// Issue 6, fault 3: the one Redis that asynq and the limiter share is killed -9 in the
// middle of the load and restarted a second later (appendfsync always, as a Redis
// that holds a job queue should run). Every task runs, none is archived or failed;
// duplicates are counted (asynq's own redelivery is the only source); the limiter
// grants again soon after Redis returns; no goroutine is left behind.
func TestRedisKilledMidLoad(t *testing.T) {
	baseline := runtime.NumGoroutine()
	s, err := redistest.StartServer("--appendonly", "yes", "--appendfsync", "always")
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	defer s.Kill()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr, DialTimeout: 200 * time.Millisecond})
	b := &redistest.Backend{Kind: redistest.Standalone, Client: rdb, Prefix: "jt-kill:"}
	var granted struct {
		sync.Mutex
		times []time.Time
	}
	const (
		rate     = 40
		n        = 160 // 4 s of the limit
		killFrom = 40  // tasks run before the kill
		outage   = time.Second
	)
	lim, err := throttle.New(rdb, "kill", throttle.PerSecond(rate), throttle.WithKeyPrefix(b.Prefix),
		throttle.WithHooks(throttle.Hooks{Allowed: func(string, int, time.Duration) {
			granted.Lock()
			granted.times = append(granted.times, time.Now())
			granted.Unlock()
		}}))
	if err != nil {
		t.Fatal(err)
	}

	func() {
		f := newFleet(t, b)
		defer f.stop()
		c := newCounters()
		mw := asynqmw.Throttle(lim, append(fleetOpts(10), asynqmw.MaxInlineWait(time.Second), asynqmw.Requeue(rdb), asynqmw.WaitForRedis(rdb), asynqmw.WithHooks(c.hooks()))...)
		cfg := f.serverConfig(10)
		cfg.ErrorHandler = asynqmw.SkipThrottled(asynq.ErrorHandlerFunc(func(ctx context.Context, task *asynq.Task, err error) {
			t.Logf("task %s: handler error %v", task.Payload(), err)
		}))
		for range 2 {
			f.start(cfg, f.handler(nil), mw)
		}
		final, retrying := ids("final", n/2), ids("retrying", n/2)
		for i := range final {
			f.enqueue(final[i], asynq.MaxRetry(0))
			f.enqueue(retrying[i], asynq.MaxRetry(3))
		}
		deadline := time.Now().Add(idleLimit)
		for f.runs.total() < killFrom {
			if time.Now().After(deadline) {
				t.Fatalf("only %d runs before the kill", f.runs.total())
			}
			time.Sleep(5 * time.Millisecond)
		}
		s.Kill()
		killed := time.Now()
		time.Sleep(outage)
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		back := time.Now()
		// A task asynq's recoverer archives (below) never runs: idle is all run or archived.
		qi := f.waitIdle(2*idleLimit, func() bool { return len(ranIDs(f, final, retrying))+int(f.info().Archived) >= n })

		// asynq's own redelivery: a dequeue that took effect in Redis just before the
		// kill, whose reply was lost, leaves its task active with nobody running it; a
		// minute later asynq's recoverer retries it (counting a failure, and the run
		// shows a retry count of 1) or, with no retries left, archives it with "task
		// lease expired". Nothing else may fail, archive, lose or duplicate a task.
		var lost, dups, redelivered int
		for _, id := range append(final, retrying...) {
			runs := f.runs.get(id)
			switch {
			case len(runs) == 0:
				lost++
			case len(runs) > 1:
				dups += len(runs) - 1
			}
			if len(runs) > 0 && runs[0] > 0 {
				redelivered++ // its first run was already a retry: a recovered dequeue
			}
		}
		// A second write asynq loses as Redis dies: the revoke of a last attempt that the
		// middleware requeued as a copy (asynq's markAsDone after RevokeTask). The copy
		// runs, once; the original stays active until the recoverer archives it, a
		// minute later, with "task lease expired", though its job ran. Both kinds of
		// archive count as a failure in asynq's stats, as a recovered dequeue does.
		var archivedByRecoverer, revokesLost int
		arch, err := f.insp.ListArchivedTasks(f.queue)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range arch {
			t.Logf("archived %s (retried %d of %d): %s", a.Payload, a.Retried, a.MaxRetry, a.LastErr)
			if a.LastErr != asynq.ErrLeaseExpired.Error() {
				continue
			}
			if len(f.runs.get(string(a.Payload))) == 0 {
				archivedByRecoverer++
				lost--
			} else if a.MaxRetry == 0 {
				revokesLost++
			}
		}
		// Asserted: no job is lost, and nothing is archived but by asynq's recoverer.
		// Reported, not asserted (a known regression of the booked hand-backs, issue
		// 10: its many hand-backs and requeues put more of asynq's writes in flight at
		// the kill, and asynq v0.26 loses those): tasks run twice and failures counted
		// beyond the recovered dequeues and archives. Stop 8's design measured 0 and 0
		// in 12 runs; this one 0-2 and 0-1 per run (README, "asynq workers").
		if lost != 0 || len(arch) != archivedByRecoverer+revokesLost {
			t.Errorf("lost %d, archived %d (%d by asynq's recoverer after a lost dequeue reply, %d after a lost revoke); want none but asynq's",
				lost, len(arch), archivedByRecoverer, revokesLost)
		}
		granted.Lock()
		recovery := time.Duration(-1)
		for _, g := range granted.times {
			if g.After(back) {
				recovery = g.Sub(back)
				break
			}
		}
		granted.Unlock()
		if recovery < 0 || recovery > 2*time.Second {
			t.Errorf("first grant %v after Redis returned; want within 2s", recovery)
		}
		redistest.Figure(t, "asynqmw, redis-server killed -9 after %d of %d tasks, back %v later: lost %d, duplicated %d, archived %d and failed %d by throttling; asynq's recoverer: %d lost dequeue replies redelivered, %d archived, %d requeued originals archived after a lost revoke (their copies ran once); %d hand-backs (%d requeued); first grant %v after restart",
			killFrom, n, back.Sub(killed).Round(time.Millisecond), lost, dups, len(arch)-archivedByRecoverer-revokesLost, int(qi.FailedTotal)-redelivered-len(arch),
			redelivered, archivedByRecoverer, revokesLost, c.sum(c.throttled), c.sum(c.requeued), recovery.Round(time.Millisecond))
	}()
	rdb.Close()

	// Everything the middleware, the limiter and asynq started has ended.
	var left int
	var stacks string
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		stacks, left = ours()
		if left == 0 && runtime.NumGoroutine() <= baseline+2 {
			break
		}
	}
	if left != 0 || runtime.NumGoroutine() > baseline+2 {
		t.Errorf("goroutines: %d before, %d after (%d in jobthrottle packages):\n%s", baseline, runtime.NumGoroutine(), left, stacks)
	}
}

// ranIDs returns the payloads of final and retrying that ran at least once.
func ranIDs(f *fleet, final, retrying []string) []string {
	var ran []string
	for _, id := range append(append([]string(nil), final...), retrying...) {
		if len(f.runs.get(id)) > 0 {
			ran = append(ran, id)
		}
	}
	return ran
}

// ours returns the stacks of goroutines running jobthrottle or asynq code (other than
// the tests), and how many there are.
func ours() (string, int) {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 2)
	var keep []string
	for _, g := range strings.Split(buf.String(), "\n\n") {
		if strings.Contains(g, "testing.tRunner") || strings.Contains(g, "testing.(*T).Run") {
			continue
		}
		for _, pkg := range []string{"jobthrottle/jobthrottle/throttle.", "jobthrottle/jobthrottle/waiter.",
			"jobthrottle/jobthrottle/asynqmw.", "hibiken/asynq."} {
			if strings.Contains(g, pkg) {
				keep = append(keep, g)
				break
			}
		}
	}
	return strings.Join(keep, "\n\n"), len(keep)
}
