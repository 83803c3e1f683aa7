package asynqmw

import (
	"context"
	"log"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hibiken/asynq"
)

// shared is what the middlewares of one Setup (or one Throttle, ThrottleFunc or
// Concurrency without Setup) share: the bound on tasks asleep in them, the
// server's forwarding interval, the logger, and what they have noticed.
type shared struct {
	bound    atomic.Int64 // tasks that may sleep at once
	interval atomic.Int64 // how late the server may bring a due task: DelayedTaskCheckInterval + TaskCheckInterval, ns
	sleeping atomic.Int64
	peak     atomic.Int64
	handed   atomic.Int64 // hand-backs
	kept     atomic.Int64 // returns that found their booking
	bounced  atomic.Int64 // returns handed back again without a script call (see bounce)
	logger   atomic.Pointer[asynq.Logger]

	setup      bool        // made by New: Setup.Config must be applied
	configured atomic.Bool // Setup.Config was called
	gate       atomic.Pointer[gate]
	pacer      pacer
	cb         comeBack // how early to make handed-back tasks due

	mu      sync.Mutex
	back    map[string]int // task ID → retry count when handed back
	warned  map[string]bool
	retried int // hand-backs that came back counted as a retry
}

func newShared(l asynq.Logger) *shared {
	sh := &shared{back: map[string]int{}, warned: map[string]bool{}}
	sh.bound.Store(int64(sleepBound(runtime.NumCPU())))
	sh.interval.Store(int64(asynqReturnLatency))
	if l != nil {
		sh.setLogger(l)
	}
	return sh
}

// sleepBound is DefaultSleepingShare of workers, at least 1.
func sleepBound(workers int) int {
	return max(1, int(float64(workers)*DefaultSleepingShare))
}

func (sh *shared) setLogger(l asynq.Logger) { sh.logger.Store(&l) }

// trySleep takes a place among the tasks asleep in the middleware, if the bound
// leaves one; release gives it back.
func (sh *shared) trySleep() bool {
	for {
		n := sh.sleeping.Load()
		if n >= sh.bound.Load() {
			return false
		}
		if sh.sleeping.CompareAndSwap(n, n+1) {
			for p := sh.peak.Load(); n+1 > p && !sh.peak.CompareAndSwap(p, n+1); p = sh.peak.Load() {
			}
			return true
		}
	}
}

func (sh *shared) release() { sh.sleeping.Add(-1) }

// full reports whether as many tasks as the bound allows sleep now.
func (sh *shared) full() bool { return sh.sleeping.Load() >= sh.bound.Load() }

// sleepAnyway counts a task asleep past the bound (one that cannot be handed back).
func (sh *shared) sleepAnyway() {
	n := sh.sleeping.Add(1)
	for p := sh.peak.Load(); n > p && !sh.peak.CompareAndSwap(p, n); p = sh.peak.Load() {
	}
}

// warn logs msg at warn level once per kind, loudly: a setup that cannot work.
func (sh *shared) warn(kind, msg string) {
	sh.mu.Lock()
	seen := sh.warned[kind]
	sh.warned[kind] = true
	sh.mu.Unlock()
	if seen {
		return
	}
	if l := sh.logger.Load(); l != nil {
		(*l).Warn(msg)
		return
	}
	log.Print(msg)
}

// maxRemembered bounds the hand-backs remembered for noticing a half-applied setup.
const maxRemembered = 100000

// retryCount returns the ID and retry count of ctx's task; ok is false outside asynq.
func retryCount(ctx context.Context) (id string, retried int, ok bool) {
	id, ok1 := asynq.GetTaskID(ctx)
	retried, ok2 := asynq.GetRetryCount(ctx)
	return id, retried, ok1 && ok2
}

// handedBack remembers the retry count of a task handed back on the retry path.
func (sh *shared) handedBack(ctx context.Context) {
	id, retried, ok := retryCount(ctx)
	if !ok {
		return
	}
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if len(sh.back) >= maxRemembered {
		clear(sh.back)
	}
	sh.back[id] = retried
}

