package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
)

var _ waiter.Reserver = (*Limiter)(nil)

// maxWaitMicros is the largest wait a script takes (2^53 - 1 µs, about 285 years).
const maxWaitMicros = 1<<53 - 1

// Reserve books n permits at the earliest time they are available that is not earlier
// than any booking already made on the key (first come, first served across every
// process), if that time comes within maxWait. The reservation then reports OK, and
// Delay says how long until the permits take effect; they count against the limit
// from then. Otherwise nothing is booked, OK is false and Delay says when n permits
// would be available.
//
// Give back a booking you will not use with the reservation's Cancel; wait for it
// with its Wait, which books again by itself if this process pauses the key first
// (see Pause). Every algorithm supports booking ahead. The token bucket books at
// most 2^50/Rate µs ahead (18 minutes at a million per period); a longer maxWait is
// cut to that.
//
// Errors are those of AllowN, ErrInvalidArgument for a negative maxWait, and
// waiter.ErrNilReserver for a nil *Limiter (so a waiter.Transport given one sends
// nothing).
func (l *Limiter) Reserve(ctx context.Context, n int, maxWait time.Duration) (*waiter.Reservation, error) {
	if l == nil { // a nil *Limiter in a Reserver: the transport sends nothing
		return nil, fmt.Errorf("%w: nil *throttle.Limiter", waiter.ErrNilReserver)
	}
	return l.reserve(ctx, n, maxWait, nil)
}

// reserve is Reserve; w, when not nil, is told when the booking makes its caller wait.
func (l *Limiter) reserve(ctx context.Context, n int, maxWait time.Duration, w *sleepWatch) (*waiter.Reservation, error) {
	if err := l.checkN(n); err != nil {
		return nil, err
	}
	if maxWait < 0 {
		return nil, fmt.Errorf("%w: maxWait %v", ErrInvalidArgument, maxWait)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	moved := l.hold.signal() // before the call: a hold that begins during it moves the booking
	r, err := l.call(ctx, opAcquire, n, min(int64(maxWait/time.Microsecond), maxWaitMicros))
	if err != nil {
		return nil, err
	}
	l.report(n, r)
	b := waiter.Booking{OK: r.granted, Delay: r.wait, Clock: l.clock, Moved: moved, Pass: l.Pass,
		Again: func(ctx context.Context, maxWait time.Duration) (*waiter.Reservation, error) {
			return l.reserve(ctx, n, maxWait, w)
		}}
	if w != nil {
		b.Pass = w.Pass
		w.slept = w.slept || r.granted && r.wait > 0
	}
	if r.granted && r.wait > 0 {
		token := r.token
		b.Cancel = func(ctx context.Context) error { return l.cancel(ctx, n, token) }
		if r.local { // booked in FailLocal's share: give it back there
			b.Cancel = func(context.Context) error {
				l.local.cancel(l.clock.Now().UnixMicro(), token, n)
				return nil
			}
		}
	}
	return waiter.NewReservation(b), nil
}

// cancel gives back n permits booked to take effect at token (server time, µs).
func (l *Limiter) cancel(ctx context.Context, n int, token int64) error {
	r, err := l.call(ctx, opCancel, n, token)
	if err != nil {
		return err
	}
	if r.granted && l.hooks.Cancelled != nil {
		l.hooks.Cancelled(l.key, n)
	}
	return nil
}

// Wait is shorthand for WaitN(ctx, 1).
func (l *Limiter) Wait(ctx context.Context) error {
	return l.WaitN(ctx, 1)
}

// WaitN books n permits and sleeps until they take effect: one Redis call, however
// many callers wait, served in arrival order across every process.
//
// It returns at once, booking nothing: an error wrapping ErrExceedsLimit for n above
// what the limit can ever grant; ctx.Err() for a done context (without calling
// Redis); and an error wrapping waiter.ErrWouldExceedDeadline when the permits would
// come after ctx's deadline. If ctx ends while it sleeps it gives the booking back
// and returns ctx.Err(). If this process pauses the key while it sleeps, it gives
// the booking back and books again when the hold ends; called while this process
// holds the key, it books when the hold ends (see Pause).
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	if err := l.checkN(n); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if l.hooks.Waited == nil {
		return waiter.Wait(ctx, l, n)
	}
	start := l.clock.Now()
	w := &sleepWatch{l: l}
	err := waiter.Wait(ctx, w, n)
	if err == nil && w.slept {
		l.hooks.Waited(l.key, n, l.clock.Now().Sub(start))
	}
	return err
}

// sleepWatch is the limiter as WaitN's Reserver, noting whether the caller had to
// wait: for a booking ahead, or for a hold. One WaitN uses it, from one goroutine.
type sleepWatch struct {
	l     *Limiter
	slept bool
}

func (w *sleepWatch) Reserve(ctx context.Context, n int, maxWait time.Duration) (*waiter.Reservation, error) {
	return w.l.reserve(ctx, n, maxWait, w)
}

// Pass is the limiter's Pass, noting a hold the caller waited for.
func (w *sleepWatch) Pass(ctx context.Context) (bool, error) {
	held, err := w.l.Pass(ctx)
	w.slept = w.slept || held
	return held, err
}
