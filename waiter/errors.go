package waiter

import (
	"context"
	"errors"
)

var (
	// ErrWouldExceedDeadline: the permits would come after the context's deadline, so
	// nothing was booked. Like golang.org/x/time/rate, Wait returns it at once instead
	// of sleeping until the deadline. It also matches context.DeadlineExceeded
	// (errors.Is(err, context.DeadlineExceeded) is true), so a loop that stops at its
	// deadline need not test for it separately.
	ErrWouldExceedDeadline error = wouldExceedDeadline{}

	// ErrNotReserved: Reservation.Wait was called on a reservation that booked nothing.
	ErrNotReserved = errors.New("waiter: nothing was reserved")

	// ErrNilReserver: NewTransport was given a nil Reserver. The transport's RoundTrip
	// returns an error wrapping it, sending nothing. A nil *throttle.Limiter's Reserve
	// returns it too.
	ErrNilReserver = errors.New("waiter: nil Reserver")

	// ErrInvalidOption: a TransportOption out of range (see each option). The
	// transport's RoundTrip returns an error wrapping it, sending nothing.
	ErrInvalidOption = errors.New("waiter: invalid transport option")

	// Why a Retry-After was not used as it stood. The transport does not return these:
	// it passes them, wrapped with the header's text, to TransportHooks.BadRetryAfter.

	// ErrRetryAfterMissing: a 429 or 503 response had no Retry-After; nothing was paused.
	ErrRetryAfterMissing = errors.New("waiter: no Retry-After")

	// ErrRetryAfterInvalid: Retry-After was neither delay-seconds nor an HTTP-date;
	// nothing was paused.
	ErrRetryAfterInvalid = errors.New("waiter: Retry-After is neither delay-seconds nor an HTTP-date")

	// ErrRetryAfterPast: Retry-After was a negative number or a date before the
	// response's; nothing was paused.
	ErrRetryAfterPast = errors.New("waiter: Retry-After is in the past")

	// ErrRetryAfterTooLong: Retry-After asked for a pause longer than the transport's
	// cap (WithMaxPause); the pause was cut to the cap.
	ErrRetryAfterTooLong = errors.New("waiter: Retry-After is longer than the transport's cap")
)

// wouldExceedDeadline is ErrWouldExceedDeadline: its own sentinel that also matches
// context.DeadlineExceeded.
type wouldExceedDeadline struct{}

func (wouldExceedDeadline) Error() string {
	return "waiter: permits would come after the context's deadline"
}

// Is reports whether target is context.DeadlineExceeded (errors.Is compares with
// ErrWouldExceedDeadline itself first).
func (wouldExceedDeadline) Is(target error) bool { return target == context.DeadlineExceeded }
