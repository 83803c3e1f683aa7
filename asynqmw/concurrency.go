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
// A task that finds sem full waits for a slot in the handler for as long as
// MaxInlineWait (and its deadline, see HandlerTime) allow, in arrival order across the
// fleet; a release hands the slot over at once. If none comes, the task is handed back
// exactly as Throttle hands back a throttled one (a *ThrottledError with Limit "<max>
// in flight", or, on a last attempt, sleeping or Requeue), so the same asynq.Config
// settings apply. RetryIn is the time until a slot would come by lease expiry alone,
// at most MaxInlineWait (at least a second): releases usually free slots sooner.
//
// Waiting tasks are served in arrival order, handed-back ones too: a task waits in a
// place in sem's queue recorded under its task ID (throttle.Semaphore.TryAcquireFor),
// which it keeps while it is away; a slot freed meanwhile is handed to the oldest
// place and kept for its task until it comes back (up to about RetryIn and the
// server's check intervals; a place or slot nobody comes back for lapses after one
// lease TTL). A task on its last attempt is requeued as a copy that keeps the
// original's place.
//
// The handler runs under throttle.Lease.Hold: the lease is extended every third of
// sem's lease TTL while the handler runs, so tasks longer than the TTL keep their
// slot, and released when it returns, whatever it returns, and also when it panics
// (the panic goes on to asynq unchanged). If the lease is lost meanwhile (an
// extension finds it expired, or none succeeds for a whole TTL), the handler's
// context is cancelled with a cause wrapping throttle.ErrLeaseLost: its slot may be
// given to another task, so it should stop. Give sem a lease TTL
// (throttle.WithLeaseTTL) well above a Redis outage you want tasks to ride out; the
// slot of a worker that dies comes back within one TTL.
//
// Waiting for a slot counts as sleeping in the middleware: while MaxSleepingWorkers
// tasks sleep, a task that finds sem full is handed back at once, so a full semaphore
// never parks more than that bound of the server's workers.
//
// When Redis is unavailable (sem returns throttle.ErrUnavailable: its default
// FailClosed policy) the task is treated as throttled, as Throttle treats it: tried
// again within its budget, then handed back, never failed. Other errors from sem are
// returned wrapped: they are failures. Concurrency panics with an error wrapping
// ErrNilArgument when sem is nil.
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
