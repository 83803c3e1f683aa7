package waiter

import (
	"context"
	"fmt"

	"github.com/jobthrottle/jobthrottle/internal/clock"
)

// Wait books n permits from r and sleeps until they take effect: one call to r per
// permit batch, no polling. A Reserver that has its own WaitN (*throttle.Limiter, which
// also follows pauses and resumes of its key) waits with it.
//
// It returns ctx.Err() at once, booking nothing, if ctx is already done; an error
// wrapping ErrWouldExceedDeadline at once, booking nothing, if the permits would come
// after ctx's deadline; ctx.Err() at once if ctx ends while it sleeps, the booking
// being given back in the background. Errors from r are returned as they are.
func Wait(ctx context.Context, r Reserver, n int) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if w, ok := r.(interface {
		WaitN(context.Context, int) error
	}); ok {
		return w.WaitN(ctx, n)
	}
	res, err := r.Reserve(ctx, n, clock.MaxWait(ctx))
	if err != nil {
		return err
	}
	if !res.OK() {
		return fmt.Errorf("%w: n=%d would wait %v", ErrWouldExceedDeadline, n, res.Delay())
	}
	return res.Wait(ctx)
}
