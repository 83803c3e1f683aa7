package asynqmw

import (
	"errors"
	"fmt"
	"time"
)

// ErrNilArgument: Throttle was given a nil limiter, ThrottleFunc a nil pick function,
// Concurrency a nil semaphore, or New a nil client. The constructor panics with an
// error wrapping it (as asynq's ServeMux.Handle panics on a nil handler), so the
// mistake shows when the server is built, not as failed tasks.
var ErrNilArgument = errors.New("asynqmw: nil limiter, semaphore, client or pick function")

// nilArgument is the error the constructor call panics with when given nil.
func nilArgument(call string) error { return fmt.Errorf("%w: %s(nil)", ErrNilArgument, call) }

// ErrInvalidOption: an option out of range, such as a negative MaxInlineWait. The
// constructor that was given it panics with an error wrapping ErrInvalidOption.
var ErrInvalidOption = errors.New("asynqmw: invalid option")

// ThrottledError is what the middleware returns when a task must wait longer than it
// may sleep in the handler: the task did not run; inside an asynq server its permit
// is booked (Booked), outside nothing is. Setup.Config (or IsFailure and RetryDelay
// wired by hand) makes asynq retry it without counting a failure. Test for it with
// errors.As.
//
// For a limiter of 20 per second whose bookings already reach 7.3 s ahead, with the
// default MaxInlineWait of 1.5 s, a task gets RetryIn 7.3s, Booked, Key the limiter's
// key and Limit "20 per 1s"; with Setup.Config's intervals RetryDelay then makes it
// due in 7.08 s (earlier on a server whose returns have come late), which asynq
// rounds down to whole seconds: it is back in a worker 0.2 to 1.2 s before its slot,
// and sleeps the rest.
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

	// Requeued reports whether the task was handed back to its queue as a copy (see
	// Requeue) rather than left to asynq's retry.
	Requeued bool

	// Booked reports whether the permit is booked for the task, RetryIn from now: when
	// it comes back (the same task, or its requeued copy) it runs on that booking.
	// RetryDelay then makes it due early enough to be in a worker by then.
	Booked bool

	// back is when the middleware wants a booked task due again (see comeBack).
	back time.Duration

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
