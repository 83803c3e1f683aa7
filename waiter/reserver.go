package waiter

import (
	"cmp"
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/clock"
)

// Reserver books permits ahead. *throttle.Limiter is one.
//
// Reserve books n permits at the earliest time they are available that is not
// earlier than any booking already made, if that time comes within maxWait; the
// Reservation then reports OK and its Delay. Otherwise it books nothing: OK is false
// and Delay says when the n permits would be available. An error means nothing was
// booked: bad input (such as n above what can ever be granted at once) or a failure to
// reach the store. Implementations must be safe for simultaneous use.
type Reserver interface {
	Reserve(ctx context.Context, n int, maxWait time.Duration) (*Reservation, error)
}

// Reservation is a booking of permits that take effect at a time to come, or the
// answer that none could be booked in time. A Reservation is safe for simultaneous use.
type Reservation struct {
	ok        bool
	due       time.Time
	cancel    atomic.Pointer[func(ctx context.Context) error] // nil once used or given back
	cancelled atomic.Bool                                     // given back

	mu     sync.Mutex
	costed bool                                                   // booked on estimated costs
	settle func(ctx context.Context, actual map[string]int) error // nil once applied
}

// NewReservation returns a Reserver's answer: ok, permits booked to take effect delay
// from now, which cancel gives back (nil: there is nothing to give back); or, not ok,
// nothing booked, delay being when the permits would have come.
func NewReservation(ok bool, delay time.Duration, cancel func(ctx context.Context) error) *Reservation {
	r := &Reservation{ok: ok, due: clock.Now().Add(delay)}
	if ok && cancel != nil {
		r.cancel.Store(&cancel)
	}
	return r
}

// NewCostReservation is NewReservation for a booking made on estimated costs
// (throttle.Limiter's Cost and WaitCost): settle charges the actual costs in
// place of the estimates (see Settle).
func NewCostReservation(ok bool, delay time.Duration, cancel func(ctx context.Context) error,
	settle func(ctx context.Context, actual map[string]int) error) *Reservation {
	r := NewReservation(ok, delay, cancel)
	r.costed, r.settle = ok && settle != nil, settle
	return r
}

// Settle charges, for every process, the actual costs of a booking made on estimated
// ones (throttle.Limiter's Cost and WaitCost), by unit, in place of the estimates,
// at the booking's place: what the estimate overcharged goes back to the callers behind
// it, what it undercharged holds them back. A unit actual does not name keeps its
// estimate; one the estimate does not name holds no place of the booking, and a cost in
// it is the Reserver's invalid-argument error, nothing charged. Settle applies once: a second call, or one made again after an error (a
// reply lost on its way back), changes nothing more and returns nil; so does one after
// the booking was given back (Cancel). It returns an error wrapping ErrSettleTooLate,
// changing nothing, once the booking counts against no limit any more (after their
// longest period), ErrNotReserved for a reservation that booked nothing or no costs,
// and the store's error otherwise (Settle may then be called again).
func (r *Reservation) Settle(ctx context.Context, actual map[string]int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.costed {
		return ErrNotReserved
	}
	if r.settle == nil || r.cancelled.Load() {
		return nil
	}
	err := r.settle(ctx, actual)
	if err == nil || errors.Is(err, ErrSettleTooLate) {
		r.settle = nil
	}
	return err
}

// OK reports whether the permits were booked. When it is false nothing was booked and
// Delay tells when the permits would have been available.
func (r *Reservation) OK() bool { return r.ok }

// Delay returns how long from now until the booking takes effect (or, when OK is
// false, until the permits would have been available); 0 once that time has come.
// Like golang.org/x/time/rate's, it counts from the time of the call.
func (r *Reservation) Delay() time.Duration {
	return max(0, r.due.Sub(clock.Now()))
}

// Cancel gives the booked permits back if they have not taken effect yet, so a later
// caller can use them. Cancelling twice, after the booking took effect, or a
// reservation that is not OK does nothing and returns nil.
func (r *Reservation) Cancel(ctx context.Context) error {
	cancel := r.cancel.Swap(nil)
	if cancel == nil || !clock.Now().Before(r.due) {
		return nil
	}
	err := (*cancel)(ctx)
	r.cancelled.Store(err == nil)
	return err
}

// Wait sleeps until the booking takes effect. If ctx ends first, it returns ctx.Err()
// at once and gives the booking back in the background, once. A booking that takes
// effect after ctx's deadline counts as ended by the deadline, however late ctx's own
// timer runs: Wait returns an error matching context.DeadlineExceeded and gives it
// back, never nil for permits that come after the deadline. It returns ErrNotReserved
// at once for a reservation that is not OK.
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.ok {
		return ErrNotReserved
	}
	d := r.due.Sub(clock.Now())
	if d > 0 {
		// Due after ctx's deadline: the deadline ends the wait even if the timer is
		// seen first (the select picks either when both are ready, and a context's
		// deadline is closed by a goroutine of its own).
		late := d > clock.MaxWait(ctx)
		t := clock.NewTimer(d)
		defer t.Stop()
		var err error
		select {
		case <-t.C():
			if late {
				err = cmp.Or(ctx.Err(), context.DeadlineExceeded)
			}
		case <-ctx.Done():
			err = ctx.Err()
		}
		if err != nil {
			if cancel := r.cancel.Swap(nil); cancel != nil {
				r.cancelled.Store(true)
				go func() { _ = (*cancel)(context.WithoutCancel(ctx)) }()
			}
			return err
		}
	}
	r.cancel.Store(nil) // used: nothing is left to give back
	return nil
}

// Settle settles the booking a job queue's middleware (asynqmw's, rivermw's) made on the
// estimated costs of the job whose handler runs under ctx: Reservation.Settle's, with
// the actual costs the handler learned (an LLM answer's usage, say). A job that never
// settles keeps its estimate. It returns ErrNotReserved when ctx carries no such booking.
func Settle(ctx context.Context, actual map[string]int) error {
	settle := booking.SettleFrom(ctx)
	if settle == nil {
		return ErrNotReserved
	}
	return settle(ctx, actual)
}
