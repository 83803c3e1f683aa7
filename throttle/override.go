package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
)

// Override changes the rates (and, for TokenBucket, the bursts) of the key's limits
// for every process that uses the key, from their next call on, for d; d = 0 means
// until ClearOverride (at most 2^45µs, about 407 days). limits are the new limits in
// the order of Limits(): limits[i] replaces the Rate and Burst of the i-th; each
// keeps the period the processes pass (a limit's Period here must be 0 or that
// period); limits beyond those given keep their rates. A later Override replaces it.
//
// Enforcing it costs no extra round trip. Raising a rate or burst takes effect at
// once; lowering one, in the middle of a window:
//   - SlidingWindow, SlidingCounter: the permits of the last Period count against the
//     new rate, so nothing is granted until they are fewer than it;
//   - FixedWindow: the current window's count counts against the new rate;
//   - TokenBucket: a lower burst drops the tokens above it at once, a lower rate
//     slows the refill from then on.
//
// Bookings already made by Reserve and waiting WaitN calls keep their places: they
// were admitted under the old rates, and take effect as booked. A task's booking
// (ReserveFor, ReserveForLate: the asynq middleware's) made before an override that
// lowers a rate or a burst below the limiter's own is re-placed when the task comes
// back for it: in the same script call, its permits are given back at its slot (as
// its Cancel would) and it books anew under the overridden limits, at the earliest
// slot free then, after the bookings still held (kept is false; a retry after a lost
// reply finds the new booking), so from the override on those tasks too run no faster
// than the new rates. Tasks keep their order as far as they come back in order. A
// booking whose slot has already passed (ReserveForLate) is booked anew the same
// way; its permits stay counted where they were. Giving back frees what a Cancel
// would: TokenBucket frees only what its latest grants hold, FixedWindow only permits
// of its latest grant's window; where it frees nothing the re-placed task waits for a
// slot after them: slower, never faster than the new rates. A booking made before an override that
// raises the rates keeps its place (the slot free after the bookings held would be
// later, and what fits the lower rates fits the higher), and so does one made before
// an override that has since been cleared or ended. Known gap: which overrides
// re-place is judged against the limiter's own limits, so after an override that
// raised the rates, bookings made under it keep their places when a second override
// lowers the rates but not below the limiter's own.
//
// A caller asking for more permits than an overridden limit can ever grant gets an
// error wrapping ErrExceedsLimit. Inspect reports the override and the rates
// enforced.
//
// It returns an error wrapping ErrInvalidLimit for a limit out of range or with
// another period, ErrInvalidArgument for d < 0, no limits or more than the limiter
// has, and Redis errors as AllowN.
func (l *Limiter) Override(ctx context.Context, d time.Duration, limits ...Limit) error {
	if d < 0 {
		return fmt.Errorf("%w: override for %v", ErrInvalidArgument, d)
	}
	if len(limits) == 0 || len(limits) > len(l.limits) {
		return fmt.Errorf("%w: %d limits to override, the limiter has %d", ErrInvalidArgument, len(limits), len(l.limits))
	}
	us := int64(maxPeriodUS)
	if d > 0 {
		us = min(ceilMicros(d), maxPeriodUS)
	}
	args := []any{0, us, len(limits)}
	for i, o := range limits {
		code := l.limits[i]
		if o.Period == 0 {
			o.Period = code.Period
		}
		if o.Period != code.Period {
			return fmt.Errorf("%w: override %d has period %v, the limit's is %v (an override changes rates, not periods)",
				ErrInvalidLimit, i, o.Period, code.Period)
		}
		if err := o.validate(l.alg); err != nil {
			return fmt.Errorf("%w (key %q, override %s)", err, l.key, o)
		}
		args = append(args, o.Rate, o.Burst)
	}
	return l.control(ctx, args...)
}

// ClearOverride removes an override set by Override: every process's next call
// enforces the limits it passes again. It returns Redis errors as AllowN.
func (l *Limiter) ClearOverride(ctx context.Context) error {
	return l.control(ctx, 1, 0, 0)
}

// Resume ends a pause set on the key (by Pause, the HTTP transport or an operator)
// at once, for every process; an override stays. Bookings made after the pause keep
// their places. It returns Redis errors as AllowN.
func (l *Limiter) Resume(ctx context.Context) error {
	return l.control(ctx, 2, 0, 0)
}

// control runs control.lua on the key's control key, through the one call path of
// every script that writes (at most once; errors mapped; RedisError called).
func (l *Limiter) control(ctx context.Context, args ...any) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	_, err := l.exec(ctx, lua.Control.Script(), l.keys[1:2], args)
	return err
}
