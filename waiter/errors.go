package waiter

import "errors"

var (
	// ErrWouldExceedDeadline: the permits would come after the context's deadline, so
	// nothing was booked. Like golang.org/x/time/rate, Wait returns it at once instead
	// of sleeping until the deadline.
	ErrWouldExceedDeadline = errors.New("waiter: permits would come after the context's deadline")

	// ErrNotReserved: Reservation.Wait was called on a reservation that booked nothing.
	ErrNotReserved = errors.New("waiter: nothing was reserved")

	// ErrMoved: the Reserver moved the booking (a pause began); it was given back and
	// must be booked again. Wait does that by itself.
	ErrMoved = errors.New("waiter: booking moved; reserve again")
)
