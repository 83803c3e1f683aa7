package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// concurrency is Setup.Concurrency's middleware.
func (c *config) concurrency(sem *throttle.Semaphore) asynq.MiddlewareFunc {
	return c.sh.middleware(func(ctx context.Context, t *asynq.Task, slot *runSlot, handle func(context.Context) error) error {
		slot.leave() // an inner middleware: it may sleep
		lease, err := c.acquire(ctx, t, sem)
		if err != nil {
			return err
		}
		if err := slot.take(ctx); err != nil {
			release(context.WithoutCancel(ctx), lease)
			return err
		}
		return hold(ctx, lease, handle)
	})
}

// acquire gets t a lease of sem, waiting for one within the attempt's budget and the
// bound on sleeping workers. An asynq task waits in its own place in sem's queue,
// recorded under its ID, which it keeps while it is handed back.
func (c *config) acquire(ctx context.Context, t *asynq.Task, sem *throttle.Semaphore) (*throttle.Lease, error) {
	a := c.attempt(ctx)
	key, limit := semInfo(sem)
	id := bookingID(a.id)
	if _, inAsynq := asynq.GetTaskID(ctx); !inAsynq {
		id = "" // a place of its own, given up when it stops waiting
	}
	var down outage
	for {
		var (
			lease *throttle.Lease
			left  time.Duration
			err   error
		)
		lease, left, err = tryLease(ctx, sem, id)
		if err == nil && lease == nil && a.inlineLeft() > 0 && c.sleepForSlot(a) {
			start := time.Now()
			actx, cancel := ctx, context.CancelFunc(func() {})
			if until := a.inlineUntil(); !until.IsZero() {
				actx, cancel = context.WithDeadline(ctx, until)
			}
			lease, err = waitLease(actx, sem, id)
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
		case unavailable(err) && ctx.Err() == nil:
			if down.wait(ctx, a) {
				continue
			}
			return nil, c.reject(ctx, t, a, down.throttled(key, limit, err))
		case err != nil:
			return nil, fmt.Errorf("asynqmw: task %q: %w", t.Type(), err)
		case lease != nil:
			return lease, nil
		}
		if left <= 0 {
			left = time.Second
		}
		return nil, c.reject(ctx, t, a, &ThrottledError{
			RetryIn: min(left, max(c.maxInline, time.Second)),
			Key:     key,
			Limit:   limit,
		})
	}
}

// sleepForSlot takes a place among the tasks asleep in the middleware for a task
// that waits for a semaphore slot: within the bound, or past it for a task that
// cannot be handed back.
func (c *config) sleepForSlot(a attempt) bool {
	if a.unconfigured {
		c.sh.sleepAnyway()
		return true
	}
	return c.sh.trySleep()
}
