package throttle

import (
	"context"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
)

// Pause stops all grants on the limiter's key, across every process and algorithm,
// for d: until then every call is denied, and bookings start after the pause. A longer
// pause already set is kept. Bookings other processes made before the pause keep
// their places.
//
// Before it calls Redis, Pause holds this process: from the moment it is called,
// WaitN and the HTTP transport send nothing on the key until d has passed, even if the
// Redis call is slow or fails; bookings of this process's waiters that had not taken
// effect are given back, and booked again, in their order, when the hold ends. The
// HTTP transport (waiter.NewTransport) calls Pause on a 429 or 503 with Retry-After. It
// returns an error wrapping ErrInvalidArgument for d <= 0.
func (l *Limiter) Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: pause %v", ErrInvalidArgument, d)
	}
	l.c.key(l.t.tag).holdFor(d)
	if _, err := l.control(ctx, opPause, 0, min(ceilMicros(d), maxPeriodUS), nil); err != nil {
		return err
	}
	if l.hooks.Paused != nil {
		l.hooks.Paused(l.key, d)
	}
	return nil
}

// Resume ends a pause set on the key (by Pause, the HTTP transport or an operator) at
// once, for every process; an override stays. Every process's waiters (WaitN) whose
// bookings lie behind the pause give them back and book again from now, in their order.
// It returns Redis errors as AllowN.
func (l *Limiter) Resume(ctx context.Context) error {
	rep, err := l.control(ctx, opResume, 0, 0, nil)
	if err != nil {
		return err
	}
	if end := rep.v[4]; end > 0 { // the pause it ended: this process's waiters go now
		l.c.key(l.t.tag).resumed(end)
	}
	return nil
}

// Override changes the rates (and, for TokenBucket, the bursts) of the key's limits
// for every process that uses the key, from their next call on, for d; d = 0 means
// until ClearOverride (at most 2^45µs). limits are the new limits in the order of
// Limits(): limits[i] replaces the Rate and Burst of the i-th, whose period stays (a
// limit's Period here must be 0 or that period); limits beyond those given keep their
// rates. A later Override replaces it. Raising a rate takes effect at once; lowering
// one counts what the window holds against the new rate; the token bucket keeps the
// tokens it holds and refills at the new rate from then on. Bookings already made keep
// their places; a task's booking (asynq) made before an override that lowers a rate is
// booked again under it when the task comes back.
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
	var rates []any
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
		rates = append(rates, o.Rate, o.Burst)
	}
	_, err := l.control(ctx, opOverride, len(limits), min(ceilMicros(d), maxPeriodUS), rates)
	return err
}

// ClearOverride removes an override set by Override: every process's next call
// enforces the limits it passes again. It returns Redis errors as AllowN.
func (l *Limiter) ClearOverride(ctx context.Context) error {
	_, err := l.control(ctx, opClear, 0, 0, nil)
	return err
}

// control makes one of the control ops on the key.
func (l *Limiter) control(ctx context.Context, op, n int, x int64, rates []any) (reply, error) {
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	return l.send(ctx, l.c.key(l.t.tag), []any{op, n, x, 0, 0}, "", rates, nil, false)
}

// holdFor holds this process's callers of the key for d from now (see Pause): a
// longer hold already set is kept. The sleepers' bookings are given back now and
// booked again when the hold ends.
func (ks *keyState) holdFor(d time.Duration) {
	until := time.Now().Add(d)
	for {
		old := ks.hold.Load()
		if old >= until.UnixNano() {
			return
		}
		if ks.hold.CompareAndSwap(old, until.UnixNano()) {
			break
		}
	}
	ks.move(func(*sleeper) bool { return true })
}

// resumed moves the sleepers whose bookings lie at or after end, a pause's end (server
// µs) that was resumed: they book again now.
func (ks *keyState) resumed(end int64) {
	ks.move(func(s *sleeper) bool { return s.g.token >= end })
}

// pass waits until this process's hold on the key ends; it reports whether it did
// wait. It returns ctx.Err() if ctx ends first, and at once an error wrapping
// waiter.ErrWouldExceedDeadline if the hold ends after ctx's deadline.
func (ks *keyState) pass(ctx context.Context) (held bool, err error) {
	for {
		d := time.Until(time.Unix(0, ks.hold.Load()))
		if d <= 0 {
			return held, nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			return held, fmt.Errorf("jobthrottle: %w: this process holds the key %v more", waiter.ErrWouldExceedDeadline, d)
		}
		held = true
		if err := sleep(ctx, d); err != nil {
			return held, err
		}
	}
}

// sleep waits d, or until ctx ends (ctx.Err()).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
