package throttle

import "time"

// Result is a limiter's answer to AllowN.
//
// For a sliding window of 5 per second where 1 permit was taken 100ms ago and 2 just
// now, AllowN(ctx, 3) returns Allowed false, Remaining 2, RetryAfter 900ms (when the
// first permit leaves the window, 3 fit) and ResetAfter 1s (when all have left).
type Result struct {
	// Allowed reports whether the n permits were granted (and taken).
	Allowed bool

	// Remaining is how many permits a call made now could still get, after this one.
	// It is 0 while the key is paused or reservations are waiting (they come first).
	Remaining int

	// RetryAfter is, when Allowed is false, the exact time until n permits can be
	// granted if nobody else takes them first; it is never 0 then. It is 0 when
	// Allowed is true.
	RetryAfter time.Duration

	// ResetAfter is the time until the limiter is back to full capacity: every permit
	// granted so far has left its window (or, for the token bucket, the bucket is full).
	ResetAfter time.Duration

	// On a tenant's handle (Limiter.Tenant), when Allowed is false: ByCap reports that
	// the tenant's own caps (WithTenantLimits) denied it, and Turn that its fair turn
	// has not come (the limiter's limits may have room); neither, that the limiter's
	// limits denied it. RetryAfter is then when asking again can succeed.
	ByCap, Turn bool
}
