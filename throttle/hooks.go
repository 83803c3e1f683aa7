package throttle

import "time"

// Hooks are callbacks a Limiter calls after its decisions, to count or log them without
// wrapping the API (WithHooks; a Semaphore has SemaphoreHooks). Any of them may be nil.
// They run on the caller's goroutine, after the Redis call, must not block and must be
// safe for simultaneous use. Leave Redis command tracing to go-redis's own hooks.
type Hooks struct {
	// Allowed is called when n permits were granted (AllowN) or booked (Reserve),
	// with the wait until they take effect (0 when granted at once).
	Allowed func(key string, n int, wait time.Duration)

	// Denied is called when nothing was granted or booked, with the caller's Result:
	// RetryAfter, the time until the n permits would be available, and on a tenant's
	// handle what denied them (ByCap, Turn). A tenant's WaitN asks again when its turn
	// comes: each ask whose turn had not come is a denial with Turn.
	Denied func(key string, n int, r Result)

	// Waited is called when Wait or WaitN got its permits after sleeping, with the time
	// it slept (from the call to its return).
	Waited func(key string, n int, waited time.Duration)

	// Cancelled is called when a booking of n permits was given back (Cancel, or a
	// WaitN whose context ended while it slept).
	Cancelled func(key string, n int)

	// RedisError is called when a call to Redis failed (the error the caller gets,
	// before any fail-open or fail-local policy applies).
	RedisError func(key string, err error)

	// Paused is called when Pause set a pause on the key, with its length.
	Paused func(key string, d time.Duration)

	// Degraded is called for every decision made without Redis because it was
	// unreachable (granted by FailOpen, or decided by FailLocal's in-process share),
	// with the error that made Redis count as unreachable.
	Degraded func(key string, policy FailurePolicy, err error)

	// StateLost is called when a grant's reply shows that the key's state no longer
	// holds permits this Limiter was granted moments before, still in their window:
	// the key was evicted (maxmemory), deleted, or lost in a failover or restart, and
	// the limit starts afresh, so up to what was lost can pass again. Only grants that
	// take effect at once are checked, and only a loss that shows in their Remaining
	// is seen (see docs/failures.md, "Losing state"); a state that is still there
	// never triggers it, whatever other processes do on the key.
	StateLost func(key string)

	// LimitsDrift is called when a call found the key's state written by another
	// process with other limits (a rolling deploy, a misconfiguration: each process
	// enforces its own, so the key's limit is neither), with this Limiter's limits and
	// the other's: once per process for each new set of theirs. The operator's
	// `jobthrottle show` shows the same.
	LimitsDrift func(key string, ours, theirs []Limit)
}

// SemaphoreHooks are callbacks a Semaphore calls after its decisions (WithSemaphoreHooks),
// as Hooks are a Limiter's; Hold's renewals call them on Hold's own goroutine.
type SemaphoreHooks struct {
	// Acquired is called when a lease was granted (TryAcquire, Acquire, Do), with how
	// long the caller waited for it: 0 when it was granted on the first call.
	Acquired func(key string, waited time.Duration)

	// Denied is called when TryAcquire got no lease, with the time it returned: until,
	// by expiry alone, a slot would come.
	Denied func(key string, retryAfter time.Duration)

	// GaveUp is called when an Acquire whose context ended gave its place in the queue
	// back (and a lease handed to it meanwhile).
	GaveUp func(key string)

	// Released is called when Release freed a lease, with how long it was held (from
	// its grant, by the Semaphore's clock).
	Released func(key string, held time.Duration)

	// LeaseLost is called when a lease was found lost: Extend or Release found it
	// expired, or Hold went a whole TTL without renewing it.
	LeaseLost func(key string)

	// RedisError is as Hooks.RedisError.
	RedisError func(key string, err error)

	// Degraded is as Hooks.Degraded, for every lease granted without Redis.
	Degraded func(key string, policy FailurePolicy, err error)
}
