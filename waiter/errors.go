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

	// ErrNotReserved: Reservation.Wait was called on a reservation that booked nothing,
	// Settle on one that booked no costs, or the package's Settle with a context that
	// carries no reservation.
	ErrNotReserved = errors.New("waiter: nothing was reserved")

	// ErrSettleTooLate: a settle came after the booking stopped counting against every
	// limit (their longest period after it took effect): nothing was changed.
	ErrSettleTooLate = errors.New("waiter: settled after the booking left every limit")

	// ErrNilReserver: NewTransport was given a nil Reserver. The transport's RoundTrip
	// returns an error wrapping it, sending nothing. A nil *throttle.Limiter's Reserve
	// returns it too.
	ErrNilReserver = errors.New("waiter: nil Reserver")

	// ErrInvalidOption: a TransportOption out of range (see each option). The
	// transport's RoundTrip returns an error wrapping it, sending nothing.
	ErrInvalidOption = errors.New("waiter: invalid transport option")
)

// wouldExceedDeadline is ErrWouldExceedDeadline's type.
type wouldExceedDeadline struct{}

func (wouldExceedDeadline) Error() string {
	return "waiter: permits would come after the context's deadline"
}

// Is reports whether target is context.DeadlineExceeded (errors.Is compares with
// ErrWouldExceedDeadline itself first).
func (wouldExceedDeadline) Is(target error) bool { return target == context.DeadlineExceeded }
