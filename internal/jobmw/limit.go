package jobmw

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	ib "github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Limit is what a middleware needs to know of a limiter besides booking from it.
type Limit struct {
	Key   string
	Desc  string        // "20 per 1s and 500 per 1h0m0s"
	Grace time.Duration // how long after its slot a returning job may still run on it
	// Paced are the limits the pacer keeps each process's starts within; nil for a
	// token bucket (it may grant Burst at once) or a limit above maxPacedRate.
	Paced []PeriodRate
}

// PeriodRate is one limit: Rate starts in any window of Period.
type PeriodRate struct {
	Rate   int
	Period time.Duration
}

// InfoOf returns what a middleware needs to know of lim, given how long after its
// slot a returning job may still run on it (grace, bounded here by a quarter of the
// limit's shortest period).
func InfoOf(lim *throttle.Limiter, grace time.Duration) Limit {
	limits := lim.Limits()
	s := make([]string, len(limits))
	li := Limit{Key: lim.Key(), Grace: grace}
	paced := lim.Algorithm() != throttle.TokenBucket
	for i, l := range limits {
		s[i] = l.String()
		li.Grace = min(li.Grace, l.Period/4)
		if l.Rate > maxPacedRate {
			paced = false
		}
		li.Paced = append(li.Paced, PeriodRate{l.Rate, l.Period})
	}
	li.Desc = strings.Join(s, " and ")
	if !paced {
		li.Paced = nil
	}
	return li
}

// Booking is a permit booked for a job.
type Booking struct {
	r    *waiter.Reservation
	task *ib.Task
}

// Book books lim's next permit under id, or finds the booking id has (kept: one
// handed back earlier, due at most late ago or ahead). With maxWait >= 0 it books
// only a permit due within maxWait (OK false otherwise); with maxWait < 0 it books
// however far ahead the permit is.
func Book(ctx context.Context, lim *throttle.Limiter, id string, maxWait, late time.Duration) (b Booking, kept bool, err error) {
	b.task = &ib.Task{ID: id}
	if maxWait < 0 {
		maxWait, b.task.Late = math.MaxInt64, late
	}
	b.r, err = lim.Reserve(ib.With(ctx, b.task), 1, maxWait)
	return b, b.task.Kept, err
}

// OK reports whether the permit is booked; Delay is how long until it is due.
func (b Booking) OK() bool             { return b.r.OK() }
func (b Booking) Delay() time.Duration { return b.r.Delay() }

// Cancel gives the permit back.
func (b Booking) Cancel(ctx context.Context) { _ = b.r.Cancel(ctx) }

// Settle settles a booking of estimated costs (waiter.Reservation's Settle).
func (b Booking) Settle(ctx context.Context, actual map[string]int) error {
	return b.r.Settle(ctx, actual)
}

// Wait sleeps until the permit is due, giving it back if ctx ends first; ErrMoved when
// it came due inside a hold of this process on the key (a Pause here): the job must
// not use it, and books again. A booking not made (a tenant's turn has not come: its
// place is kept under the job's ID) is slept for and asked again: ErrMoved too.
func (b Booking) Wait(ctx context.Context) error {
	if !b.OK() {
		return cmp.Or(Sleep(ctx, b.Delay()), ErrMoved)
	}
	if err := b.r.Wait(ctx); err != nil {
		return err
	}
	if held, err := b.task.Pass(ctx); err != nil || held {
		return cmp.Or(err, ErrMoved)
	}
	return nil
}

// ErrMoved is Wait's error for a booking to ask for again.
var ErrMoved = errors.New("jobthrottle: booking moved, or its turn came: ask again")

// Unavailable reports whether err means the limiter's or semaphore's Redis could not
// be reached (throttle.ErrUnavailable under the default FailClosed policy).
func Unavailable(err error) bool { return errors.Is(err, throttle.ErrUnavailable) }

// SemInfo returns the semaphore's key and the limit as a ThrottledError names it.
func SemInfo(sem *throttle.Semaphore) (key, limit string) {
	return sem.Key(), fmt.Sprintf("%d in flight", sem.Max())
}

// TryLease takes a lease of sem for the job under id now, or keeps id's place in
// sem's queue and returns a nil lease and the time until a slot would free by
// expiry alone. With no id (a job outside a queue's server) it keeps no place.
func TryLease(ctx context.Context, sem *throttle.Semaphore, id string) (*throttle.Lease, time.Duration, error) {
	if id == "" {
		return sem.TryAcquire(ctx)
	}
	return sem.TryAcquire(ib.With(ctx, &ib.Task{ID: id}))
}

// WaitLease waits in id's place in sem's queue for a lease; with no id (a job outside
// a queue's server) in a place of its own, given up when ctx ends.
func WaitLease(ctx context.Context, sem *throttle.Semaphore, id string) (*throttle.Lease, error) {
	if id == "" {
		return sem.Acquire(ctx)
	}
	return sem.Acquire(ib.With(ctx, &ib.Task{ID: id}))
}
