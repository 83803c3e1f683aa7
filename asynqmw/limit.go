package asynqmw

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

// booking is a permit booked for a task.
type booking struct {
	r    *waiter.Reservation
	task *ib.Task
}

// book books lim's next permit under id, or finds the booking id has (kept: one
// handed back earlier, due at most late ago or ahead). With maxWait >= 0 it books
// only a permit due within maxWait (ok false otherwise); with maxWait < 0 it books
// however far ahead the permit is.
func book(ctx context.Context, lim *throttle.Limiter, id string, maxWait, late time.Duration) (b booking, kept bool, err error) {
	b.task = &ib.Task{ID: id}
	if maxWait < 0 {
		maxWait, b.task.Late = math.MaxInt64, late
	}
	b.r, err = lim.Reserve(ib.With(ctx, b.task), 1, maxWait)
	return b, b.task.Kept, err
}

// ok reports whether the permit is booked; delay is how long until it is due.
func (b booking) ok() bool             { return b.r.OK() }
func (b booking) delay() time.Duration { return b.r.Delay() }

// cancel gives the permit back.
func (b booking) cancel(ctx context.Context) { _ = b.r.Cancel(ctx) }

// wait sleeps until the permit is due; errMoved when it came due inside a hold of
// this process on the key (a Pause here): the task must not use it, and books again.
func (b booking) wait(ctx context.Context) error {
	if err := b.r.Wait(ctx); err != nil {
		return err
	}
	if held, err := b.task.Pass(ctx); err != nil || held {
		return cmp.Or(err, errMoved)
	}
	return nil
}

var errMoved = errors.New("asynqmw: booking moved")

// unavailable reports whether err means the limiter's or semaphore's Redis could not
// be reached (throttle.ErrUnavailable under the default FailClosed policy).
func unavailable(err error) bool { return errors.Is(err, throttle.ErrUnavailable) }

// semInfo returns the semaphore's key and the limit as a ThrottledError names it.
func semInfo(sem *throttle.Semaphore) (key, limit string) {
	return sem.Key(), fmt.Sprintf("%d in flight", sem.Max())
}

// tryLease takes a lease of sem for the task under id now, or keeps id's place in
// sem's queue and returns a nil lease and the time until a slot would free by
// expiry alone. With no id (outside an asynq server) it keeps no place.
func tryLease(ctx context.Context, sem *throttle.Semaphore, id string) (*throttle.Lease, time.Duration, error) {
	if id == "" {
		return sem.TryAcquire(ctx)
	}
	return sem.TryAcquire(ib.With(ctx, &ib.Task{ID: id}))
}

// waitLease waits in id's place in sem's queue for a lease; with no id (outside an
// asynq server) in a place of its own, given up when ctx ends.
func waitLease(ctx context.Context, sem *throttle.Semaphore, id string) (*throttle.Lease, error) {
	if id == "" {
		return sem.Acquire(ctx)
	}
	return sem.Acquire(ib.With(ctx, &ib.Task{ID: id}))
}

// hold runs fn under the lease (renewed while fn runs, released when it returns).
func hold(ctx context.Context, l *throttle.Lease, fn func(context.Context) error) error {
	return l.Hold(ctx, fn)
}

// release gives the lease back unused.
func release(ctx context.Context, l *throttle.Lease) { _ = l.Release(ctx) }