// returned checks a task that comes back: if asynq counted its hand-back as a retry,
// the server's Config lacks IsFailure, and the middleware says so. A Config built by
// Setup.Config has it, so there the count can only be asynq's recoverer's (a dequeue
// whose reply was lost as Redis died), and the middleware says nothing.
func (sh *shared) returned(ctx context.Context) {
	id, retried, ok := retryCount(ctx)
	if !ok {
		return
	}
	sh.mu.Lock()
	was, ok := sh.back[id]
	delete(sh.back, id)
	if ok && retried > was {
		sh.retried++
	}
	sh.mu.Unlock()
	if ok && retried > was && !sh.configured.Load() {
		sh.warn("retry", "asynqmw: MISCONFIGURED: a throttled task (id="+id+") came back counted as a retry: "+
			"the asynq.Config lacks IsFailure: asynqmw.IsFailure, so throttling spends retries and archives tasks. "+
			"Build the Config with asynqmw.New(rdb).Config(cfg).")
	}
	if sh.setup && !sh.configured.Load() {
		sh.warn("config", "asynqmw: MISCONFIGURED: the Setup's middleware runs, but Setup.Config was not applied to the "+
			"server's asynq.Config: throttled tasks will count as failures and come back at the wrong time. "+
			"Pass the Config through Setup.Config: asynq.NewServerFromRedisClient(rdb, jt.Config(cfg)).")
	}
}

// checkInterval returns how late the server may bring a due task to a worker.
func (sh *shared) checkInterval() time.Duration { return time.Duration(sh.interval.Load()) }

// gate lets at most the server's Concurrency (as the user gave it to Setup.Config)
// of its tasks run at once, awake: Setup.Config gives asynq MaxSleepingWorkers more
// workers than that, for the tasks asleep in the middleware. Waiting tasks get in in
// arrival order (a channel's senders queue first in, first out).
type gate chan struct{}

// runKey is the context key of a task's *runSlot.
type runKey struct{}

// runSlot is a task's place among those that run (held) or not; the task's own
// goroutine is its only user.
type runSlot struct {
	g    gate
	held bool
}

// enter returns ctx with the task's run slot, making one (not held) for a task the
// first of the Setup's middlewares sees, and the function the first must defer to
// give the slot back; nil without a gate.
func (sh *shared) enter(ctx context.Context) (context.Context, *runSlot, func()) {
	if rs, ok := ctx.Value(runKey{}).(*runSlot); ok {
		return ctx, rs, func() {}
	}
	g := sh.gate.Load()
	if g == nil {
		return ctx, nil, func() {}
	}
	rs := &runSlot{g: *g}
	return context.WithValue(ctx, runKey{}, rs), rs, rs.leave
}

// middleware returns the asynq middleware that runs step for each task, with the
// task's run slot and its handler: step gets the task past its limit, gives the slot
// up while it may sleep (leave), takes it back before the handler runs (take), and
// runs handle. The slot is given back when the task is done.
func (sh *shared) middleware(step func(ctx context.Context, t *asynq.Task, slot *runSlot, handle func(context.Context) error) error) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			ctx, slot, done := sh.enter(ctx)
			defer done()
			return step(ctx, t, slot, func(ctx context.Context) error { return next.ProcessTask(ctx, t) })
		})
	}
}

// leave gives the slot back, if held: the task sleeps, or is done.
func (rs *runSlot) leave() {
	if rs != nil && rs.held {
		<-rs.g
		rs.held = false
	}
}

// take gets the task a slot to run in, waiting for one if every one is taken; it
// returns ctx.Err() if ctx ends first.
func (rs *runSlot) take(ctx context.Context) error {
	if rs == nil || rs.held {
		return nil
	}
	select {
	case rs.g <- struct{}{}:
		rs.held = true
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
