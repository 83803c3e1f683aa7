package asynqmw

import (
	"errors"
	"fmt"
	"time"
)

// nilArgument is the error a Setup's method panics with when given nil (as asynq's
// ServeMux.Handle panics on a nil handler): the mistake shows when the server is
// built, not as failed tasks.
func nilArgument(call string) error { return fmt.Errorf("asynqmw: %s(nil)", call) }

// ThrottledError says why a task did not run yet and when it will: the middleware
// hands it back to asynq with it (see Setup.Config) and passes it to Hooks.Throttled.
// Test for it with errors.As or IsThrottled.
//
// For a limiter of 20 per second whose bookings reach 7.3 s ahead, a task gets
// RetryIn 7.3s, Booked, Key the limiter's key and Limit "20 per 1s": it comes back
// about a second before its slot, and sleeps the rest.
type ThrottledError struct {
	// RetryIn is when the permit (or, for Concurrency, a slot) would be available if
	// nobody else took it first: the limiter's wait, or the time until the earliest
	// lease of a full semaphore expires (a release may free a slot sooner).
	RetryIn time.Duration

	// Key is the limiter's or the semaphore's key (without prefix).
	Key string

	// Limit describes the limit that was reached: "20 per 1s", "20 per 1s and 500 per
	// 1h0m0s", or "5 in flight".
	Limit string

	// Requeued reports whether the task, on its last attempt, was handed back as a
	// copy enqueued in its queue rather than through asynq's retry (see Setup.Config).
	Requeued bool

	// Booked reports whether the permit is booked for the task, RetryIn from now: when
	// it comes back (the same task, or its requeued copy) it runs on that booking.
	Booked bool

	// back is when the middleware wants a booked task due again (see comeBack).
	back time.Duration
	// retention is the requeued task's Retention: asynq ends the original as revoked
	// rather than done when it is set (see finish).
	retention time.Duration

	// Err, when not nil, is why no permit could be had other than the limit: Redis
	// was unavailable (an error wrapping throttle.ErrUnavailable). Unwrap returns it,
	// so errors.Is(err, throttle.ErrUnavailable) holds for such a *ThrottledError.
	Err error
}

// Error returns a message such as `asynqmw: throttled by "vendor-api" (20 per 1s): retry in 7.3s`.
func (e *ThrottledError) Error() string {
	verb := "retry"
	if e.Requeued {
		verb = "requeued to run"
	}
	if e.Err != nil {
		return fmt.Sprintf("asynqmw: throttled by %q (%s): %v: %s in %v", e.Key, e.Limit, e.Err, verb, e.RetryIn)
	}
	return fmt.Sprintf("asynqmw: throttled by %q (%s): %s in %v", e.Key, e.Limit, verb, e.RetryIn)
}

// Unwrap returns Err: the cause when Redis was unavailable, else nil.
func (e *ThrottledError) Unwrap() error { return e.Err }

// IsThrottled reports whether err is, or wraps, a *ThrottledError: the task did not
// run because of a limit, and will run later.
func IsThrottled(err error) bool {
	_, ok := throttled(err)
	return ok
}

// throttled returns the *ThrottledError err is or wraps.
func throttled(err error) (*ThrottledError, bool) {
	var te *ThrottledError
	ok := errors.As(err, &te)
	return te, ok
}
