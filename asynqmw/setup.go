package asynqmw

import (
	"cmp"
	"context"
	"runtime"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Setup is the middleware and the server configuration that belong together:
//
//	jt := asynqmw.New(rdb)
//	srv := asynq.NewServerFromRedisClient(rdb, jt.Config(asynq.Config{Concurrency: 10}))
//	mux.Use(jt.ThrottleFunc(pick)) // pick: the limiter of t.Type(), nil for types not limited
//
// The middleware may also wrap the one handler it limits. Either way the server runs
// at most Concurrency handlers at once: a task asleep in the middleware for its permit
// sleeps in its own worker, and MaxSleepingWorkers bounds how many do. On a server
// whose Config did not go through Config, the middleware never hands a task back: it
// sleeps until its permit, and says so once. Use one Setup per server.
type Setup struct {
	c  *config
	sh *shared
}

// New returns the Setup for an asynq server that uses rdb (the client given to
// asynq.NewServerFromRedisClient, or one to the same Redis): the middleware enqueues
// the copies of last attempts through it. New panics for a nil rdb or a bad option.
func New(rdb redis.UniversalClient, opts ...Option) *Setup {
	if rdb == nil {
		panic(nilArgument("New"))
	}
	c := newConfig(opts)
	c.sh = newShared()
	c.sh.Bound.Store(int64(cmp.Or(c.sleeping, sleepBound(0)))) // until Config says
	c.requeue = newRequeuer(rdb)
	return &Setup{c: c, sh: c.sh}
}

// Config returns cfg with what the Setup's middleware needs from the server:
//
//   - IsFailure: false for a throttled task (and cfg's answer for other errors), so
//     a hand-back spends no retry and counts as neither processed nor failed;
//   - RetryDelayFunc: for a throttled task, the delay that has it back in a worker
//     just before its booked slot; cfg's (or asynq's default) for other errors;
//   - ErrorHandler: cfg's, not called for throttled tasks;
//   - DelayedTaskCheckInterval, TaskCheckInterval: 100ms each where cfg leaves them unset;
//   - BaseContext: cfg's, marked so the middleware knows its server was configured.
//
// Concurrency stays cfg's: it reads it (runtime.NumCPU() if unset, as asynq) for the
// default of MaxSleepingWorkers, half of it.
func (s *Setup) Config(cfg asynq.Config) asynq.Config {
	own := cfg.IsFailure
	cfg.IsFailure = isFailure
	if own != nil {
		cfg.IsFailure = func(err error) bool { return isFailure(err) && own(err) }
	}
	cfg.RetryDelayFunc = retryDelayFunc(cfg.RetryDelayFunc)
	cfg.ErrorHandler = skipThrottled(cfg.ErrorHandler)
	if cfg.DelayedTaskCheckInterval <= 0 {
		cfg.DelayedTaskCheckInterval = checkInterval
	}
	if cfg.TaskCheckInterval <= 0 {
		cfg.TaskCheckInterval = checkInterval
	}
	s.sh.interval.Store(int64(cfg.DelayedTaskCheckInterval + cfg.TaskCheckInterval))
	if s.c.sleeping == 0 {
		s.sh.Bound.Store(int64(sleepBound(cfg.Concurrency)))
	}
	if cfg.Logger != nil {
		s.sh.setLogger(cfg.Logger)
	}
	base := cfg.BaseContext
	if base == nil {
		base = context.Background
	}
	sh := s.sh
	cfg.BaseContext = func() context.Context { return context.WithValue(base(), serverKey{}, sh) }
	return cfg
}

// sleepBound is the default of MaxSleepingWorkers on a server of the given
// Concurrency (runtime.NumCPU() if not positive, as asynq): half of it, at least 1.
func sleepBound(concurrency int) int {
	if concurrency <= 0 {
		concurrency = runtime.NumCPU()
	}
	return max(concurrency/2, 1)
}

// Throttle returns middleware that takes a permit from lim before each task runs, so
// the tasks it wraps, on every server sharing lim's Redis and key, stay inside lim's
// limits, first come first served. A task whose permit is due within about a second
// and a half sleeps for it in its worker; a later one books it and is handed back to
// asynq until just before it, then sleeps the rest and runs (see ThrottledError). A
// task on its last attempt never sleeps: it is handed back as a copy that may. Redis
// unavailable (throttle.ErrUnavailable) hands a task back; other errors of lim fail
// it. Throttle panics for a nil lim.
func (s *Setup) Throttle(lim *throttle.Limiter) asynq.MiddlewareFunc {
	if lim == nil {
		panic(nilArgument("Throttle"))
	}
	return s.ThrottleFunc(func(context.Context, *asynq.Task) (*throttle.Limiter, error) { return lim, nil })
}

// ThrottleFunc is Throttle with the limiter chosen per task by pick (per type, per
// tenant): a nil limiter and no error lets the task run at once; an error fails it.
// pick runs before every task: build limiters once and look them up, or build one per
// task (those built alike share their key's state). ThrottleFunc panics for a nil pick.
func (s *Setup) ThrottleFunc(pick func(ctx context.Context, t *asynq.Task) (*throttle.Limiter, error)) asynq.MiddlewareFunc {
	if pick == nil {
		panic(nilArgument("ThrottleFunc"))
	}
	return s.c.throttleFunc(pick)
}

// Concurrency returns middleware that runs each task it wraps under a lease of sem,
// so that at most sem's Max of them run at once on every server sharing sem's Redis
// and key. A task that finds sem full waits for a slot in arrival order, asleep in its
// worker for up to about a second and a half (a last attempt not at all), else handed
// back keeping its place in the queue.
// The lease is renewed while the handler runs; if it is lost, the handler's context
// is cancelled. Concurrency panics for a nil sem.
func (s *Setup) Concurrency(sem *throttle.Semaphore) asynq.MiddlewareFunc {
	if sem == nil {
		panic(nilArgument("Concurrency"))
	}
	return s.c.concurrency(sem)
}

// Stats is what a Setup's middlewares have done since it was made.
type Stats struct {
	// Sleeping is the number of tasks asleep in the middleware now, PeakSleeping the
	// most at any moment, and SleepBound the bound on them (MaxSleepingWorkers).
	Sleeping, PeakSleeping, SleepBound int
	// HandedBack counts hand-backs, Requeued those of them that were last attempts
	// handed back as copies, Kept the returns that found their booking, and Bounced
	// the returns handed back again, booked, without a Redis call (back before their
	// slot while MaxSleepingWorkers tasks slept).
	HandedBack, Requeued, Kept, Bounced int64
	// ComeBackEarly is how long before its slot a handed-back task is made due now:
	// the server's check intervals and 20ms, more on a server whose returns came late.
	ComeBackEarly time.Duration
}

// Stats returns what the Setup's middlewares have done so far.
func (s *Setup) Stats() Stats {
	return Stats{
		Sleeping:      s.sh.Sleeping(),
		PeakSleeping:  s.sh.Peak(),
		SleepBound:    int(s.sh.Bound.Load()),
		HandedBack:    s.sh.handed.Load(),
		Requeued:      s.sh.requeued.Load(),
		Kept:          s.sh.kept.Load(),
		Bounced:       s.sh.bounced.Load(),
		ComeBackEarly: s.sh.cb.Early(s.sh.checkInterval()),
	}
}
