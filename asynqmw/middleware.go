package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Throttle returns middleware that takes one permit from lim before each task runs,
// so every task it wraps, in every worker process that shares lim's Redis and key,
// stays inside lim's limits. Add it with (*asynq.ServeMux).Use, and set
// Config.IsFailure to IsFailure and Config.RetryDelayFunc to RetryDelay(nil) (see
// the package example):
//
//   - The middleware books the permit with lim.Reserve, allowing the wait that
//     MaxInlineWait permits. If the permit comes within it, the task sleeps in the
//     handler until then and runs: booked in arrival order across the fleet, at one
//     Redis call per task.
//   - If the wait is longer, nothing is booked and the task is handed back to asynq
//     with a *ThrottledError: IsFailure reports it is no failure, so asynq neither
//     counts a retry nor records a failed task, and RetryDelay has it come back after
//     RetryIn (rounded up to whole seconds, plus jitter).
//   - asynq v0.26 archives a task whose retries are used up before it asks IsFailure
//     (processor.handleFailedMessage checks Retried >= MaxRetry first), so a task on
//     its last attempt (MaxRetry(0), or real failures used its retries), read from
//     asynq.GetRetryCount and asynq.GetMaxRetry, is never handed back that way.
//     It sleeps in the handler instead, as long as its deadline allows (see
//     HandlerTime): it keeps its ID and runs once, at the cost of holding a worker
//     slot while it sleeps. If even its deadline comes too soon, it is requeued as a
//     copy when the Requeue option is set; without Requeue, and only then, asynq
//     archives it with the *ThrottledError, as it archives any error on a last
//     attempt.
//
// A task whose sleep is cut short keeps nothing booked: if its context ends (asynq
// cancels it, or the server shuts down and asynq puts the task back in its queue),
// the permit is given back and the middleware returns ctx.Err(). If this process
// pauses lim meanwhile (waiter.NewTransport does on a 429), the task books again.
//
// Errors from lim (bad configuration, Redis unreachable) are returned wrapped: they
// are failures, and asynq retries or archives the task as for any handler error. A
// nil lim makes every task fail with an error wrapping ErrNilArgument.
//
// Precision: a handed-back task comes back when asynq's forwarder, which runs every
// Config.DelayedTaskCheckInterval (5 s by default), finds it due; asynq stores the
// time in whole seconds. Set DelayedTaskCheckInterval to a second or less where
// throttled tasks should come back promptly, and MaxInlineWait above it.
// Handed-back tasks hold no booking, so they are not served in arrival order; tasks
// that sleep in the handler are.
func Throttle(lim *throttle.Limiter, opts ...Option) asynq.MiddlewareFunc {
	c := newConfig(opts)
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			if lim == nil {
				return fmt.Errorf("%w: Throttle(nil)", ErrNilArgument)
			}
			if err := c.throttle(ctx, t, lim); err != nil {
				return err
			}
			return next.ProcessTask(ctx, t)
		})
	}
}

// ThrottleFunc is Throttle with the limiter chosen per task by pick: per tenant from
// the payload, per task type, or both. pick runs before every task, so it should be
// cheap: build limiters once and look them up (a Limiter holds no state, so building
// one per tenant on demand is fine too). When pick returns a nil limiter and no
// error, the task is not limited and runs at once.
//
// An error from pick is a failure: the task does not run and the middleware returns
// the error wrapped, so asynq retries or archives the task as for any handler error.
// A nil pick makes every task fail with an error wrapping ErrNilArgument.
func ThrottleFunc(pick func(ctx context.Context, t *asynq.Task) (*throttle.Limiter, error), opts ...Option) asynq.MiddlewareFunc {
	c := newConfig(opts)
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			if pick == nil {
				return fmt.Errorf("%w: ThrottleFunc(nil)", ErrNilArgument)
			}
			lim, err := pick(ctx, t)
			if err != nil {
				return fmt.Errorf("asynqmw: choosing the limiter for task %q: %w", t.Type(), err)
			}
			if lim != nil {
				if err := c.throttle(ctx, t, lim); err != nil {
					return err
				}
			}
			return next.ProcessTask(ctx, t)
		})
	}
}

// throttle gets t its permit from lim, sleeping for it within the attempt's budget;
// it returns nil when the task may run.
func (c *config) throttle(ctx context.Context, t *asynq.Task, lim *throttle.Limiter) error {
	for {
		a := c.attempt(ctx)
		res, err := lim.Reserve(ctx, 1, a.budget)
		if err != nil {
			return fmt.Errorf("asynqmw: task %q: %w", t.Type(), err)
		}
		if !res.OK() {
			return c.reject(ctx, t, a, &ThrottledError{
				RetryIn: res.Delay(),
				Key:     lim.Key(),
				Limit:   describe(lim.Limits()),
			})
		}
		start := time.Now()
		err = res.Wait(ctx)
		if errors.Is(err, waiter.ErrMoved) {
			continue // this process paused the key: book again after the pause
		}
		if err != nil {
			return err
		}
		c.waited(ctx, t, res.Delay(), start)
		return nil
	}
}

// attempt is what the middleware knows of a task's current attempt.
type attempt struct {
	// final reports whether the task's retries are used up: asynq archives it on any
	// error, so it must not be handed back with one.
	final bool
	// budget is the longest the task may sleep in the handler.
	budget time.Duration
}

// foreverWait is the budget of a last attempt without a deadline (asynq always sets one).
const foreverWait = time.Duration(math.MaxInt64)

// attempt reads the task's retry counters and deadline from ctx. Outside asynq (no
// counters in ctx) an attempt is not final: the caller gets the *ThrottledError.
func (c *config) attempt(ctx context.Context) attempt {
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	a := attempt{final: ok1 && ok2 && retried >= maxRetry, budget: c.maxInline}
	if a.final {
		a.budget = foreverWait
	}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		keep := c.handlerTime
		if keep <= 0 {
			keep = left / 2
		}
		a.budget = min(a.budget, max(left-keep, 0))
	}
	return a
}

// reject hands a task back: to asynq's retry with te, or, on a last attempt, as a
// requeued copy when Requeue is set (without it asynq archives the task with te).
func (c *config) reject(ctx context.Context, t *asynq.Task, a attempt, te *ThrottledError) error {
	var err error = te
	if a.final && c.requeue != nil {
		err = c.requeue.requeue(ctx, t, te)
	}
	if c.hooks.Throttled != nil && IsThrottled(err) {
		c.hooks.Throttled(ctx, t, te)
	}
	return err
}

// waited reports a sleep in the handler to the Waited hook.
func (c *config) waited(ctx context.Context, t *asynq.Task, delay time.Duration, start time.Time) {
	if delay > 0 && c.hooks.Waited != nil {
		c.hooks.Waited(ctx, t, time.Since(start))
	}
}

// describe writes limits as "20 per 1s and 500 per 1h0m0s".
func describe(limits []throttle.Limit) string {
	s := make([]string, len(limits))
	for i, l := range limits {
		s[i] = l.String()
	}
	return strings.Join(s, " and ")
}
