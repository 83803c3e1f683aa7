package jobmw

import (
	"context"
	"math"
	"time"
)

// Budget bounds how long an attempt of a job may sleep in a middleware: Deadline
// bounds every sleep (zero: never), Inline a sleep for a new booking or a slot, Kept
// a sleep for a booking the job found.
type Budget struct {
	Deadline     time.Time
	Inline, Kept time.Time
}

// Until returns the earlier of t and the deadline; zero: never.
func (b Budget) Until(t time.Time) time.Time {
	if t.IsZero() || (!b.Deadline.IsZero() && b.Deadline.Before(t)) {
		return b.Deadline
	}
	return t
}

// LeftUntil is the time left until Until(t); the largest duration for never.
func (b Budget) LeftUntil(t time.Time) time.Duration {
	u := b.Until(t)
	if u.IsZero() {
		return time.Duration(math.MaxInt64)
	}
	return max(time.Until(u), 0)
}

// InlineLeft is how much longer the job may sleep for a new booking or a slot.
func (b Budget) InlineLeft() time.Duration { return b.LeftUntil(b.Inline) }

// KeptLeft is how much longer a job that found its booking may sleep for it.
func (b Budget) KeptLeft() time.Duration { return b.LeftUntil(b.Kept) }

// InlineUntil is when a job sleeping for a new booking or a slot must stop; zero:
// never.
func (b Budget) InlineUntil() time.Time { return b.Until(b.Inline) }

// Outage paces a middleware's tries while its limiter or semaphore finds Redis
// unavailable (throttle.ErrUnavailable under the default FailClosed policy).
type Outage struct{ backoff time.Duration }

const (
	outageFirstBackoff = 50 * time.Millisecond
	outageMaxBackoff   = time.Second
)

// Wait sleeps before the next try, doubling from 50ms to 1s, and reports true when
// left (the time the attempt may still try for) allows that try; false, without
// sleeping, when it does not or ctx is done.
func (o *Outage) Wait(ctx context.Context, left time.Duration) bool {
	o.backoff = min(max(2*o.backoff, outageFirstBackoff), outageMaxBackoff)
	return left >= o.backoff && Sleep(ctx, o.backoff) == nil
}
