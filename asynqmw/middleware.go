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
// When Redis is unavailable (lim returns throttle.ErrUnavailable: its default
// FailClosed policy), the task is treated as throttled, never as failed: the
// middleware tries again after 50ms, 100ms, ... up to a second apart for as long as
// the task may sleep (MaxInlineWait, or on a last attempt its deadline), and then
// hands it back as above with a *ThrottledError whose Err is the cause and RetryIn a
// second. (With FailOpen or FailLocal, lim grants by that policy instead.) Other
// errors from lim (bad configuration, a Redis user without permission, corrupt
// state) are returned wrapped: they are failures, and asynq retries or archives the
// task as for any handler error. A nil lim makes every task fail with an error
// wrapping ErrNilArgument.
//
// If Redis goes down while a task runs, asynq v0.26 may lose the write of its
// result and, a minute later, run it again or archive it; WaitForRedis prevents
// that by holding the result until Redis answers.
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
			err := next.ProcessTask(ctx, t)
			c.holdResult(ctx)
			return err
		})
	}
}

// ThrottleFunc is Throttle with the limiter chosen per task by pick: per tenant from
// the payload, per task type, or both. pick runs before every task, so it should be
// cheap: build limiters once and look them up, or build one per task (a Limiter is
// cheap to build, and those built alike share the process's state of their key: the
// failure policy's breaker and share, Stats). When pick returns a nil limiter and no
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
			err = next.ProcessTask(ctx, t)
			c.holdResult(ctx)
			return err
		})
	}
}

// throttle gets t its permit from lim, sleeping for it within the attempt's budget;
// it returns nil when the task may run.
func (c *config) throttle(ctx context.Context, t *asynq.Task, lim *throttle.Limiter) error {
	a := c.attempt(ctx)
	var down outage
	for {
		res, err := lim.Reserve(ctx, 1, a.left())
		if errors.Is(err, throttle.ErrUnavailable) && ctx.Err() == nil {
			if down.wait(ctx, a) {
				continue
			}
			return c.reject(ctx, t, a, down.throttled(lim.Key(), describe(lim.Limits()), err))
		}
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
	// until is when the task must stop sleeping in the handler; zero: never.
	until time.Time
}

// attempt reads the task's retry counters and deadline from ctx. Outside asynq (no
// counters in ctx) an attempt is not final: the caller gets the *ThrottledError.
func (c *config) attempt(ctx context.Context) attempt {
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	a := attempt{final: ok1 && ok2 && retried >= maxRetry}
	now := time.Now()
	if !a.final {
		a.until = now.Add(c.maxInline)
	}
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(now)
		keep := c.handlerTime
		if keep <= 0 {
			keep = left / 2
		}
		if u := now.Add(max(left-keep, 0)); a.until.IsZero() || u.Before(a.until) {
			a.until = u
		}
	}
	return a
}

// left is how much longer the task may sleep in the handler.
func (a attempt) left() time.Duration {
	if a.until.IsZero() {
		return time.Duration(math.MaxInt64)
	}
	return max(time.Until(a.until), 0)
}

// outage paces the middleware's tries while its limiter or semaphore finds Redis
// unavailable (throttle.ErrUnavailable under the default FailClosed policy).
type outage struct{ backoff time.Duration }

const (
	outageFirstBackoff = 50 * time.Millisecond
	outageMaxBackoff   = time.Second
	// outageRetryIn is the RetryIn of a task handed back because Redis was unavailable.
	outageRetryIn = time.Second
)

// wait sleeps before the next try, doubling from 50ms to 1s, and reports true when
// the attempt's budget allows that try; false, without sleeping, when it does not or
// ctx is done.
func (o *outage) wait(ctx context.Context, a attempt) bool {
	o.backoff = min(max(2*o.backoff, outageFirstBackoff), outageMaxBackoff)
	if a.left() < o.backoff {
		return false
	}
	tm := time.NewTimer(o.backoff)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// throttled is the error that hands a task back because Redis stayed unavailable.
func (o *outage) throttled(key, limit string, err error) *ThrottledError {
	return &ThrottledError{RetryIn: outageRetryIn, Key: key, Limit: limit, Err: err}
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
