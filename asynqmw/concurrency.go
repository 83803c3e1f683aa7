package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/internal/jobmw"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// concurrency is Setup.Concurrency's middleware.
func (c *config) concurrency(sem *throttle.Semaphore) asynq.MiddlewareFunc {
	return c.middleware(func(ctx context.Context, t *asynq.Task, a attempt, handle func(context.Context) error) error {
		lease, err := c.acquire(ctx, t, a, sem)
		if err != nil {
			return err
		}
		return lease.Hold(ctx, handle)
	})
}

// acquire gets t a lease of sem, waiting for one within the attempt's budget and the
// bound on sleeping workers. An asynq task waits in its own place in sem's queue,
// recorded under its booking ID, which it keeps while it is handed back. A last
// attempt on a configured server does not wait: it is handed back as a copy.
func (c *config) acquire(ctx context.Context, t *asynq.Task, a attempt, sem *throttle.Semaphore) (*throttle.Lease, error) {
	key, limit := jobmw.SemInfo(sem)
	id := a.booking
	if _, inAsynq := asynq.GetTaskID(ctx); !inAsynq {
		id = "" // a place of its own, given up when it stops waiting
	}
	var down jobmw.Outage
	for {
		lease, left, err := jobmw.TryLease(ctx, sem, id)
		if err == nil && lease == nil && a.InlineLeft() > 0 && c.sleepForSlot(a) {
			if lease, err = c.waitForSlot(ctx, t, sem, id, a.InlineUntil()); lease != nil || ctx.Err() != nil {
				return lease, err
			}
		}
		switch {
		case jobmw.Unavailable(err) && ctx.Err() == nil:
			if down.Wait(ctx, a.InlineLeft()) {
				continue
			}
			err := c.reject(ctx, t, a, outageError(key, limit, err))
			if !a.final || IsThrottled(err) || !down.Wait(ctx, a.LeftUntil(time.Time{})) {
				return nil, err
			}
			continue // a last attempt whose copy could not be enqueued either: both again, within its deadline
		case err != nil:
			return nil, fmt.Errorf("asynqmw: task %q: %w", t.Type(), err)
		case lease != nil:
			return lease, nil
		}
		if left <= 0 {
			left = time.Second
		}
		err = c.reject(ctx, t, a, &ThrottledError{
			RetryIn: min(left, max(c.maxInline, time.Second)),
			Key:     key,
			Limit:   limit,
		})
		if !a.final || IsThrottled(err) {
			return nil, err
		}
		// The copy could not be enqueued (Redis went away?): returning the error would
		// archive the task, so it waits for a slot in its worker, within its deadline.
		c.sh.SleepAnyway()
		if lease, werr := c.waitForSlot(ctx, t, sem, id, a.Until(time.Time{})); lease != nil || ctx.Err() != nil {
			return lease, werr
		}
		return nil, err
	}
}

// waitForSlot waits in id's place in sem's queue for a lease until until (zero:
// without an end of its own) as one of the tasks asleep in the middleware, whose
// place it then gives back. It returns the lease; nil and no error when until came
// first; ctx.Err() when ctx ended; or the semaphore's error.
func (c *config) waitForSlot(ctx context.Context, t *asynq.Task, sem *throttle.Semaphore, id string, until time.Time) (*throttle.Lease, error) {
	defer c.sh.Release()
	start := time.Now()
	actx, cancel := ctx, context.CancelFunc(func() {})
	if !until.IsZero() {
		actx, cancel = context.WithDeadline(ctx, until)
	}
	defer cancel()
	lease, err := jobmw.WaitLease(actx, sem, id)
	switch {
	case err == nil:
		c.waited(ctx, t, time.Since(start), start)
		return lease, nil
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case errors.Is(err, context.DeadlineExceeded):
		return nil, nil
	}
	return nil, err
}

// sleepForSlot takes a place among the tasks asleep in the middleware for a task
// that waits for a semaphore slot: within the bound, past it for a task that cannot
// be handed back, never for a last attempt on a configured server.
func (c *config) sleepForSlot(a attempt) bool {
	switch {
	case a.neverSleeps():
		return false
	case a.unconfigured:
		c.sh.SleepAnyway()
		return true
	}
	return c.sh.TrySleep()
}
