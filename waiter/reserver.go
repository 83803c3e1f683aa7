package waiter

import (
	"context"
	"sync"
	"time"
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

// Booking is what a Reserver booked; NewReservation makes a Reservation of it.
type Booking struct {
	// OK reports whether the permits were booked.
	OK bool
	// Delay is the time from now until the booking takes effect (OK), or until the
	// permits would be available (not OK).
	Delay time.Duration
	// Cancel gives the booked permits back, so a later caller can use them. It is called
	// at most once, and only for a booking that was made and has not yet taken effect
	// by Clock. Nil means there is nothing to give back.
	Cancel func(ctx context.Context) error
	// Moved, when not nil, is closed if the booking can no longer be trusted to take
	// effect at its time (for example because the key was paused): a waiter then gives
	// it back and books again.
	Moved <-chan struct{}
	// Clock is the clock Delay counts from; nil means SystemClock.
	Clock Clock
}

// Reservation is a booking of permits that take effect after a delay. Create one
// with NewReservation (Reservers do); wait for it with Wait or Reservation.Wait.
//
// A Reservation is safe for simultaneous use by multiple goroutines.
type Reservation struct {
	ok     bool
	delay  time.Duration
	due    time.Time
	clock  Clock
	moved  <-chan struct{}
	mu     sync.Mutex
	cancel func(ctx context.Context) error // nil once used or given up
}

// NewReservation returns the Reservation for b; its delay counts from now (by b.Clock).
func NewReservation(b Booking) *Reservation {
	c := b.Clock
	if c == nil {
		c = SystemClock
	}
	r := &Reservation{ok: b.OK, delay: b.Delay, clock: c, moved: b.Moved, due: c.Now().Add(b.Delay)}
	if b.OK {
		r.cancel = b.Cancel
	}
	return r
}

// OK reports whether the permits were booked. When it is false nothing was booked and
// Delay tells when the permits would have been available.
func (r *Reservation) OK() bool { return r.ok }

// Delay returns how long after the reservation was made the booking takes effect (or,
// when OK is false, the permits would be available).
func (r *Reservation) Delay() time.Duration { return r.delay }

// Due returns the time, by the Reserver's clock, at which the booking takes effect.
func (r *Reservation) Due() time.Time { return r.due }

// Cancel gives the booked permits back if they have not taken effect yet, so a later
// caller can use them. Cancelling twice, after the booking took effect, or a
// reservation that is not OK does nothing and returns nil.
func (r *Reservation) Cancel(ctx context.Context) error {
	r.mu.Lock()
	cancel := r.cancel
	r.cancel = nil
	r.mu.Unlock()
	if cancel == nil || !r.clock.Now().Before(r.due) {
		return nil
	}
	return cancel(ctx)
}

// Wait sleeps until the booking takes effect. If ctx ends first, it gives the booking
// back and returns ctx.Err(). It returns ErrMoved, after giving the booking back, if
// the Reserver moved the booking (book again); and ErrNotReserved at once for a
// reservation that is not OK.
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.ok {
		return ErrNotReserved
	}
	d := r.due.Sub(r.clock.Now())
	if d <= 0 {
		r.settle()
		return nil
	}
	t := r.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		r.settle()
		return nil
	case <-ctx.Done():
		r.giveBack()
		return ctx.Err()
	case <-r.moved:
		if !r.clock.Now().Before(r.due) {
			// the booking came due as the move arrived: it has taken effect, and
			// giving it back would do nothing but leave its permit unused
			r.settle()
			return nil
		}
		r.giveBack()
		return ErrMoved
	}
}

// settle marks a booking as used: nothing is left to give back.
func (r *Reservation) settle() {
	r.mu.Lock()
	r.cancel = nil
	r.mu.Unlock()
}

// giveBack cancels the booking with a context of its own: the caller's is done.
func (r *Reservation) giveBack() {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	_ = r.Cancel(ctx)
}

// cancelTimeout bounds the call that gives a booking back after the caller gave up.
const cancelTimeout = 2 * time.Second
