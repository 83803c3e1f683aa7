package waiter

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"
)

// Wait books n permits from r and sleeps until they take effect: one call to r per
// permit batch, no polling.
//
// It returns ctx.Err() at once, booking nothing, if ctx is already done; and
// an error wrapping ErrWouldExceedDeadline at once, booking nothing, if the permits
// would come after ctx's deadline. If ctx ends while it sleeps, it gives the booking
// back and returns ctx.Err(). Errors from r (bad n, the store unreachable) are
// returned as they are.
//
// If r is a Gate, Wait passes its gate once the booking has taken effect: permits
// that took effect while this process was held (a pause began meanwhile, see Gate)
// are not used; Wait books again after the hold. It books without waiting for a hold
// to end: the store places the booking after the pause that came with the hold, so
// the first permits after it take effect when it ends.
func Wait(ctx context.Context, r Reserver, n int) error {
	g, _ := r.(passer)
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		maxWait := time.Duration(math.MaxInt64)
		if dl, ok := ctx.Deadline(); ok {
			maxWait = time.Until(dl)
			if maxWait < 0 {
				maxWait = 0
			}
		}
		res, err := r.Reserve(ctx, n, maxWait)
		if err != nil {
			return err
		}
		if !res.OK() {
			return fmt.Errorf("%w: n=%d would wait %v", ErrWouldExceedDeadline, n, res.Delay())
		}
		err = res.Wait(ctx)
		if errors.Is(err, ErrMoved) {
			continue
		}
		if err != nil || g == nil {
			return err
		}
		held, err := g.Pass(ctx)
		if err != nil || !held {
			return err
		}
		// the permits took effect inside a hold: they are spent, unused; book again
	}
}
