package asynqmw

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
)

// IsFailure reports whether err is a failure, for asynq.Config.IsFailure: it is false
// for a *ThrottledError (or an error wrapping one) and for nil, true otherwise. asynq
// then neither spends one of the task's retries on a throttled task nor counts it as
// processed or failed in the queue's stats.
//
// To combine it with a predicate of your own:
//
//	IsFailure: func(err error) bool { return asynqmw.IsFailure(err) && myIsFailure(err) },
func IsFailure(err error) bool {
	return err != nil && !IsThrottled(err)
}

// RetryDelay returns a function for asynq.Config.RetryDelayFunc: for a
// *ThrottledError with a booking (Booked), the delay that has the task in a worker
// by its slot: RetryIn less how late the server may bring a due task to a worker (as
// the middleware knows it, see CheckInterval) and 20ms, or less how late this
// server's returns have been of late when that is more (up to half a second more), at
// least 0; for one without, RetryIn rounded
// up to whole seconds (at least one) plus a random jitter of up to a tenth of
// RetryIn, at least a second; for any other error, fallback's answer. A nil fallback
// means asynq.DefaultRetryDelayFunc.
//
// asynq stores a retry time in whole seconds, truncated, so a task may come back up to
// a second before RetryIn has passed (it then sleeps the rest in the handler, if
// MaxInlineWait allows); the jitter spreads a herd throttled at the same moment over
// a few seconds instead of bringing it back in the same one.
func RetryDelay(fallback asynq.RetryDelayFunc) asynq.RetryDelayFunc {
	if fallback == nil {
		fallback = asynq.DefaultRetryDelayFunc
	}
	return func(n int, err error, t *asynq.Task) time.Duration {
		if te, ok := throttled(err); ok {
			if te.Booked {
				return te.back
			}
			return retryDelay(te.RetryIn)
		}
		return fallback(n, err, t)
	}
}

// retryDelay rounds d up to whole seconds, at least one, and adds jitter.
func retryDelay(d time.Duration) time.Duration {
	whole := max((d+time.Second-1)/time.Second, 1) * time.Second
	return whole + rand.N(max(d/10, time.Second))
}

// SkipThrottled returns an asynq.ErrorHandler that calls h for every error except
// throttling (see IsThrottled): asynq calls Config.ErrorHandler for every error a
// handler returns, throttled tasks included. A nil h gives a nil ErrorHandler.
func SkipThrottled(h asynq.ErrorHandler) asynq.ErrorHandler {
	if h == nil {
		return nil
	}
	return asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
		if !IsThrottled(err) {
			h.HandleError(ctx, t, err)
		}
	})
}
