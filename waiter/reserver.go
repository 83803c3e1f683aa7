package waiter

import (
	"context"
	"fmt"
	"math"
	"sync"
	"time"

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
	// effect at its time (this process paused the Reserver, see Gate): Wait then gives
	// it back and books again through Again once Pass lets it.
	Moved <-chan struct{}
	// Pass, when not nil, waits while this process holds the Reserver back and reports
	// whether it did (see Gate.Pass). Wait calls it once the booking has taken effect:
	// permits that took effect inside a hold are not used, Wait books again.
	Pass func(ctx context.Context) (held bool, err error)
	// Again books the same permits again, if they come within maxWait; Wait calls it
	// after a move or a hold. Nil means the booking cannot be made again by itself:
	// Wait returns ErrMoved instead.
	Again func(ctx context.Context, maxWait time.Duration) (*Reservation, error)
	// Clock is the clock Delay counts from; nil, the only value outside this module,
	// means the system's (throttle's tests set theirs).
	Clock clock.Clock
}

// Reservation is a booking of permits that take effect at a time to come. Create
// one with NewReservation (Reservers do); wait for it with Wait or Reservation.Wait.
//
// A Reservation is safe for simultaneous use by multiple goroutines.
type Reservation struct {
	ok     bool
	due    time.Time
	clock  clock.Clock
	moved  <-chan struct{}
	pass   func(ctx context.Context) (bool, error)
	again  func(ctx context.Context, maxWait time.Duration) (*Reservation, error)
	mu     sync.Mutex
	cancel func(ctx context.Context) error // nil once used or given up
}

// NewReservation returns the Reservation for b; its delay counts from now (by b.Clock).
func NewReservation(b Booking) *Reservation {
	c := b.Clock
	if c == nil {
		c = clock.System
	}
	r := &Reservation{ok: b.OK, clock: c, moved: b.Moved, pass: b.Pass, again: b.Again, due: c.Now().Add(b.Delay)}
	if b.OK {
		r.cancel = b.Cancel
	}
	return r
}

// OK reports whether the permits were booked. When it is false nothing was booked and
// Delay tells when the permits would have been available.
func (r *Reservation) OK() bool { return r.ok }

// Delay returns how long from now until the booking takes effect (or, when OK is
// false, until the permits would have been available); 0 once that time has come.
// Like golang.org/x/time/rate's, it counts from the time of the call:
// time.Sleep(r.Delay()) after some work sleeps only the rest.
func (r *Reservation) Delay() time.Duration {
	return max(0, r.due.Sub(r.clock.Now()))
}

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
// back and returns ctx.Err(); it returns ErrNotReserved at once for a reservation
// that is not OK.
//
// If this process pauses the Reserver while Wait sleeps (see Gate), Wait gives the
// booking back, waits for the hold to end and books the permits again, as often as it
// takes; so does a booking that took effect inside a hold (its permits are not used).
// Booking again, it returns an error wrapping ErrWouldExceedDeadline if the permits
// would come after ctx's deadline, and the Reserver's errors. A Reserver that cannot
// book again by itself (Booking.Again is nil) makes Wait return ErrMoved instead,
// after giving the booking back.
func (r *Reservation) Wait(ctx context.Context) error {
	if !r.ok {
		return ErrNotReserved
	}
	for {
		moved, err := r.sleep(ctx)
		if err != nil {
			return err
		}
		held := false
		if !moved && r.pass != nil {
			if held, err = r.pass(ctx); err != nil {
				return err
			}
		}
		switch {
		case !moved && !held:
			return nil
		case r.again == nil:
			return ErrMoved
		case moved && r.pass != nil:
			// Book again only once the hold is over: by then every waiter of the
			// process has given its booking back, so none books behind one about to go.
			if _, err := r.pass(ctx); err != nil {
				return err
			}
		}
		next, err := r.again(ctx, maxWait(ctx))
		if err != nil {
			return err
		}
		if !next.OK() {
			return fmt.Errorf("%w: would wait %v", ErrWouldExceedDeadline, next.Delay())
		}
		r = next
	}
}

// sleep waits until the booking is due; it reports whether it was moved first (and
// then given back).
func (r *Reservation) sleep(ctx context.Context) (moved bool, err error) {
	d := r.due.Sub(r.clock.Now())
	if d <= 0 {
		r.settle()
		return false, nil
	}
	t := r.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		r.settle()
		return false, nil
	case <-ctx.Done():
		r.giveBack()
		return false, ctx.Err()
	case <-r.moved:
		if r.wasDue() {
			// the booking came due as the move arrived: it has taken effect, and
			// giving it back would do nothing but leave its permit unused
			r.settle()
			return false, nil
		}
		r.giveBack()
		return true, nil
	}
}

// wasDue reports whether the booking has taken effect.
func (r *Reservation) wasDue() bool { return !r.clock.Now().Before(r.due) }

// maxWait is how long ctx lets a caller wait: until its deadline, or for ever.
func maxWait(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(0, time.Until(dl))
	}
	return time.Duration(math.MaxInt64)
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
