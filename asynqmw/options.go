package asynqmw

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
)

// Option configures a Setup (see New).
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// MaxSleepingWorkers bounds how many of a server's workers tasks may sleep in at once
// in the Setup's middlewares, for a permit or a semaphore slot: a task that would sleep
// while n others do is handed back, booked. If unset, n is half the server's
// Concurrency (at least 1), so that a throttled backlog leaves the other half to other
// task types. Handed-back tasks come back in whole-second batches and sleep up to
// about a second each, so a limit of more than about n tasks a second on one server
// needs a larger n, and a larger Concurrency to keep room for the rest. New panics for
// n below 1.
func MaxSleepingWorkers(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.bad("MaxSleepingWorkers(%d): below 1", n)
		}
		c.sleeping = n
	})
}

// Hooks are callbacks the middleware calls after its decisions, to count or log them.
// Any of them may be nil. They run on the task's goroutine and must not block; they
// must be safe for simultaneous use.
type Hooks struct {
	// Waited is called when a task slept in the middleware for its permit or slot,
	// with the time it slept, just before the handler runs.
	Waited func(ctx context.Context, t *asynq.Task, slept time.Duration)

	// Throttled is called when a task is handed back without running, with the
	// error that says why and when it comes back.
	Throttled func(ctx context.Context, t *asynq.Task, err *ThrottledError)

	// Started is called when a task limited by Throttle or ThrottleFunc goes on to
	// its handler, with the time the middleware counted as its start (this process's
	// monotonic clock): in each process, these starts never exceed a limit in any
	// window of its period. The handler runs as soon as Started returns.
	Started func(ctx context.Context, t *asynq.Task, at time.Time)
}

// WithHooks sets callbacks the middleware calls after its decisions (see Hooks).
func WithHooks(h Hooks) Option {
	return optionFunc(func(c *config) { c.hooks = h })
}

const (
	// maxInline is how long a task may sleep in the middleware for a new booking or a
	// semaphore slot: a task handed back comes back up to a second (asynq keeps retry
	// times in whole seconds) plus the check intervals before its slot and sleeps the
	// rest, so a shorter wait is served as exactly, and more cheaply, by sleeping now.
	maxInline = 1500 * time.Millisecond

	// checkInterval is the DelayedTaskCheckInterval and TaskCheckInterval Config
	// puts in an asynq.Config that leaves them unset.
	checkInterval = 100 * time.Millisecond
)

// config is what the options set; defaults live in newConfig.
type config struct {
	maxInline   time.Duration
	handlerTime time.Duration // 0: half the time left before the deadline
	sleeping    int           // MaxSleepingWorkers; 0: unset
	hooks       Hooks
	requeue     *requeuer
	err         error // the first bad option
	sh          *shared
}

func newConfig(opts []Option) *config {
	c := &config{maxInline: maxInline}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	if c.err != nil {
		panic(c.err)
	}
	return c
}

// bad records the first bad option; New panics with it.
func (c *config) bad(format string, args ...any) {
	if c.err == nil {
		c.err = fmt.Errorf("asynqmw: invalid option: "+format, args...)
	}
}

// The options below are for the package's tests (export_test.go): a user has no
// need of them, the defaults being what the goals were measured with.

// inlineWait sets how long a task may sleep for a new booking or a slot (maxInline);
// zero: never.
func inlineWait(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.bad("inline wait %v: negative", d)
		}
		c.maxInline = d
	})
}

// handlerTime sets how much of the time before a task's deadline the handler needs:
// a task never sleeps into the last d before it. Unset or zero: half the time left.
func handlerTime(d time.Duration) Option {
	return optionFunc(func(c *config) {
		if d < 0 {
			c.bad("handler time %v: negative", d)
		}
		c.handlerTime = d
	})
}
