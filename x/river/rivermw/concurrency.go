package rivermw

import (
	"context"
	"errors"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/jobmw"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/riverqueue/river/rivertype"
)

// concurrency is Setup.Concurrency's middleware.
func (c *config) concurrency(sem *throttle.Semaphore) *Middleware {
	return c.sh.middleware(func(ctx context.Context, job *rivertype.JobRow, slot *runSlot, doInner func(context.Context) error) error {
		slot.leave() // an inner middleware: it may sleep
		lease, err := c.acquire(ctx, job, sem)
		if err != nil {
			return err
		}
		// The lease is held, and renewed, while the job waits for a run slot too: that
		// wait has no bound (the queue's other jobs run as long as they run), and a lease
		// left to expire meanwhile would free the semaphore's slot to another holder
		// before this job runs, and have it cancelled as lost once it did.
		return lease.Hold(ctx, func(ctx context.Context) error {
			if err := slot.take(ctx); err != nil {
				return err
			}
			return doInner(ctx)
		})
	})
}

// acquire gets job a lease of sem, waiting for one within the attempt's budget and the
// bound on sleeping jobs; else it returns the *ThrottledError that snoozes the job. A
// job waits in its own place in sem's queue, named by its ID, which it keeps while it
// is snoozed.
func (c *config) acquire(ctx context.Context, job *rivertype.JobRow, sem *throttle.Semaphore) (*throttle.Lease, error) {
	a := c.attempt(ctx, job)
	key, limit := jobmw.SemInfo(sem)
	var down jobmw.Outage
	for {
		lease, left, err := jobmw.TryLease(ctx, sem, a.id)
		if err == nil && lease == nil && a.InlineLeft() > 0 && c.sh.TrySleep() {
			start := time.Now()
			actx, cancel := ctx, context.CancelFunc(func() {})
			if until := a.InlineUntil(); !until.IsZero() {
				actx, cancel = context.WithDeadline(ctx, until)
			}
			lease, err = jobmw.WaitLease(actx, sem, a.id)
			cancel()
			c.sh.Release()
			switch {
			case err == nil:
				c.waited(ctx, job, start)
				return lease, nil
			case ctx.Err() != nil:
				return nil, ctx.Err()
			case errors.Is(err, context.DeadlineExceeded):
				err = nil // no slot came within the budget: snooze the job
			}
		}
		switch {
		case jobmw.Unavailable(err) && ctx.Err() == nil:
			if down.Wait(ctx, a.InlineLeft()) {
				continue
			}
			return nil, c.snooze(ctx, job, outageError(key, limit, err))
		case err != nil:
			return nil, jobError(job, "taking a lease", err)
		case lease != nil:
			return lease, nil
		}
		if left <= 0 {
			left = time.Second
		}
		retry := min(left, max(c.maxInline, time.Second))
		return nil, c.snooze(ctx, job, &ThrottledError{RetryIn: retry, Snooze: snoozeUnbooked(retry), Key: key, Limit: limit})
	}
}
