package asynqmw

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/hibiken/asynq"
	ib "github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/jobmw"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// middleware returns the asynq middleware that runs step for each task, with what
// the middleware knows of the task's attempt and its handler: step gets the task past
// its limit and runs handle. The first of the Setup's middlewares that a task meets
// reads the attempt, and returns to asynq what finish makes of the result.
func (c *config) middleware(step func(ctx context.Context, t *asynq.Task, a attempt, handle func(context.Context) error) error) asynq.MiddlewareFunc {
	return func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
			handle := func(ctx context.Context) error { return next.ProcessTask(ctx, t) }
			if a, ok := ctx.Value(attemptKey{}).(*attempt); ok && a.sh == c.sh {
				return step(ctx, t, *a, handle)
			}
			a := c.attempt(ctx, t)
			if err := c.spentCopy(ctx, a); err != nil {
				return err
			}
			ctx = context.WithValue(ctx, attemptKey{}, &a)
			return finish(a, step(ctx, t, a, handle))
		})
	}
}

// attemptKey is the context key of a task's attempt, read by the first of the
// Setup's middlewares that the task meets.
type attemptKey struct{}

// throttleFunc is Setup.ThrottleFunc's middleware.
func (c *config) throttleFunc(pick func(ctx context.Context, t *asynq.Task) (*throttle.Limiter, error)) asynq.MiddlewareFunc {
	return c.middleware(func(ctx context.Context, t *asynq.Task, a attempt, handle func(context.Context) error) error {
		lim, err := pick(ctx, t)
		if err != nil {
			return fmt.Errorf("asynqmw: choosing the limiter for task %q: %w", t.Type(), err)
		}
		if lim == nil {
			return handle(ctx)
		}
		at, b, err := c.throttle(ctx, t, a, lim, jobmw.InfoOf(lim, lateGrace))
		if err != nil {
			return err
		}
		// the handler settles a booking of estimated costs (lim a Cost handle) with
		// waiter.Settle, once it knows the actual
		ctx = ib.WithSettle(ctx, b.Settle)
		// A task whose context ended while it waited does not start: asynq has put it
		// back in the queue (shutdown) or counts it failed (deadline) already. A
		// sleeper woken late, after both its permit's time and the context's end, saw
		// either first; started anyway, it ran twice (once here after the requeue).
		if err := ctx.Err(); err != nil {
			return err
		}
		if c.hooks.Started != nil {
			c.hooks.Started(ctx, t, at)
		}
		return handle(ctx)
	})
}

// throttle gets t its permit from lim, sleeping for it within the attempt's budget,
// and its start through the pacer; it returns, when the task may run, the time the
// pacer counted as its start and the booking it runs on. A last attempt on a configured server never sleeps: a
// dying worker would lose it (asynq archives a task on its last attempt whose lease
// expires), so it is handed back as a copy, which may (see requeue).
func (c *config) throttle(ctx context.Context, t *asynq.Task, a attempt, lim *throttle.Limiter, li jobmw.Limit) (time.Time, jobmw.Booking, error) {
	if te := c.bounce(li, a); te != nil {
		return time.Time{}, jobmw.Booking{}, c.reject(ctx, t, a, te)
	}
	var down jobmw.Outage
	for {
		// A task that cannot be handed back books only what it may sleep for.
		maxWait := time.Duration(-1)
		if !a.handBack {
			maxWait = a.InlineLeft()
		}
		b, kept, err := jobmw.Book(ctx, lim, a.booking, maxWait, li.Grace)
		if err == nil && a.handBack {
			c.sh.cb.Returned(a.booking, time.Now())
		}
		if jobmw.Unavailable(err) && ctx.Err() == nil {
			if down.Wait(ctx, a.InlineLeft()) {
				continue
			}
			err := c.reject(ctx, t, a, outageError(li.Key, li.Desc, err))
			if !a.final || IsThrottled(err) || !down.Wait(ctx, a.LeftUntil(time.Time{})) {
				return time.Time{}, jobmw.Booking{}, err
			}
			continue // a last attempt whose copy could not be enqueued either: both again, within its deadline
		}
		if err != nil {
			return time.Time{}, jobmw.Booking{}, fmt.Errorf("asynqmw: task %q: %w", t.Type(), err)
		}
		if kept {
			c.sh.kept.Add(1)
		}
		wait := b.Delay()
		if !b.OK() || !c.maySleep(a, wait, kept) {
			te := &ThrottledError{RetryIn: wait, Key: li.Key, Limit: li.Desc}
			if !a.handBack {
				if b.OK() {
					b.Cancel(ctx) // nothing will come back for it
				}
				return time.Time{}, jobmw.Booking{}, te
			}
			te.Booked, te.back = true, c.comeBack(wait)
			err := c.reject(ctx, t, a, te)
			if !a.final || IsThrottled(err) || wait > a.LeftUntil(time.Time{}) {
				return time.Time{}, jobmw.Booking{}, err
			}
			// The copy could not be enqueued (Redis went away?): returning the error
			// would archive the task, so it keeps its booking and sleeps for it.
			c.sh.SleepAnyway()
		}
		start := time.Now()
		slept := wait > 0 || !b.OK() // (not OK here: a last attempt that sleeps anyway)
		if slept {
			err = b.Wait(ctx)
			c.sh.Release()
		}
		if errors.Is(err, jobmw.ErrMoved) {
			continue // this process paused the key, or the tenant's turn came: book again
		}
		if err != nil {
			return time.Time{}, jobmw.Booking{}, err
		}
		if slept {
			c.waited(ctx, t, wait, start)
		}
		at, err := c.start(ctx, t, a, li)
		return at, b, err
	}
}

