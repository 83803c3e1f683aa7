package asynqmw

import (
	"context"
	"runtime"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Setup is the middleware and the server configuration that belong together, built
// once from the asynq server's Redis client:
//
//	jt := asynqmw.New(rdb)
//	srv := asynq.NewServerFromRedisClient(rdb, jt.Config(asynq.Config{Concurrency: 10}))
//	mux := asynq.NewServeMux()
//	mux.Use(jt.Throttle(lim))
//
// Config fills in what the middleware needs from asynq (IsFailure, RetryDelayFunc,
// ErrorHandler, DelayedTaskCheckInterval, see Config); the middlewares (Throttle,
// ThrottleFunc, Concurrency) requeue last attempts with their booking (Requeue),
// and share one bound on the tasks asleep in them (MaxSleepingWorkers, by default the server's
// Concurrency). Sleeping tasks do not take the server's workers: Config gives asynq
// that many more goroutines, and the middlewares let no more than Concurrency tasks
// run at once. If a Setup's middleware runs on a server whose Config did not go
// through Config, it says so once, at warn level, through the logger.
//
// Install the Setup's middlewares for every handler (mux.Use), as above: a handler
// they do not wrap is not counted among the Concurrency tasks that run.
//
// A Setup is safe for simultaneous use by multiple goroutines.
type Setup struct {
	rdb  redis.UniversalClient
	opts []Option
	sh   *shared
}

// New returns the Setup for an asynq server that uses rdb (the client given to
// asynq.NewServerFromRedisClient, or one to the same Redis). opts apply to every
// middleware of the Setup, before the options given to each.
//
// New panics with an error wrapping ErrNilArgument when rdb is nil, and with one
// wrapping ErrInvalidOption for a bad option.
func New(rdb redis.UniversalClient, opts ...Option) *Setup {
	if rdb == nil {
		panic(nilArgument("New"))
	}
	s := &Setup{rdb: rdb, sh: newShared(nil)}
	s.sh.setup = true
	s.opts = append([]Option{Requeue(rdb)}, opts...)
	newConfig(s.with(nil)) // check the options now
	return s
}

// Config returns cfg with what the Setup's middleware needs from the server:
//
//   - IsFailure: IsFailure, and cfg's own predicate if it has one (a throttled task
//     is never a failure; for other errors both must agree);
//
//   - RetryDelayFunc: RetryDelay(cfg.RetryDelayFunc);
//
//   - ErrorHandler: SkipThrottled(cfg.ErrorHandler), so throttled tasks are not
//     reported as errors;
//
//   - DelayedTaskCheckInterval and TaskCheckInterval: DefaultCheckInterval (100ms)
//     each, where cfg leaves them unset, so a handed-back task comes back at most
//     about 1.2 s before its slot and sleeps the rest.
//
//   - Concurrency: cfg's (asynq's default, runtime.NumCPU(), if unset) plus the
//     Setup's MaxSleepingWorkers bound. asynq keeps a task in a worker goroutine
//     while the middleware sleeps for its permit; those goroutines are the extra
//     ones. The Setup's middlewares let at most cfg's Concurrency tasks past them at
//     once (in arrival order; a task waiting for its permit or a semaphore slot is not
//     among them), so the handlers still run at most cfg.Concurrency at a time and a
//     throttled backlog asleep for its slots leaves every one of them to other work.
//
// It also tells the middleware the server's DelayedTaskCheckInterval and, unless
// WithLogger was given, its Logger. Use one Setup per server.
func (s *Setup) Config(cfg asynq.Config) asynq.Config {
	own := cfg.IsFailure
	cfg.IsFailure = IsFailure
	if own != nil {
		cfg.IsFailure = func(err error) bool { return IsFailure(err) && own(err) }
	}
	cfg.RetryDelayFunc = RetryDelay(cfg.RetryDelayFunc)
	cfg.ErrorHandler = SkipThrottled(cfg.ErrorHandler)
	if cfg.DelayedTaskCheckInterval <= 0 {
		cfg.DelayedTaskCheckInterval = DefaultCheckInterval
	}
	if cfg.TaskCheckInterval <= 0 {
		cfg.TaskCheckInterval = DefaultCheckInterval
	}
	s.sh.interval.Store(int64(cfg.DelayedTaskCheckInterval + cfg.TaskCheckInterval))
	workers := cfg.Concurrency
	if workers <= 0 {
		workers = runtime.NumCPU() // asynq's default
	}
	if !s.sleepingSet() {
		s.sh.bound.Store(int64(workers)) // goroutines of their own: as many as the workers
	}
	g := make(gate, workers)
	s.sh.gate.Store(&g)
	cfg.Concurrency = workers + int(s.sh.bound.Load())
	if cfg.Logger != nil && s.sh.logger.Load() == nil {
		s.sh.setLogger(cfg.Logger)
	}
	s.sh.configured.Store(true)
	return cfg
}

// sleepingSet reports whether MaxSleepingWorkers is among the Setup's options.
func (s *Setup) sleepingSet() bool {
	c := &config{sleeping: -1}
	for _, o := range s.opts {
		if o != nil {
			o.apply(c)
		}
	}
	return c.sleeping >= 0
}

// Throttle is Throttle(lim, opts...) with the Setup's options and shared bound.
func (s *Setup) Throttle(lim *throttle.Limiter, opts ...Option) asynq.MiddlewareFunc {
	return Throttle(lim, s.with(opts)...)
}

// ThrottleFunc is ThrottleFunc(pick, opts...) with the Setup's options and shared
// bound.
func (s *Setup) ThrottleFunc(pick func(ctx context.Context, t *asynq.Task) (*throttle.Limiter, error), opts ...Option) asynq.MiddlewareFunc {
	return ThrottleFunc(pick, s.with(opts)...)
}

// Concurrency is Concurrency(sem, opts...) with the Setup's options and shared bound.
func (s *Setup) Concurrency(sem *throttle.Semaphore, opts ...Option) asynq.MiddlewareFunc {
	return Concurrency(sem, s.with(opts)...)
}

// with returns the Setup's options, then opts, then the one that shares the Setup's
// state.
func (s *Setup) with(opts []Option) []Option {
	return append(append(append([]Option(nil), s.opts...), opts...), sharedWith(s.sh))
}

// Stats is what the middlewares of a Setup have done since it was made.
type Stats struct {
	// Sleeping is the number of tasks asleep in the middleware now, PeakSleeping the
	// most at any moment, and SleepBound the bound on them (MaxSleepingWorkers).
	Sleeping, PeakSleeping, SleepBound int
	// HandedBack counts hand-backs (to asynq's retry or as a requeued copy), Kept the
	// returns that found their booking, and Bounced the returns handed back again,
	// booked, without a Redis call: they came back before their slot while
	// MaxSleepingWorkers tasks slept (or too early to sleep), and the middleware knew
	// their slot from handing them back.
	HandedBack, Kept, Bounced int64
	// CountedAsRetry counts handed-back tasks that came back with their retry count
	// raised: the server's Config lacks IsFailure (see Setup).
	CountedAsRetry int
	// CheckInterval is how late the middleware expects the server to bring a due
	// task to a worker (see CheckInterval).
	CheckInterval time.Duration
	// ComeBackEarly is how long before its slot a handed-back task is made due now:
	// CheckInterval and 20ms, or more on a server whose returns have come late (see
	// Throttle).
	ComeBackEarly time.Duration
}

// Stats returns what the Setup's middlewares have done so far.
func (s *Setup) Stats() Stats {
	s.sh.mu.Lock()
	retried := s.sh.retried
	s.sh.mu.Unlock()
	return Stats{
		Sleeping:       int(s.sh.sleeping.Load()),
		PeakSleeping:   int(s.sh.peak.Load()),
		SleepBound:     int(s.sh.bound.Load()),
		HandedBack:     s.sh.handed.Load(),
		Kept:           s.sh.kept.Load(),
		Bounced:        s.sh.bounced.Load(),
		CountedAsRetry: retried,
		CheckInterval:  s.sh.checkInterval(),
		ComeBackEarly:  s.sh.cb.early(s.sh.checkInterval()),
	}
}
