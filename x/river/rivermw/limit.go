package rivermw

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	ib "github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// This file is the only one that calls package throttle (and the waiter types its
// calls return): the rest of the package sees a limit's description, a booking and a
// lease.

// booking is a permit booked for a job.
type booking struct {
	r    *waiter.Reservation
	task *ib.Task
}

// book books lim's next permit under id, however far ahead it is, or finds the
// booking id has (kept: one made earlier, due at most late ago or ahead).
func book(ctx context.Context, lim *throttle.Limiter, id string, late time.Duration) (b booking, kept bool, err error) {
	b.task = &ib.Task{ID: id, Late: late}
	b.r, err = lim.Reserve(ib.With(ctx, b.task), 1, math.MaxInt64)
	return b, b.task.Kept, err
}

// delay is how long until the permit is due.
func (b booking) delay() time.Duration { return b.r.Delay() }

// wait sleeps until the permit is due, giving it back if ctx ends first; errMoved when
// it came due inside a hold of this process on the key (a Pause here): the job must
// not use it, and books again. A booking not made (a tenant's turn has not come: its
// place is kept under the job's ID) is slept for and asked again: errMoved too.
func (b booking) wait(ctx context.Context) error {
	if !b.r.OK() {
		t := time.NewTimer(b.r.Delay())
		defer t.Stop()
		select {
		case <-t.C:
			return errMoved
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := b.r.Wait(ctx); err != nil {
		return err
	}
	if held, err := b.task.Pass(ctx); err != nil || held {
		return cmp.Or(err, errMoved)
	}
	return nil
}

var errMoved = errors.New("rivermw: booking moved, or its turn came: ask again")

// unavailable reports whether err means the limiter's or semaphore's Redis could not
// be reached (throttle.ErrUnavailable under the default FailClosed policy).
func unavailable(err error) bool { return errors.Is(err, throttle.ErrUnavailable) }

// semInfo returns the semaphore's key and the limit as a ThrottledError names it.
func semInfo(sem *throttle.Semaphore) (key, limit string) {
	return sem.Key(), fmt.Sprintf("%d in flight", sem.Max())
}

// tryLease takes a lease of sem for the job now, or keeps the job's place in sem's
// queue (named by id) and returns a nil lease and the time until a slot would free
// by expiry alone.
func tryLease(ctx context.Context, sem *throttle.Semaphore, id string) (*throttle.Lease, time.Duration, error) {
	return sem.TryAcquire(ib.With(ctx, &ib.Task{ID: id}))
}

// waitLease waits in the job's place in sem's queue for a lease.
func waitLease(ctx context.Context, sem *throttle.Semaphore, id string) (*throttle.Lease, error) {
	return sem.Acquire(ib.With(ctx, &ib.Task{ID: id}))
}

// hold runs fn under the lease (renewed while fn runs, released when it returns).
func hold(ctx context.Context, l *throttle.Lease, fn func(context.Context) error) error {
	return l.Hold(ctx, fn)
}

// release gives the lease back unused.
func release(ctx context.Context, l *throttle.Lease) { _ = l.Release(ctx) }