// start lets a task that has its permit go on through the pacer, and returns the time
// the pacer counted as its start. A last attempt the pacer would delay is handed back
// as a copy (which runs on the booking if it is back within lateGrace, else books
// anew), unless the copy cannot be enqueued: then it waits in its worker.
func (c *config) start(ctx context.Context, t *asynq.Task, a attempt, li jobmw.Limit) (time.Time, error) {
	at, d, err := c.sh.pacer.start(ctx, li, !a.neverSleeps())
	if d == 0 {
		return at, err
	}
	te := &ThrottledError{RetryIn: d, Key: li.Key, Limit: li.Desc, Booked: true, back: c.comeBack(d)}
	if err := c.reject(ctx, t, a, te); IsThrottled(err) {
		return time.Time{}, err
	}
	at, _, err = c.sh.pacer.start(ctx, li, true)
	return at, err
}

// bounceMin is how far ahead a task's slot, as this process remembers it, must be for
// bounce to hand the task back without asking Redis: far enough that a script call
// could not answer that it is due (the process's and the server's clocks measure the
// wait alike; this covers a reply's way back).
const bounceMin = 50 * time.Millisecond

// bounce returns the *ThrottledError that hands a returning task back again, booked,
// without a script call, when this process handed it back from lim (so knows its
// slot, under its booking ID), it is not on its last attempt, and it could not sleep
// for it now anyway: its slot is more than bounceMin ahead
// and MaxSleepingWorkers tasks sleep, or it is further ahead than a returning task
// may sleep. Else nil: the task asks Redis for its booking. The booking stays as
// recorded; the task's next return uses it (a pause or a move that overtook it is
// found then). This saves the script call of a bounce (the returned task would get
// its booking back, find the bound full and be handed back). The slot remembered can
// be stale only when the task came back to another server meanwhile, which can only
// have moved the booking later: the task comes back no later than it should.
func (c *config) bounce(li jobmw.Limit, a attempt) *ThrottledError {
	if !a.handBack || a.final { // a last attempt's copy may fail to enqueue: ask Redis
		return nil
	}
	now := time.Now()
	wait, ok := c.sh.cb.SlotIn(a.booking, li.Key, now)
	if !ok || wait <= bounceMin || (wait <= a.KeptLeft() && !c.sh.Full()) {
		return nil
	}
	c.sh.cb.Returned(a.booking, now)
	c.sh.bounced.Add(1)
	return &ThrottledError{RetryIn: wait, Key: li.Key, Limit: li.Desc, Booked: true, back: c.comeBack(wait)}
}

// maySleep reports whether a task may sleep wait for its permit in the handler, and
// if so takes its place among the sleepers (unless wait is 0). A task that found its
// booking may sleep as long as asynq's precision makes it come back early; a last
// attempt on a configured server may not sleep at all.
func (c *config) maySleep(a attempt, wait time.Duration, kept bool) bool {
	if wait <= 0 {
		return true
	}
	if a.neverSleeps() {
		return false
	}
	if a.unconfigured {
		// no other way than sleeping: keep the task, hold the worker
		if wait > a.InlineLeft() {
			return false
		}
		c.sh.SleepAnyway() // past the bound: it cannot be handed back
		return true
	}
	limit := a.InlineLeft()
	if kept {
		limit = a.KeptLeft()
	}
	return wait <= limit && c.sh.TrySleep()
}

// comeBack is the delay after which a task booked wait ahead should be made due:
// early enough that, rounded down to whole seconds by asynq, forwarded within one
// DelayedTaskCheckInterval and dequeued within one TaskCheckInterval, it is in a
// worker by its slot, that is, the check intervals, 20ms for the calls in between, or
// the lateness this server has seen of late, earlier (see jobmw.ComeBack.Early). A task that
// could not sleep only because too many others did comes back as soon as that allows
// too: the sleepers wake at their slots, within about a second.
func (c *config) comeBack(wait time.Duration) time.Duration {
	return max(wait-c.sh.cb.Early(c.sh.checkInterval()), 0)
}

