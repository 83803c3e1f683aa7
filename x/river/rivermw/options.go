package rivermw

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river/rivertype"
)

// Option configures a Setup (see New).
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// MaxSleepingWorkers bounds how many jobs may sleep in the Setup's middlewares at
// once, for a permit or a semaphore slot, on the client: Config adds n workers to each
// of the client's queues for them. If unset, n is the largest MaxWorkers of the
// client's queues (on a client whose config did not go through Config, the number of
// CPUs). A job that would sleep while n others do is snoozed, booked. Raise it for a
// limit of more than about n jobs a second per client: snoozed jobs come back up to
// about a FetchPollInterval before their slots and sleep the rest. New panics for n
// below 1.
func MaxSleepingWorkers(n int) Option {
	return optionFunc(func(c *config) {
		if n < 1 {
			c.bad("MaxSleepingWorkers(%d): below 1", n)
		}
		c.sleeping = n
	})
}

// Hooks are callbacks the middleware calls after its decisions, to count or log them.
// Any of them may be nil. They run on the job's goroutine and must not block; they
// must be safe for simultaneous use.
type Hooks struct {
	// Waited is called when a job slept in the middleware for its permit or slot,
	// with the time it slept, just before the worker runs.
	Waited func(ctx context.Context, job *rivertype.JobRow, slept time.Duration)

	// Throttled is called when a job is snoozed without running, with the error that
	// says why and when it comes back.
	Throttled func(ctx context.Context, job *rivertype.JobRow, err *ThrottledError)

	// Started is called when a job limited by Throttle or ThrottleFunc goes on to its
	// worker, with the time the middleware counted as its start (this process's
	// monotonic clock): in each process, these starts never exceed a limit in any
	// window of its period. The worker runs as soon as Started returns.
	Started func(ctx context.Context, job *rivertype.JobRow, at time.Time)
}

// WithHooks sets callbacks the middleware calls after its decisions (see Hooks).
func WithHooks(h Hooks) Option {
	return optionFunc(func(c *config) { c.hooks = h })
}

// maxInline is the longest wait a job sleeps in the middleware for a new booking or a
// semaphore slot, unless a snoozed job would come back earlier than that before its
// slot anyway (see config.inlineLimit): River brings a snoozed job back at the first
// fetch after it is due, up to about a FetchPollInterval (a second by default) later,
// so a shorter wait is served as exactly, and more cheaply, by sleeping now.
const maxInline = 1500 * time.Millisecond

// config is what the options set; defaults live in newConfig.
type config struct {
	maxInline time.Duration
	sleeping  int // MaxSleepingWorkers; 0: unset
	hooks     Hooks
	err       error // the first bad option
	sh        *shared
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
		c.err = fmt.Errorf("rivermw: invalid option: "+format, args...)
	}
}

// inlineWait sets how long a job may sleep for a new booking or a slot (maxInline):
// for the package's tests, the default being what the goals were measured with.
func inlineWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxInline = d })
}
