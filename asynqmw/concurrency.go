package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// Concurrency returns middleware that runs each task it wraps under a lease of sem, so
// that at most sem.Max() of them run at once across every worker process that shares
// sem's Redis and key.
//
// A task that finds sem full waits for a slot, in arrival order across the fleet, as
// long as MaxInlineWait, MaxSleepingWorkers and its deadline allow. If none comes, it is
// handed back as Throttle hands back a throttled task (a *ThrottledError with Limit
// "<max> in flight"; the same asynq.Config applies) and keeps its place in sem's queue
// under its task ID (throttle.Semaphore.TryAcquireFor) until it returns. RetryIn is the
// time until a slot would free by lease expiry alone, at most MaxInlineWait (at least a
// second).
//
// The handler runs under throttle.Lease.Hold: the lease is renewed while it runs and
// released when it returns or panics. If the lease is lost, the handler's context is
// cancelled with a cause wrapping throttle.ErrLeaseLost, and the handler should stop;
// give sem a lease TTL (throttle.WithLeaseTTL) above the Redis outages tasks should
// ride out. Errors are treated as by Throttle. Concurrency panics with an error
// wrapping ErrNilArgument when sem is nil.
func Concurrency(sem *throttle.Semaphore, opts ...Option) asynq.MiddlewareFunc {
	if sem == nil {
		panic(nilArgument("Concurrency"))
	}
	c := newConfig(opts)
	return c.sh.middleware(func(ctx context.Context, t *asynq.Task, slot *runSlot, handle func(context.Context) error) error {
		slot.leave() // an inner middleware: it may sleep
		lease, err := c.acquire(ctx, t, sem)
		if err != nil {
			return err
		}
		if err := slot.take(ctx); err != nil {
			_ = lease.Release(context.WithoutCancel(ctx))
			return err
		}
		return lease.Hold(ctx, handle)
	})
}

// acquire gets t a lease of sem, waiting for one within the attempt's budget and the
// bound on sleeping workers. An asynq task waits in its own place in sem's queue,
// recorded under its ID (throttle.Semaphore.TryAcquireFor), which it keeps while it
// is handed back.
func (c *config) acquire(ctx context.Context, t *asynq.Task, sem *throttle.Semaphore) (*throttle.Lease, error) {
	a := c.attempt(ctx)
	limit := fmt.Sprintf("%d in flight", sem.Max())
	id, inAsynq := asynq.GetTaskID(ctx)
	try, wait := sem.TryAcquire, sem.Acquire
	if inAsynq {
		try = func(ctx context.Context) (*throttle.Lease, time.Duration, error) {
			return sem.TryAcquireFor(ctx, bookingID(id))
		}
		wait = func(ctx context.Context) (*throttle.Lease, error) { return sem.AcquireFor(ctx, bookingID(id)) }
	}
	var down outage
	for {
		lease, left, err := try(ctx)
		if err == nil && lease == nil && a.inlineLeft() > 0 && c.sleepForSlot(a) {
			start := time.Now()
			actx, cancel := ctx, context.CancelFunc(func() {})
			if until := a.inlineUntil(); !until.IsZero() {
				actx, cancel = context.WithDeadline(ctx, until)
			}
			lease, err = wait(actx)
			cancel()
			c.sh.release()
			switch {
			case err == nil:
				c.waited(ctx, t, time.Since(start), start)
				return lease, nil
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, context.DeadlineExceeded):
				err = nil // no slot came within the budget: hand the task back
			}
		}
		switch {
		case errors.Is(err, throttle.ErrUnavailable) && ctx.Err() == nil:
			if down.wait(ctx, a) {
				continue
			}
			return nil, c.reject(ctx, t, a, down.throttled(sem.Key(), limit, err))
		case err != nil:
			return nil, fmt.Errorf("asynqmw: task %q: %w", t.Type(), err)
		case lease != nil:
			return lease, nil
		}
		return nil, c.reject(ctx, t, a, &ThrottledError{
			RetryIn: min(left, max(c.maxInline, time.Second)),
			Key:     sem.Key(),
			Limit:   limit,
		})
	}
}

// sleepForSlot takes a place among the tasks asleep in the middleware for a task
// that waits for a semaphore slot: within the bound, or past it for a task that
// cannot be handed back.
func (c *config) sleepForSlot(a attempt) bool {
	if !a.handBack {
		c.sh.sleepAnyway()
		return true
	}
	return c.sh.trySleep()
}