// attempt is what the middleware knows of a task's current attempt.
type attempt struct {
	sh *shared // the Setup's
	// id is the task's ID; outside an asynq server, a random one.
	id string
	// booking is the ID the task's booking and its place in a semaphore's queue are
	// recorded under (see bookingID): a copy's (see requeue) is the original's.
	booking string
	// copy reports whether the task is a last attempt's copy (see requeue).
	copy bool
	// final reports whether the task's retries are used up: asynq archives it on any
	// error, so it is handed back as a copy (see requeue), and, on a configured
	// server, never sleeps in its worker.
	final bool
	// handBack reports whether the task may be handed back: it runs on a server
	// whose Config went through Setup.Config. unconfigured reports that it runs on
	// another server: it sleeps for its permit, past the bound on sleepers, as long
	// as its deadline allows. Called directly (neither), it sleeps within the bound
	// and the inline wait, else returns the *ThrottledError, nothing booked.
	handBack, unconfigured bool
	// Deadline is when the task must stop sleeping in the handler, to leave it the
	// rest of its time (half by default, see handlerTime); Inline and Kept are zero
	// (only the deadline) on a server Config did not configure.
	jobmw.Budget
}

// attempt reads the task's ID, retry counters and deadline from ctx, and whether it
// is a copy from its headers.
func (c *config) attempt(ctx context.Context, t *asynq.Task) attempt {
	a := attempt{sh: c.sh}
	id, inAsynq := asynq.GetTaskID(ctx)
	now := time.Now()
	switch {
	case !inAsynq: // called directly: sleeps as a task that may be handed back
		id = randomID()
		a.Inline = now.Add(c.maxInline)
	case c.sh.ours(ctx):
		a.handBack = true
	default:
		a.unconfigured = true
		c.sh.notConfigured()
	}
	a.id, a.booking = id, id
	if queue, ok := asynq.GetQueueName(ctx); ok {
		a.booking = bookingID(queue, id)
	}
	if of, ok := t.Headers()[copyOf]; ok && of != "" {
		a.booking, a.copy = of, true
	}
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	a.final = ok1 && ok2 && retried >= maxRetry
	if a.handBack {
		a.Inline = now.Add(c.maxInline)
		a.Kept = now.Add(max(c.maxInline, c.keptLimit()))
	}
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(now)
		keep := c.handlerTime
		if keep <= 0 {
			keep = left / 2
		}
		a.Deadline = now.Add(max(left-keep, 0))
	}
	return a
}

// neverSleeps reports whether the task may not sleep in its worker: a last attempt on
// a configured server (see Throttle).
func (a attempt) neverSleeps() bool { return a.final && a.handBack }

// bookingID is the booking ID of the task id of queue: asynq keeps a task ID unique
// within its queue only, and two tasks of one ID in two queues must not share a
// booking (both would run on one permit) nor a place in a semaphore's queue. The
// queue's length makes the form unambiguous (a queue name may hold a colon). asynq
// bounds neither a queue name's length nor a task ID's: a form longer than a booking ID
// may be is replaced by its SHA-256, which no unhashed form can equal (a digit follows
// its "asynq:").
func bookingID(queue, id string) string {
	b := "asynq:" + strconv.Itoa(len(queue)) + ":" + queue + ":" + id
	if len(b) > ib.MaxID {
		sum := sha256.Sum256([]byte(b))
		return "asynq:sha256:" + hex.EncodeToString(sum[:])
	}
	return b
}

// randomID is the ID a task outside an asynq server books under.
func randomID() string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return "jt-" + hex.EncodeToString(b[:])
}

// keptLimit is how long a task that found its booking may sleep: as early as asynq's
// precision may bring it back (a second and how early it was made due).
func (c *config) keptLimit() time.Duration {
	return time.Second + c.sh.cb.Early(c.sh.checkInterval())
}

// outageRetryIn is the RetryIn of a task handed back because Redis was unavailable.
const outageRetryIn = time.Second

// outageError is the error that hands a task back because Redis stayed unavailable.
func outageError(key, limit string, err error) *ThrottledError {
	return &ThrottledError{RetryIn: outageRetryIn, Key: key, Limit: limit, Err: err}
}

// reject hands a task back with te: through asynq's retry, or, on a last attempt, as
// a copy (see requeue). A task that may not be handed back gets te, nothing booked.
// It returns te, or the error of a copy that could not be enqueued.
func (c *config) reject(ctx context.Context, t *asynq.Task, a attempt, te *ThrottledError) error {
	var err error = te
	if a.handBack && a.final {
		err = c.requeue.requeue(ctx, t, a, te)
	}
	if IsThrottled(err) {
		c.sh.handed.Add(1)
		if te.Requeued {
			c.sh.requeued.Add(1)
		}
		if te.Booked {
			now := time.Now()
			c.sh.cb.HandedBack(a.booking, te.Key, now.Add(te.RetryIn), retryDue(now, te.back))
		}
		if c.hooks.Throttled != nil {
			c.hooks.Throttled(ctx, t, te)
		}
	}
	return err
}

// waited reports a sleep in the handler to the Waited hook.
func (c *config) waited(ctx context.Context, t *asynq.Task, delay time.Duration, start time.Time) {
	if delay > 0 && c.hooks.Waited != nil {
		c.hooks.Waited(ctx, t, time.Since(start))
	}
}
