package asynqmw

import (
	"context"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// DefaultMaxInlineWait is how long a task may sleep in its handler for a permit unless
// MaxInlineWait says otherwise. It matches asynq's default DelayedTaskCheckInterval:
// a task handed back to asynq comes back up to about a second (asynq keeps retry times
// in whole seconds) plus that interval later than asked, and costs a retry write, a
// forward and a dequeue; a wait shorter than that is served sooner and cheaper by
// sleeping. Longer sleeps would hold a worker slot idle that other tasks could use.
const DefaultMaxInlineWait = 5 * time.Second

// Option configures the middleware; pass options to Throttle, ThrottleFunc or
// Concurrency.
type Option interface {
	apply(*config)
}

type optionFunc func(*config)

func (f optionFunc) apply(c *config) { f(c) }

// config is what the options set; defaults live in newConfig.
type config struct {
	maxInline   time.Duration
	handlerTime time.Duration // 0: half the time left before the deadline
	requeue     *requeuer
	hold        redis.UniversalClient // WaitForRedis; nil: off
	hooks       Hooks
}

func newConfig(opts []Option) *config {
	c := &config{maxInline: DefaultMaxInlineWait}
	for _, o := range opts {
		if o != nil {
			o.apply(c)
		}
	}
	return c
}

// MaxInlineWait sets how long a task may sleep in its handler for its permit (or
// semaphore slot) before running; a task that would wait longer is handed back to
// asynq with a *ThrottledError, unless it is on its last attempt (see Throttle). If
// unset, the default is DefaultMaxInlineWait (5 s); zero or a negative value means
// never sleep: run now or hand back.
//
// Set it to at least a second plus your Config.DelayedTaskCheckInterval: a handed-back
// task may come back up to that much early or late (asynq keeps retry times in whole
// seconds and forwards them every DelayedTaskCheckInterval), and a task that comes
// back early then sleeps the rest in the handler instead of being handed back again.
func MaxInlineWait(d time.Duration) Option {
	return optionFunc(func(c *config) { c.maxInline = max(d, 0) })
}

// HandlerTime sets how much of the time before a task's deadline the handler needs:
// a task never sleeps for its permit into the last d before its deadline (its
// context's deadline: asynq's Timeout or Deadline, 30 minutes by default). If unset,
// zero or a negative value, a task sleeps at most half the time left when the
// middleware starts.
func HandlerTime(d time.Duration) Option {
	return optionFunc(func(c *config) { c.handlerTime = max(d, 0) })
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
}

// WithHooks sets callbacks the middleware calls after its decisions (see Hooks).
func WithHooks(h Hooks) Option {
	return optionFunc(func(c *config) { c.hooks = h })
}
