package rivermw

import (
	"cmp"
	"context"
	"runtime"
	"slices"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Setup is the middleware and the client configuration that belong together:
//
//	jt := rivermw.New()
//	config := jt.Config(&river.Config{
//		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}},
//		Workers:    workers,
//		Middleware: []rivertype.Middleware{jt.Throttle(lim, "vendor_call")}, // other kinds run unthrottled
//	})
//	client, err := river.NewClient(riverpgxv5.New(pool), config)
//
// Config gives River workers beyond each queue's MaxWorkers for the jobs that sleep in
// the middleware, and keeps the jobs that run to MaxWorkers. The middleware works on a
// client whose config did not go through Config too; its sleeping jobs then hold
// River's workers. Use one Setup per client.
type Setup struct {
	c  *config
	sh *shared
}

// New returns the Setup for one River client. New panics for a bad option.
func New(opts ...Option) *Setup {
	c := newConfig(opts)
	c.sh = &shared{}
	c.sh.Bound.Store(int64(cmp.Or(c.sleeping, runtime.NumCPU()))) // until Config says
	return &Setup{c: c, sh: c.sh}
}

// Config returns a copy of cfg with what the Setup's middleware needs from the
// client:
//
//   - Queues: each queue's MaxWorkers (n) plus MaxSleepingWorkers, the workers jobs
//     sleep in; every job of the queue runs its worker within n, in arrival order;
//   - Plugins: cfg's, after one of the Setup's that gives each job its place among the
//     n (worker middleware and a WorkBegin hook).
//
// Nothing else: the fetch and poll intervals stay yours. Config panics when cfg is nil
// or when it is called a second time (one Setup per client).
func (s *Setup) Config(cfg *river.Config) *river.Config {
	if cfg == nil {
		panic(nilArgument("Config"))
	}
	out := *cfg
	bound := s.c.sleeping
	if bound == 0 {
		bound = 1
		for _, q := range cfg.Queues {
			bound = max(bound, q.MaxWorkers)
		}
	}
	lanes := make(map[string]*lane, len(cfg.Queues))
	out.Queues = make(map[string]river.QueueConfig, len(cfg.Queues))
	for name, q := range cfg.Queues {
		if q.MaxWorkers >= 1 { // else River refuses the config
			poll := cmp.Or(q.FetchPollInterval, cfg.FetchPollInterval, river.FetchPollIntervalDefault)
			lanes[name] = &lane{gate: make(chan struct{}, q.MaxWorkers), interval: poll + max(poll/10, 10*time.Millisecond)}
			q.MaxWorkers = min(q.MaxWorkers+bound, river.QueueNumWorkersMax)
		}
		out.Queues[name] = q
	}
	if !s.sh.lanes.CompareAndSwap(nil, &lanes) {
		panic("rivermw: Setup.Config called twice: use one Setup per River client")
	}
	s.sh.Bound.Store(int64(bound))
	out.Plugins = append([]rivertype.Plugin{newGatePlugin(s.sh)}, cfg.Plugins...)
	return &out
}

// Middleware is River worker middleware made by a Setup: give it to river.Config's
// Middleware (or Plugins), or return it from a worker's Middleware method.
type Middleware struct {
	river.MiddlewareDefaults
	work func(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error
}

// Work implements rivertype.WorkerMiddleware.
func (m *Middleware) Work(ctx context.Context, job *rivertype.JobRow, doInner func(context.Context) error) error {
	return m.work(ctx, job, doInner)
}

var _ rivertype.WorkerMiddleware = (*Middleware)(nil)

// Throttle returns middleware that takes a permit from lim before each job of the
// given kinds runs (every job it sees, without kinds), so that those jobs, on every
// client sharing lim's Redis and key, stay inside lim's limits, first come first
// served. Jobs of other kinds run at once. A job whose permit is due within about a
// second and a half sleeps for it; a later one books it and is snoozed until just
// before it, then sleeps the rest and runs (see ThrottledError). Redis unreachable
// snoozes a job; other errors of lim fail it. Throttle panics for a nil lim.
func (s *Setup) Throttle(lim *throttle.Limiter, kinds ...string) *Middleware {
	if lim == nil {
		panic(nilArgument("Throttle"))
	}
	kinds = slices.Clone(kinds)
	return s.ThrottleFunc(func(_ context.Context, job *rivertype.JobRow) (*throttle.Limiter, error) {
		if len(kinds) == 0 || slices.Contains(kinds, job.Kind) {
			return lim, nil
		}
		return nil, nil
	})
}

// ThrottleFunc is Throttle with the limiter chosen per job by pick, from its kind, its
// args (job.EncodedArgs) or its metadata: per kind, per tenant. A nil limiter and no
// error lets the job run at once; an error fails it. pick runs before every job: build
// limiters once and look them up, or build one per job (those built alike share their
// key's state). ThrottleFunc panics for a nil pick.
func (s *Setup) ThrottleFunc(pick func(ctx context.Context, job *rivertype.JobRow) (*throttle.Limiter, error)) *Middleware {
	if pick == nil {
		panic(nilArgument("ThrottleFunc"))
	}
	return s.c.throttleFunc(pick)
}

// Concurrency returns middleware that runs each job it sees under a lease of sem, so
// that at most sem's Max of them run at once on every client sharing sem's Redis and
// key. A job that finds sem full waits for a slot in arrival order, asleep for up to
// about a second and a half, else snoozed keeping its place in the queue. The lease is
// renewed while the worker runs; if it is lost, the worker's context is cancelled.
// Concurrency panics for a nil sem.
func (s *Setup) Concurrency(sem *throttle.Semaphore) *Middleware {
	if sem == nil {
		panic(nilArgument("Concurrency"))
	}
	return s.c.concurrency(sem)
}

// Stats is what a Setup's middlewares have done since it was made.
type Stats struct {
	// Sleeping is the number of jobs asleep in the middleware now, PeakSleeping the
	// most at any moment, and SleepBound the bound on them (MaxSleepingWorkers).
	Sleeping, PeakSleeping, SleepBound int
	// Snoozed counts snoozes, Kept the returns that found their booking, and Bounced
	// the returns snoozed again, booked, without a Redis call (back before their slot
	// while MaxSleepingWorkers jobs slept).
	Snoozed, Kept, Bounced int64
	// ComeBackEarly is how long before its slot a snoozed job is made due now, for
	// the queue of the longest FetchPollInterval: that interval, its jitter and 20ms,
	// more on a client whose returns came late.
	ComeBackEarly time.Duration
}

// Stats returns what the Setup's middlewares have done so far.
func (s *Setup) Stats() Stats {
	interval := time.Duration(0)
	if m := s.sh.lanes.Load(); m != nil {
		for _, l := range *m {
			interval = max(interval, l.interval)
		}
	}
	if interval == 0 {
		interval = defaultInterval
	}
	return Stats{
		Sleeping:      s.sh.Sleeping(),
		PeakSleeping:  s.sh.Peak(),
		SleepBound:    int(s.sh.Bound.Load()),
		Snoozed:       s.sh.snoozed.Load(),
		Kept:          s.sh.kept.Load(),
		Bounced:       s.sh.bounced.Load(),
		ComeBackEarly: s.sh.cb.Early(interval),
	}
}
