package throttle

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/waiter"
)

var _ waiter.Gate = (*Limiter)(nil)

// Pause stops all grants on the limiter's key, across every process and algorithm,
// for d: until then every call is denied, and bookings start after the pause. A
// longer pause already set is kept. Callers in other processes that booked before
// the pause keep their booking (see the README's "Pause and hold").
//
// Before it calls Redis, Pause holds this process (see Hold): from the moment it is
// called, Wait, Reservation.Wait and the HTTP transport of this process send nothing
// on the key until d has passed, even if the Redis call is slow or fails. Their
// bookings that had not taken effect are given back at once, and they book again
// when the hold ends; so does a Wait called during the hold. Pause does not wait for
// them, and no other call of the process waits for Pause.
//
// The HTTP transport (waiter.NewTransport) calls Pause when a server answers 429 or
// 503 with Retry-After. It returns an error wrapping ErrInvalidArgument for d <= 0.
func (l *Limiter) Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: pause %v", ErrInvalidArgument, d)
	}
	l.Hold(d)
	if _, err := l.exec(ctx, lua.Pause.Script(), l.keys[1:2], []any{min(ceilMicros(d), maxPeriodUS)}); err != nil {
		return err
	}
	if l.hooks.Paused != nil {
		l.hooks.Paused(l.key, d)
	}
	return nil
}

// Hold holds back this process's callers of the key for d from now, at once and
// without calling Redis: until then Pass waits, so Wait (and WaitN) and the HTTP
// transport send nothing, and a Wait whose permits take effect meanwhile leaves them
// unused and books again after the hold. A longer hold already set is kept; d <= 0
// does nothing. Other processes are not told: Pause holds and then tells them.
//
// The hold is shared by every Limiter of this process on the same client and key;
// it counts by the system clock.
func (l *Limiter) Hold(d time.Duration) {
	if d <= 0 {
		return
	}
	l.hold.extend(l.clock.Now().Add(d))
}

// Pass returns (false, nil) at once unless this process holds the key (see Hold and
// Pause). While it does, Pass waits until the hold ends and returns (true, nil); it
// returns ctx.Err() if ctx ends first, and at once an error wrapping
// waiter.ErrWouldExceedDeadline if the hold ends after ctx's deadline. Wait calls it;
// code that takes permits with Allow or Reserve may call it before acting on them.
func (l *Limiter) Pass(ctx context.Context) (held bool, err error) {
	if l == nil { // a nil *Limiter holds nothing; its Reserve says what is wrong
		return false, nil
	}
	return l.hold.pass(ctx, l.clock)
}

// hold is what this process's Limiters on a key share about pauses: until when Pass
// waits, and the channel given to bookings as waiter.Booking.Moved, closed when a
// hold begins or grows (then replaced), so that waiters give back bookings the hold
// may cover. Neither takes a lock: Reserve only loads the channel.
type hold struct {
	until atomic.Int64                  // UnixNano, by the Limiters' clock
	moved atomic.Pointer[chan struct{}] // never nil
}

func newHold() *hold {
	h := &hold{}
	ch := make(chan struct{})
	h.moved.Store(&ch)
	return h
}

// holds holds the hold of every key some Limiter of this process uses (one per client
// and key, whatever the configuration), weakly as the other shared state.
var holds registry[sharedKey, hold]

// holdFor returns the hold shared by every Limiter of this process on rdb and tag.
func holdFor(k sharedKey) *hold {
	k.config = "hold"
	return holds.get(k, newHold)
}

// signal returns the channel closed when the next hold begins.
func (h *hold) signal() <-chan struct{} { return *h.moved.Load() }

// extend sets the end of the hold to until, unless a later one is set; if it did,
// it closes the channel bookings were given.
func (h *hold) extend(until time.Time) {
	u := until.UnixNano()
	for {
		old := h.until.Load()
		if old >= u {
			return
		}
		if h.until.CompareAndSwap(old, u) {
			break
		}
	}
	ch := make(chan struct{})
	close(*h.moved.Swap(&ch))
}

// pass waits until no hold is set; see Limiter.Pass.
func (h *hold) pass(ctx context.Context, clk clock.Clock) (held bool, err error) {
	for {
		d := time.Duration(h.until.Load() - clk.Now().UnixNano())
		if d <= 0 {
			return held, nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			return held, fmt.Errorf("%w: held for %v more", waiter.ErrWouldExceedDeadline, d)
		}
		held = true
		t := clk.NewTimer(d)
		select {
		case <-t.C():
			// the hold may have been made longer meanwhile: look again
		case <-ctx.Done():
			t.Stop()
			return held, ctx.Err()
		}
	}
}
