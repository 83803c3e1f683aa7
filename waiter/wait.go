package waiter

import (
	"context"
	"fmt"
	"time"
)

// Wait books n permits from r and sleeps until they take effect: one call to r per
// permit batch, no polling.
//
// It returns ctx.Err() at once, booking nothing, if ctx is already done; and
// an error wrapping ErrWouldExceedDeadline at once, booking nothing, if the permits
// would come after ctx's deadline. Otherwise it waits as Reservation.Wait does: if
// ctx ends while it sleeps, it gives the booking back and returns ctx.Err(); if r is
// a Gate and holds this process back, it books again after the hold. Errors from r
// (bad n, the store unreachable) are returned as they are.
//
// If r is a Gate that holds this process back when Wait is called, Wait first waits
// for the hold to end (Pass) and books then, as the waiters the hold moved do: a
// booking made inside the hold could land behind a slot another waiter is about to
// give back, and that slot, at the pause's end, would go unused.
func Wait(ctx context.Context, r Reserver, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g, _ := r.(passer)
	if g != nil {
		if _, err := g.Pass(ctx); err != nil {
			return err
		}
	}
	res, err := r.Reserve(ctx, n, maxWait(ctx))
	if err != nil {
		return err
	}
	if !res.OK() {
		return fmt.Errorf("%w: n=%d would wait %v", ErrWouldExceedDeadline, n, res.Delay())
	}
	// A Reserver that does not say how to book again (Booking.Again) books again the
	// way it booked first; a Gate's hold is passed (Booking.Pass).
	if res.again == nil {
		res.again = func(ctx context.Context, maxWait time.Duration) (*Reservation, error) {
			return r.Reserve(ctx, n, maxWait)
		}
	}
	if g != nil && res.pass == nil {
		res.pass = g.Pass
	}
	return res.Wait(ctx)
}
