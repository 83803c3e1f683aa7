package rivermw

import (
	"errors"
	"fmt"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// nilArgument is the error a Setup's method panics with when given nil: the mistake
// shows when the client is built, not as failed jobs.
func nilArgument(call string) error { return fmt.Errorf("rivermw: %s(nil)", call) }

// ThrottledError says why a job did not run yet and when it will: the middleware
// returns it to River, which snoozes the job (it wraps a river.JobSnooze), and passes
// it to Hooks.Throttled. Test for it with errors.As or IsThrottled.
//
// For a limiter of 20 per second whose bookings reach 7.3 s ahead, job 42 of kind
// "vendor_call" gets JobID 42, Kind "vendor_call", RetryIn 7.3s, Booked, Key the
// limiter's key, Limit "20 per 1s" and a Snooze a little over a second shorter than
// RetryIn: it comes back just before its slot, and sleeps the rest.
type ThrottledError struct {
	// JobID and Kind name the job.
	JobID int64
	Kind  string

	// RetryIn is when the permit (or, for Concurrency, a slot) would be available if
	// nobody else took it first: the limiter's wait, or the time until the earliest
	// lease of a full semaphore expires (a release may free a slot sooner).
	RetryIn time.Duration

	// Snooze is how long River snoozes the job: for a booked job, RetryIn less how
	// early the middleware wants it back (see Stats.ComeBackEarly).
	Snooze time.Duration

	// Key is the limiter's or the semaphore's key (without prefix).
	Key string

	// Limit describes the limit that was reached: "20 per 1s", "20 per 1s and 500 per
	// 1h0m0s", or "5 in flight".
	Limit string

	// Booked reports whether the permit is booked for the job, RetryIn from now: when
	// it comes back it runs on that booking.
	Booked bool

	// Err, when not nil, is why no permit could be had other than the limit: Redis
	// was unavailable (an error wrapping throttle.ErrUnavailable), so that
	// errors.Is(err, throttle.ErrUnavailable) holds for such a *ThrottledError.
	Err error
}

// Error returns a message such as `rivermw: job 42 (vendor_call): throttled by
// "vendor-api" (20 per 1s): slot in 7.3s, snoozed for 6.2s`.
func (e *ThrottledError) Error() string {
	what := "slot in"
	if !e.Booked {
		what = "retry in"
	}
	cause := ""
	if e.Err != nil {
		cause = fmt.Sprintf(": %v", e.Err)
	}
	return fmt.Sprintf("rivermw: job %d (%s): throttled by %q (%s)%s: %s %v, snoozed for %v",
		e.JobID, e.Kind, e.Key, e.Limit, cause, what, e.RetryIn, e.Snooze)
}

// Unwrap returns the *rivertype.JobSnoozeError that makes River snooze the job for
// Snooze, and Err if it is set.
func (e *ThrottledError) Unwrap() []error {
	errs := []error{river.JobSnooze(e.Snooze)}
	if e.Err != nil {
		errs = append(errs, e.Err)
	}
	return errs
}

// IsThrottled reports whether err is, or wraps, a *ThrottledError: the job did not
// run because of a limit, and will run later.
func IsThrottled(err error) bool {
	var te *ThrottledError
	return errors.As(err, &te)
}

// jobError returns err with the job it happened to named.
func jobError(job *rivertype.JobRow, what string, err error) error {
	return fmt.Errorf("rivermw: job %d (%s): %s: %w", job.ID, job.Kind, what, err)
}
