package rivermw

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	ib "github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/jobmw"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/riverqueue/river/rivertype"
)

// throttleFunc is Setup.ThrottleFunc's middleware.
func (c *config) throttleFunc(pick func(ctx context.Context, job *rivertype.JobRow) (*throttle.Limiter, error)) *Middleware {
	return c.sh.middleware(func(ctx context.Context, job *rivertype.JobRow, slot *runSlot, doInner func(context.Context) error) error {
		lim, err := pick(ctx, job)
		if err != nil {
			return jobError(job, "choosing its limiter", err)
		}
		if lim == nil {
			return doInner(ctx) // not limited: the gate takes its run slot
		}
		li := jobmw.InfoOf(lim, lateGrace)
		slot.leave() // an inner middleware: it may sleep
		b, err := c.throttle(ctx, job, lim, li)
		if err != nil {
			return err
		}
		// the worker settles a booking of estimated costs (lim a Cost handle) with
		// waiter.Settle, once it knows the actual
		ctx = ib.WithSettle(ctx, b.Settle)
		at, err := c.sh.pacer.start(ctx, li, slot)
		if err != nil {
			return err
		}
		// A job whose context ended while it waited does not start: River is stopping
		// (it makes the job available again) or the job was cancelled. A sleeper woken
		// late, after both its permit's time and the context's end, saw either first.
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.hooks.Started != nil {
			c.hooks.Started(ctx, job, at)
		}
		return doInner(ctx)
	})
}

// throttle gets job its permit from lim, sleeping for it within the attempt's budget;
// it returns the booking the job runs on, or the *ThrottledError that snoozes it.
func (c *config) throttle(ctx context.Context, job *rivertype.JobRow, lim *throttle.Limiter, li jobmw.Limit) (jobmw.Booking, error) {
	a := c.attempt(ctx, job)
	if te := c.bounce(li, a); te != nil {
		return jobmw.Booking{}, c.snooze(ctx, job, te)
	}
	var down jobmw.Outage
	for {
		b, kept, err := jobmw.Book(ctx, lim, a.id, -1, li.Grace)
		if err == nil {
			c.sh.cb.Returned(a.id, time.Now())
		}
		if jobmw.Unavailable(err) && ctx.Err() == nil {
			if down.Wait(ctx, a.InlineLeft()) {
				continue
			}
			return jobmw.Booking{}, c.snooze(ctx, job, outageError(li.Key, li.Desc, err))
		}
		if err != nil {
			return jobmw.Booking{}, jobError(job, "booking its permit", err)
		}
		if kept {
			c.sh.kept.Add(1)
		}
		wait := b.Delay()
		if !b.OK() && wait <= 0 { // a tenant's turn, due as the reply came back: book again
			continue
		}
		if !c.maySleep(a, wait, kept) {
			return jobmw.Booking{}, c.snooze(ctx, job, &ThrottledError{RetryIn: wait, Key: li.Key, Limit: li.Desc, Booked: true,
				Snooze: max(wait-a.early, 0)})
		}
		start := time.Now()
		slept := wait > 0
		if slept {
			err = b.Wait(ctx)
			c.sh.Release()
		}
		if errors.Is(err, jobmw.ErrMoved) {
			continue // this process paused the key, or the tenant's turn came: book again
		}
		if err != nil {
			return jobmw.Booking{}, err
		}
		if slept {
			c.waited(ctx, job, start)
		}
		return b, nil
	}
}

// bounceMin is how far ahead a job's slot, as this process remembers it, must be for
// bounce to snooze the job again without asking Redis: far enough that a script call
// could not answer that it is due (the process's and the server's clocks measure the
// wait alike; this covers a reply's way back).
const bounceMin = 50 * time.Millisecond

// bounce returns the *ThrottledError that snoozes a returning job again, booked,
// without a script call, when this process snoozed it on li's limiter (so knows its
// slot) and it could not sleep for it now anyway: its slot is more than bounceMin
// ahead and MaxSleepingWorkers jobs sleep, or it is further ahead than a returning job
// may sleep. Else nil: the job asks Redis for its booking. The booking stays as
// recorded; the job's next return uses it (a pause or a move that overtook it is found
// then). This saves the script call of a bounce (the returned job would get its booking
// back, find the bound full and be snoozed). The slot remembered can be stale only when
// the job came back to another client meanwhile, which can only have moved the booking
// later: the job comes back no later than it should.
func (c *config) bounce(li jobmw.Limit, a attempt) *ThrottledError {
	now := time.Now()
	wait, ok := c.sh.cb.SlotIn(a.id, li.Key, now)
	if !ok || wait <= bounceMin || (wait <= a.KeptLeft() && !c.sh.Full()) {
		return nil
	}
	c.sh.cb.Returned(a.id, now)
	c.sh.bounced.Add(1)
	return &ThrottledError{RetryIn: wait, Key: li.Key, Limit: li.Desc, Booked: true, Snooze: max(wait-a.early, 0)}
}

