package asynqmw

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/hibiken/asynq"
)

// This file is what asynq sees of a throttled task: the error the Setup's outermost
// middleware returns (finish) and the Config functions that read it.

// finish turns what the Setup's middlewares returned for the attempt a into what
// asynq gets. A task on its last attempt whose copy was enqueued (Requeued) must leave
// asynq without being archived: asynq archives a task whose retries are used up on
// any error before it asks IsFailure (processor.go, handleFailedMessage), and only a
// nil error or asynq.RevokeTask end it otherwise, both by deleting it (markAsDone).
// nil does so silently; RevokeTask is logged at warn level for every task. So the
// original returns nil, unless it has a Retention: a nil error would then keep it as
// completed (markAsComplete) though it never ran, and RevokeTask it is. A copy's
// failure is archived at once (lastAttempt), as the original's would have been: the
// copy's retry is for its worker's death only (see requeuer).
func finish(a attempt, err error) error {
	te, ok := throttled(err)
	switch {
	case err == nil:
		return nil
	case ok && te.Requeued && te.retention > 0:
		return fmt.Errorf("%w (%w)", err, asynq.RevokeTask)
	case ok && te.Requeued:
		return nil
	case !ok && a.copy:
		return lastAttempt{err}
	}
	return err
}

// lastAttempt is the error of a last attempt's copy: its own, which asynq archives
// at once (it wraps asynq.SkipRetry too).
type lastAttempt struct{ error }

func (e lastAttempt) Unwrap() []error { return []error{e.error, asynq.SkipRetry} }

// isFailure is Config's IsFailure: false for a throttled task, so asynq neither
// spends one of its retries nor counts it as processed or failed.
func isFailure(err error) bool {
	return err != nil && !IsThrottled(err)
}

// retryDelayFunc is Config's RetryDelayFunc: for a booked *ThrottledError, the delay
// that has the task in a worker just before its slot (see comeBack); for one without
// a booking (a semaphore's, Redis unavailable), its RetryIn rounded up to whole
// seconds plus a jitter (see retryDelay); for any other error, fallback's, or asynq's
// default.
func retryDelayFunc(fallback asynq.RetryDelayFunc) asynq.RetryDelayFunc {
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

// retryDelay rounds d up to whole seconds, at least one, and adds a jitter of up to a
// tenth of d, at least a second: a herd throttled at the same moment without a
// booking comes back over a few seconds rather than in the same one.
func retryDelay(d time.Duration) time.Duration {
	whole := max((d+time.Second-1)/time.Second, 1) * time.Second
	return whole + rand.N(max(d/10, time.Second))
}

// skipThrottled is Config's ErrorHandler: h for every error but throttling (asynq
// calls the ErrorHandler for every error a handler returns); nil for a nil h.
func skipThrottled(h asynq.ErrorHandler) asynq.ErrorHandler {
	if h == nil {
		return nil
	}
	return asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
		if !IsThrottled(err) {
			h.HandleError(ctx, t, err)
		}
	})
}
