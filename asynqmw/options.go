package asynqmw

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// DefaultMaxInlineWait is how long a task may sleep in its handler for a permit unless
// MaxInlineWait says otherwise: a second and a half. A task handed back to asynq comes
// back up to a second (asynq keeps retry times in whole seconds) plus the server's
// DelayedTaskCheckInterval and TaskCheckInterval (100ms each with Setup.Config)
// before its booked slot, and sleeps the rest; a wait shorter than that is served as
// exactly, and more cheaply, by sleeping at once. Longer sleeps would hold a worker
// that other tasks need: past it, the task books its slot and is handed back.
const DefaultMaxInlineWait = 1500 * time.Millisecond

// DefaultSleepingShare is the share of a server's workers that tasks sleeping in the
// middleware may hold at once, without Setup.Config, unless MaxSleepingWorkers says
// otherwise: half (at least one), so that at least half of them stay free for every
// other task. Tasks come back for their slots in whole-second batches (asynq's
// precision), so a limit of r per second needs about r sleeping workers across the
// fleet at a slot, and up to 2r where one second's batch comes back while the one
// before still sleeps; fewer make tasks bounce.
//
// With Setup.Config the sleeping tasks do not take the server's workers but extra
// goroutines, and the default bound is the server's Concurrency itself (see
// Setup.Config).
const DefaultSleepingShare = 0.5

// DefaultCheckInterval is the DelayedTaskCheckInterval and TaskCheckInterval
// Setup.Config puts in an asynq.Config that leaves them unset: asynq's forwarder then
// moves a handed-back task to its queue, and an idle server looks for it, within
// 100ms; the cost is a cheap script call per queue ten times a second.
const DefaultCheckInterval = 100 * time.Millisecond

// asynqReturnLatency is how late asynq's defaults may be to bring a due task to a
// worker: DelayedTaskCheckInterval (5 s) plus TaskCheckInterval (1 s). The middleware
// assumes it when it is not told (CheckInterval, Setup.Config).
const asynqReturnLatency = 6 * time.Second

// Option configures the middleware; pass options to Throttle, ThrottleFunc,
// Concurrency, New or a Setup's methods.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is what the options set; defaults live in newConfig.
type config struct {
	maxInline   time.Duration
	handlerTime time.Duration // 0: half the time left before the deadline
	interval    time.Duration // CheckInterval; 0: unset
	sleeping    int           // MaxSleepingWorkers; -1: unset
	requeue     *requeuer
	hooks       Hooks
	logger      asynq.Logger
	err         error   // the first bad option
	sh          *shared // a Setup's (sharedWith); nil: the middleware's own
}

func newConfig(opts []Option) *config {
	c := &config{maxInline: DefaultMaxInlineWait, sleeping: -1}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	if c.err != nil {
		panic(c.err)
	}
	if c.sh == nil {
		c.sh = newShared(c.logger)
	}
	sh := c.sh
	if c.logger != nil {
		sh.setLogger(c.logger)
	}
	if c.sleeping >= 0 {
		sh.bound.Store(int64(c.sleeping))
	}
	if c.interval > 0 {
		sh.interval.Store(int64(c.interval))
	}
	return c
}

// sharedWith makes the middleware share sh, a Setup's, with the Setup's other
// middlewares.
func sharedWith(sh *shared) Option {
	return optionFunc(func(c *config) { c.sh = sh })
}

// bad records the first bad option; the constructor panics with it.
func (c *config) bad(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("%w: "+format, append([]any{ErrInvalidOption}, args...)...)
	}
}

// MaxInlineWait sets how long a task may sleep in its handler for its permit (or
// semaphore slot) before running; a task that would wait longer books its slot and is
// handed back to asynq (see Throttle). If unset, the default is DefaultMaxInlineWait
// (1.5 s); zero means never sleep: run now or hand back. A negative d is refused: the
// middleware's constructor panics with an error wrapping ErrInvalidOption.
//
// A task that comes back for its booking may sleep longer than d when asynq's
// precision demands it: up to a second plus how early it was made due (the check
// intervals and 20ms, more on a server whose returns have come late: Stats.ComeBackEarly).
func MaxInlineWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.bad("MaxInlineWait(%v): negative", d)
		}
		c.maxInline = d
	})
}

// MaxSleepingWorkers bounds how many tasks may sleep in the middleware at once (for a
// permit or a semaphore slot), across every middleware that shares it (those of one
// Setup, or one Throttle, ThrottleFunc or Concurrency): a task that would sleep while
// n others do is handed back, booked, instead. If unset, the bound is
// the server's Concurrency with Setup.Config (which reads it), and without it
// DefaultSleepingShare of runtime.NumCPU() (asynq's default), at least 1. n below 1
// is refused (the
// constructor panics, ErrInvalidOption): booked tasks come back early by up to about
// a second and must sleep the rest somewhere.
//
// With Setup.Config the sleeping tasks take n worker goroutines added to the server's
// Concurrency, not the workers other tasks run in (see Setup.Config); without it they
// take the server's workers.
func MaxSleepingWorkers(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.bad("MaxSleepingWorkers(%d): below 1", n)
		}
		c.sleeping = n
	})
}

// CheckInterval tells the middleware how late the server may bring a due task to a
// worker: its Config.DelayedTaskCheckInterval plus TaskCheckInterval (asynq's
// defaults, 5 s + 1 s, if unset; Setup.Config sets it for you), so that a handed-back
// task is made due early enough to be in a worker by its booked slot. A value below
// 1ms is refused (the constructor panics, ErrInvalidOption).
func CheckInterval(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < time.Millisecond {
			c.bad("CheckInterval(%v): below 1ms", d)
		}
		c.interval = d
	})
}

// WithLogger sets where the middleware reports a setup that cannot work (a throttled
// task that came back counted as a retry, a last attempt without Requeue), once
// each, at warn level. Setup.Config sets the server's Config.Logger; if neither is
// set, it writes to the standard library's log.
func WithLogger(l asynq.Logger) Option {
	return optionFunc(func(c *config) { c.logger = l })
}

// HandlerTime sets how much of the time before a task's deadline the handler needs:
// a task never sleeps for its permit into the last d before its deadline (its
// context's deadline: asynq's Timeout or Deadline, 30 minutes by default). If unset
// or zero, a task sleeps at most half the time left when the middleware starts. A
// negative d is refused (the constructor panics, ErrInvalidOption).
func HandlerTime(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.bad("HandlerTime(%v): negative", d)
		}
		c.handlerTime = d
	})
}

// Hooks are callbacks the middleware calls after its decisions, to count or log them.
// Any of them may be nil. They run on the task's goroutine and must not block; they
// must be safe for simultaneous use.
type Hooks struct {
	// Waited is called when a task slept in the handler for its permit or slot, with
	// the time it slept, just before the handler runs.
	Waited func(ctx context.Context, t *asynq.Task, slept time.Duration)

	// Throttled is called when a task is handed back without running, with the error
	// the middleware returns to asynq (Requeued is set when it was requeued as a copy).
	Throttled func(ctx context.Context, t *asynq.Task, err *ThrottledError)

	// Started is called when a task limited by Throttle or ThrottleFunc goes on to its
	// handler, with the time the middleware counted as its start (this process's
	// monotonic clock): the time whose spacing Throttle bounds (see Throttle). The
	// handler runs as soon as Started returns.
	Started func(ctx context.Context, t *asynq.Task, at time.Time)
}

// WithHooks sets callbacks the middleware calls after its decisions (see Hooks).
func WithHooks(h Hooks) Option {
	return optionFunc(func(c *config) { c.hooks = h })
}