// maySleep reports whether a job may sleep wait for its permit in the middleware, and
// if so takes its place among the sleepers (unless wait is 0). A job that found its
// booking may sleep as long as River may bring it back early.
func (c *config) maySleep(a attempt, wait time.Duration, kept bool) bool {
	if wait <= 0 {
		return true
	}
	limit := a.InlineLeft()
	if kept {
		limit = a.KeptLeft()
	}
	return wait <= limit && c.sh.TrySleep()
}

// attempt is what the middleware knows of a job's current attempt.
type attempt struct {
	// id is what the job's booking and its place in a semaphore's queue are recorded
	// under (see bookingID).
	id string
	// early is how long before its slot the job is made due when it is snoozed (see
	// jobmw.ComeBack.Early).
	early time.Duration
	// Deadline is when the job must stop sleeping in the middleware, to leave its
	// worker half the time left before the context's deadline.
	jobmw.Budget
}

// attempt reads what the middleware needs of job's attempt from ctx and the Setup.
func (c *config) attempt(ctx context.Context, job *rivertype.JobRow) attempt {
	now := time.Now()
	a := attempt{id: bookingID(job), early: c.sh.cb.Early(c.sh.interval(job.Queue))}
	// A snoozed job comes back up to early before its slot, and sleeps the rest: a
	// shorter wait is served as well by sleeping now.
	a.Inline = now.Add(max(c.maxInline, a.early))
	// A returning job may have been snoozed by another client of the fleet, whose
	// learned margin may be up to comeBackMaxExtra longer, or come back early by the
	// difference between the client's and the database's clocks: a second's slack.
	a.Kept = now.Add(max(c.maxInline, a.early+time.Second))
	if dl, ok := ctx.Deadline(); ok {
		a.Deadline = now.Add(max(dl.Sub(now)/2, 0))
	}
	return a
}

// bookingID is the ID a job's booking is recorded under, and its place in a
// semaphore's queue: its ID, and its creation time, which tells apart jobs of the
// same ID in River databases of their own sharing one limiter.
func bookingID(job *rivertype.JobRow) string {
	return fmt.Sprintf("river:%d:%d", job.ID, job.CreatedAt.UnixMicro())
}

// outageRetryIn is the RetryIn of a job snoozed because Redis was unavailable.
const outageRetryIn = time.Second

// outageError is the error that snoozes a job because Redis stayed unavailable.
func outageError(key, limit string, err error) *ThrottledError {
	return &ThrottledError{RetryIn: outageRetryIn, Snooze: snoozeUnbooked(outageRetryIn), Key: key, Limit: limit, Err: err}
}

// snoozeUnbooked is how long a job with no booking (a semaphore's, Redis unavailable)
// is snoozed when its permit or slot may come in d: d, at least a second, and a jitter
// of up to a tenth of that, at least a second, so that a herd throttled at the same
// moment comes back over a few seconds rather than in the same one.
func snoozeUnbooked(d time.Duration) time.Duration {
	d = max(d, time.Second)
	return d + rand.N(max(d/10, time.Second))
}

// snooze completes te with the job and returns it, to snooze the job: it counts the
// snooze, records a booked job's slot (see jobmw.ComeBack) and calls Hooks.Throttled.
func (c *config) snooze(ctx context.Context, job *rivertype.JobRow, te *ThrottledError) error {
	te.JobID, te.Kind = job.ID, job.Kind
	c.sh.snoozed.Add(1)
	if te.Booked {
		now := time.Now()
		c.sh.cb.HandedBack(bookingID(job), te.Key, now.Add(te.RetryIn), now.Add(te.Snooze))
	}
	if c.hooks.Throttled != nil {
		c.hooks.Throttled(ctx, job, te)
	}
	return te
}

// waited reports a sleep in the middleware that began at start to the Waited hook.
func (c *config) waited(ctx context.Context, job *rivertype.JobRow, start time.Time) {
	if c.hooks.Waited != nil {
		c.hooks.Waited(ctx, job, time.Since(start))
	}
}
