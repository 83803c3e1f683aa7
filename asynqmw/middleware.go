package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Throttle returns middleware that takes one permit from lim before each task runs, so
// the tasks it wraps, in every worker process sharing lim's Redis and key, stay inside
// lim's limits. New(rdb).Throttle is the same middleware with the server's Config set
// to match (see Setup); used alone it needs IsFailure, RetryDelay, CheckInterval,
// and Requeue wired by hand.
//
// Each task books its permit under its task ID (throttle.Limiter.ReserveFor), first
// come first served across the fleet. If it is due within MaxInlineWait and fewer than
// MaxSleepingWorkers tasks sleep, the task sleeps and runs; else it is handed back,
// booked, with a *ThrottledError (no retry spent; a last attempt as a copy, see
// Requeue), made due early by how late this server's returns have come (learned, up
// to half a second more than the check intervals), and runs at its slot when it
// returns; one back at most 250ms late (a quarter period if less) still runs on its
// slot (throttle.Limiter.ReserveForLate), a later one is moved to the first free slot.
// One back before its slot that may not sleep yet (MaxSleepingWorkers asleep, or too
// early) is handed back again, booked, without a Redis call if this process handed it
// back (it knows the slot).
// In each process, the handler starts let through lim never exceed a limit in any
// window of its Period (Hooks.Started; token buckets and limits above 10000 per
// period are not paced). The README's asynq section gives the bound across processes
// and why each step is needed.
//
// A task whose ctx ends while it sleeps gives its permit back and returns ctx.Err().
// Redis unreachable (throttle.ErrUnavailable) throttles a task, never fails it; other
// errors from lim are returned wrapped: they are failures. Throttle panics with an
// error wrapping ErrNilArgument for a nil lim, ErrInvalidOption for a bad option.
func Throttle(lim *throttle.Limiter, opts ...Option) asynq.MiddlewareFunc {
	if lim == nil {
		panic(nilArgument("Throttle"))
	}
	return ThrottleFunc(func(context.Context, *asynq.Task) (*throttle.Limiter, error) { return lim, nil }, opts...)
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
// ThrottleFunc panics with an error wrapping ErrNilArgument when pick is nil.
func ThrottleFunc(pick func(ctx context.Context, t *asynq.Task) (*throttle.Limiter, error), opts ...Option) asynq.MiddlewareFunc {
	if pick == nil {
		panic(nilArgument("ThrottleFunc"))
	}
	c := newConfig(opts)
	return c.sh.middleware(func(ctx context.Context, t *asynq.Task, slot *runSlot, handle func(context.Context) error) error {
		lim, err := pick(ctx, t)
		if err != nil {
			return fmt.Errorf("asynqmw: choosing the limiter for task %q: %w", t.Type(), err)
		}
		if lim != nil {
			slot.leave() // an inner middleware: it may sleep
			if err := c.throttle(ctx, t, lim); err != nil {
				return err
			}
		}
		if err := slot.take(ctx); err != nil {
			return err
		}
		var at time.Time
		if lim != nil {
			if at, err = c.sh.pacer.start(ctx, lim); err != nil {
				return err
			}
		}
		// A task whose context ended while it waited does not start: asynq has put it
		// back in the queue (shutdown) or counts it failed (deadline) already. A
		// sleeper woken late, after both its permit's time and the context's end, saw
		// either first; started anyway, it ran twice (once here after the requeue).
		if err := ctx.Err(); err != nil {
			return err
		}
		if lim != nil && c.hooks.Started != nil {
			c.hooks.Started(ctx, t, at)
		}
		return handle(ctx)
	})
}

// throttle gets t its permit from lim, sleeping for it within the attempt's budget;
// it returns nil when the task may run.
func (c *config) throttle(ctx context.Context, t *asynq.Task, lim *throttle.Limiter) error {
	a := c.attempt(ctx)
	id, inAsynq := asynq.GetTaskID(ctx)
	if inAsynq {
		c.sh.returned(ctx)
		if te := c.bounce(lim, bookingID(id), a); te != nil {
			return c.reject(ctx, t, a, te)
		}
	}
	var down outage
	for {
		var (
			res  *waiter.Reservation
			kept bool
			err  error
		)
		if inAsynq {
			res, kept, err = lim.ReserveForLate(ctx, bookingID(id), 1, graceFor(lim))
			if err == nil {
				c.sh.cb.returned(bookingID(id), time.Now())
			}
		} else {
			res, err = lim.Reserve(ctx, 1, a.inlineLeft())
		}
		if errors.Is(err, throttle.ErrUnavailable) && ctx.Err() == nil {
			if down.wait(ctx, a) {
				continue
			}
			return c.reject(ctx, t, a, down.throttled(lim.Key(), describe(lim.Limits()), err))
		}
		if err != nil {
			return fmt.Errorf("asynqmw: task %q: %w", t.Type(), err)
		}
		if kept {
			c.sh.kept.Add(1)
		}
		wait := res.Delay()
		if !res.OK() || !c.maySleep(a, wait, kept) {
			if !inAsynq && res.OK() {
				_ = res.Cancel(ctx) // nothing records it: give it back
			}
			te := &ThrottledError{
				RetryIn: wait,
				Key:     lim.Key(),
				Limit:   describe(lim.Limits()),
				Booked:  inAsynq && res.OK(),
				back:    c.comeBack(wait),
			}
			err := c.reject(ctx, t, a, te)
			if !a.final || c.requeue == nil || IsThrottled(err) || !res.OK() || wait > a.leftUntil(time.Time{}) {
				return err
			}
			// The copy could not be enqueued (Redis went away?): returning the error
			// would archive the task, so it keeps its booking and sleeps for it.
			c.sh.sleepAnyway()
		}
		start := time.Now()
		slept := wait > 0
		if slept {
			err = res.Wait(ctx)
			c.sh.release()
		}
		if errors.Is(err, waiter.ErrMoved) {
			continue // this process paused the key: book again after the pause
		}
		if err != nil {
			return err
		}
		if slept {
			c.waited(ctx, t, wait, start)
		}
		return nil
	}
}

// bounceMin is how far ahead a task's slot, as this process remembers it, must be for
// bounce to hand the task back without asking Redis: far enough that a script call
// could not answer that it is due (the process's and the server's clocks measure the
// wait alike; this covers a reply's way back).
const bounceMin = 50 * time.Millisecond

// bounce returns the *ThrottledError that hands a returning task back again, booked,
// without a script call, when this process handed it back from lim (so knows its
// slot, under id), it is not on its last attempt, and it could not sleep for it now anyway: its slot is more than bounceMin ahead
// and MaxSleepingWorkers tasks sleep, or it is further ahead than a returning task
// may sleep. Else nil: the task asks Redis for its booking. The booking stays as
// recorded; the task's next return uses it (a pause or a move that overtook it is
// found then). This saves the script call of a bounce (the returned task would get
// its booking back, find the bound full and be handed back). The slot remembered can
// be stale only when the task came back to another server meanwhile, which can only
// have moved the booking later: the task comes back no later than it should.
func (c *config) bounce(lim *throttle.Limiter, id string, a attempt) *ThrottledError {
	if !a.handBack || a.final { // a last attempt's copy may fail to enqueue: ask Redis
		return nil
	}
	now := time.Now()
	wait, ok := c.sh.cb.slotIn(id, lim.Key(), now)
	if !ok || wait <= bounceMin || (wait <= a.keptLeft() && !c.sh.full()) {
		return nil
	}
	c.sh.cb.returned(id, now)
	c.sh.bounced.Add(1)
	return &ThrottledError{
		RetryIn: wait,
		Key:     lim.Key(),
		Limit:   describe(lim.Limits()),
		Booked:  true,
		back:    c.comeBack(wait),
	}
}

// maySleep reports whether a task may sleep wait for its permit in the handler, and
// if so takes its place among the sleepers (unless wait is 0). A task that found its
// booking may sleep as long as asynq's precision makes it come back early.
func (c *config) maySleep(a attempt, wait time.Duration, kept bool) bool {
	if wait <= 0 {
		return true
	}
	if !a.handBack {
		// no other way than sleeping: keep the task, hold the worker
		if wait > c.maxInline {
			c.sh.warn("requeue", "asynqmw: a throttled task on its last attempt sleeps in its worker: "+
				"the middleware has no Requeue(rdb), so handing it back would archive it. Use asynqmw.New(rdb).")
		}
		if wait > a.inlineLeft() {
			return false
		}
		c.sh.sleepAnyway() // past the bound: it cannot be handed back
		return true
	}
	limit := a.inlineLeft()
	if kept {
		limit = a.keptLeft()
	}
	return wait <= limit && c.sh.trySleep()
}

// comeBack is the delay after which a task booked wait ahead should be made due:
// early enough that, rounded down to whole seconds by asynq, forwarded within one
// DelayedTaskCheckInterval and dequeued within one TaskCheckInterval, it is in a
// worker by its slot, that is, the check intervals, 20ms for the calls in between, or
// the lateness this server has seen of late, earlier (see comeBack.early). A task that
// could not sleep only because too many others did comes back as soon as that allows
// too: the sleepers wake at their slots, within about a second.
func (c *config) comeBack(wait time.Duration) time.Duration {
	return max(wait-c.sh.cb.early(c.sh.checkInterval()), 0)
}

// graceFor is how long after its slot a task that comes back may still run on it:
// lateGrace, at most a quarter of lim's shortest period. A later task is moved to the
// earliest slot free then.
func graceFor(lim *throttle.Limiter) time.Duration {
	g := lateGrace
	for _, l := range lim.Limits() {
		g = min(g, l.Period/4)
	}
	return g
}

// bookingID is the ID a task's booking is recorded under: a requeued copy's
// ("<id>~r<n>") is the original's, so the copy finds the original's booking.
func bookingID(id string) string {
	if i := strings.LastIndex(id, "~r"); i >= 0 {
		if n, err := strconv.Atoi(id[i+2:]); err == nil && n > 0 {
			return id[:i]
		}
	}
	return id
}

// attempt is what the middleware knows of a task's current attempt.
type attempt struct {
	// final reports whether the task's retries are used up: asynq archives it on any
	// error, so it must not be handed back with one.
	final bool
	// handBack reports whether the task can be handed back: it is not final, or it
	// is and Requeue is set.
	handBack bool
	// deadline is when the task must stop sleeping in the handler to leave it its
	// HandlerTime; zero: never.
	deadline time.Time
	// inline is when a task sleeping for a new booking or a slot must stop (the
	// MaxInlineWait bound), and kept when one that found its booking must; zero for
	// a task that cannot be handed back.
	inline, kept time.Time
}

// attempt reads the task's retry counters and deadline from ctx. Outside asynq (no
// counters in ctx) an attempt is not final: the caller gets the *ThrottledError.
func (c *config) attempt(ctx context.Context) attempt {
	retried, ok1 := asynq.GetRetryCount(ctx)
	maxRetry, ok2 := asynq.GetMaxRetry(ctx)
	a := attempt{final: ok1 && ok2 && retried >= maxRetry}
	a.handBack = !a.final || c.requeue != nil
	now := time.Now()
	if a.handBack {
		a.inline = now.Add(c.maxInline)
		a.kept = now.Add(max(c.maxInline, c.keptLimit()))
	}
	if dl, ok := ctx.Deadline(); ok {
		left := dl.Sub(now)
		keep := c.handlerTime
		if keep <= 0 {
			keep = left / 2
		}
		a.deadline = now.Add(max(left-keep, 0))
	}
	return a
}

// until returns the earlier of t and the attempt's deadline; zero: never.
func (a attempt) until(t time.Time) time.Time {
	if t.IsZero() || (!a.deadline.IsZero() && a.deadline.Before(t)) {
		return a.deadline
	}
	return t
}

// leftUntil is the time left until until(t); the largest duration for never.
func (a attempt) leftUntil(t time.Time) time.Duration {
	u := a.until(t)
	if u.IsZero() {
		return time.Duration(math.MaxInt64)
	}
	return max(time.Until(u), 0)
}

// inlineLeft is how much longer the task may sleep for a new booking or a slot.
func (a attempt) inlineLeft() time.Duration { return a.leftUntil(a.inline) }

// keptLeft is how much longer a task that found its booking may sleep for it.
func (a attempt) keptLeft() time.Duration { return a.leftUntil(a.kept) }

// inlineUntil is when a task sleeping for a new booking or a slot must stop; zero:
// never.
func (a attempt) inlineUntil() time.Time { return a.until(a.inline) }

// outageLeft is how much longer the task may try while Redis is unavailable: on a
// last attempt (which needs Redis to be requeued) until its deadline, else
// MaxInlineWait.
func (a attempt) outageLeft() time.Duration {
	if a.final {
		return a.leftUntil(time.Time{})
	}
	return a.inlineLeft()
}

// keptLimit is how long a task that found its booking may sleep: as early as asynq's
// precision may bring it back (a second and how early it was made due).
func (c *config) keptLimit() time.Duration {
	return time.Second + c.sh.cb.early(c.sh.checkInterval())
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
	if a.outageLeft() < o.backoff {
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
		err = c.requeue.requeue(ctx, t, a, te)
	} else {
		c.sh.handedBack(ctx)
	}
	if IsThrottled(err) {
		c.sh.handed.Add(1)
		if id, ok := asynq.GetTaskID(ctx); ok && te.Booked {
			c.sh.cb.handedBack(bookingID(id), te.Key, time.Now(), te.back, te.RetryIn)
		}
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
