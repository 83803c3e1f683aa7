package throttle

import "errors"

// Errors returned by this package. Test for them with errors.Is: the errors returned
// wrap them with details (which key, which value).
var (
	// ErrInvalidLimit: a Limit that cannot be enforced (rate, period or burst out of
	// range; see Limit). New and NewSemaphore return it.
	ErrInvalidLimit = errors.New("jobthrottle: invalid limit")

	// ErrExceedsLimit: n is larger than the limit can ever grant at once (Rate for the
	// sliding window, fixed window and sliding counter, Burst for the token bucket; the
	// smallest over all limits). Returned before Redis is called; nothing is taken.
	ErrExceedsLimit = errors.New("jobthrottle: n exceeds what the limit can ever grant at once")

	// ErrInvalidArgument: a negative n, a negative wait, an option that does not fit.
	ErrInvalidArgument = errors.New("jobthrottle: invalid argument")

	// ErrInvalidKey: an empty key, or a key and prefix whose hash tag would be empty.
	ErrInvalidKey = errors.New("jobthrottle: invalid key")

	// ErrNilClient: New or NewSemaphore was given a nil Redis client.
	ErrNilClient = errors.New("jobthrottle: nil redis client")

	// ErrCorruptState: the limiter's Redis key holds data jobthrottle did not write (a
	// value of another type, or text it cannot read). The script changed nothing; delete
	// the key to start over.
	ErrCorruptState = errors.New("jobthrottle: redis key holds data jobthrottle did not write")

	// ErrUnavailable: Redis could not be reached or cannot serve now (connection
	// refused or reset, a timeout, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN, READONLY
	// during a failover…), or did not answer before the call's context's deadline,
	// whatever the client's options. The error wraps the cause as well; one for a
	// missed deadline also matches context.DeadlineExceeded. It is worth retrying
	// after a moment; nothing was granted (see FailurePolicy for the alternatives).
	ErrUnavailable = errors.New("jobthrottle: redis unavailable")

	// ErrLeaseLost: a Semaphore lease is no longer held: it expired before Extend or
	// Release reached Redis (its slot may already be someone else's), or it was
	// released. Nothing was freed or renewed.
	ErrLeaseLost = errors.New("jobthrottle: semaphore lease lost")

	// ErrNoPermission: the Redis user lacks a permission jobthrottle needs (see
	// ACLRules): a command it sends or one its scripts run, or access to the keys or
	// channels under the prefix. The error wraps Redis's refusal, which names the
	// command, key or channel (Redis 7.0 does not name a command a script was refused).
	// A call refused part-way may have taken effect: a user without MULTI runs the
	// script outside the transaction before the refusal reaches the caller.
	ErrNoPermission = errors.New("jobthrottle: redis user lacks a permission (see throttle.ACLRules)")

	// ErrUnexpectedReply: Redis answered a script with something it does not return,
	// e.g. a proxy in between that rewrote the reply.
	ErrUnexpectedReply = errors.New("jobthrottle: unexpected reply from redis script")
)
