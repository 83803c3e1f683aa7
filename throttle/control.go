package throttle

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Pause stops all grants on the limiter's key, across every process and algorithm,
// for d: until then every call is denied, and bookings start after the pause. A longer
// pause already set is kept. Every process's waiters (WaitN) asleep on bookings inside
// the pause give them back and book again after it, in their order, when the notice
// Redis publishes reaches them (a waiter whose slot comes before that goes ahead);
// Reserve's bookings keep their places.
//
// Before it calls Redis, Pause holds this process: WaitN and the HTTP transport
// (waiter.NewTransport, which pauses on a 429 or 503 with Retry-After) send nothing on
// the key until d has passed, even if the call is slow or fails; this process's waiters'
// bookings not yet in effect are given back, and booked again in their order when the
// hold ends. It returns an error wrapping ErrInvalidArgument for d <= 0.
func (l *Limiter) Pause(ctx context.Context, d time.Duration) error {
	if err := l.usable(); err != nil { // before the hold, which a bad handle must not set
		return err
	}
	if d <= 0 {
		return fmt.Errorf("%w: pause %v", ErrInvalidArgument, d)
	}
	ks := l.client().key(l.t.tag)
	ks.landed.Store(false) // before the hold: a resume that reads the new hold finds it false
	if raise(&ks.hold, time.Now().Add(d).UnixNano()) {
		ks.move(func(*sleeper) bool { return true })
	}
	call := &protocol.Request{Op: protocol.OpPause, X: min(ceilMicros(d), maxPeriodUS), Queue: keys.Name(l.t.tag, keys.FairQueue)}
	if _, err := l.controlCall(ctx, call); err != nil {
		return err
	}
	ks.landed.Store(true)
	if l.hooks.Paused != nil {
		l.hooks.Paused(l.key, d)
	}
	return nil
}

// Resume ends a pause set on the key (by Pause, the HTTP transport or an operator) at
// once, for every process; an override stays. A process's hold (see Pause) ends with
// it, and each process's waiters (WaitN) booked behind the pause book again from now,
// in their order: this process's on the reply, the others' on the notice Redis
// publishes (a process that books again before another has given its bookings back
// queues behind those). It returns Redis errors as AllowN.
func (l *Limiter) Resume(ctx context.Context) error {
	rep, err := l.controlCall(ctx, &protocol.Request{Op: protocol.OpResume})
	if err != nil {
		return err
	}
	// the end of the pause it ended (0: none was in force): this process's waiters go now
	l.client().key(l.t.tag).resume(rep.v[4], true)
	return nil
}

// Override changes the rates (and, for TokenBucket, the bursts) of the key's limits
// for every process, from their next call on, for d (0: until ClearOverride; at most
// 2^45µs); a later Override replaces it. limits[i] replaces the Rate and Burst of the
// i-th of Limits(), whose period stays (limits[i].Period is 0 or that period); limits
// beyond those given keep their rates. An override's Burst 0 means its Rate.
//
// What the key holds is counted with the new limits, now and at the override's end: a
// window's permits count against the new rate; a token bucket keeps its tokens (a debt
// of bookings included, those above a lowered burst cut) and refills at the new rate,
// as golang.org/x/time/rate's SetLimitAt and SetBurstAt. Bookings keep their places; a
// task's booking (asynq) made before an override that lowers a rate or a burst is booked
// again under it when the task comes back.
//
// n above what the overridden limits can grant fails with ErrExceedsLimit; n above the
// callers' own limits is refused before any call, even while an override raises them.
// Errors wrap ErrInvalidLimit for a limit out of range or with another period,
// ErrInvalidArgument for d < 0, no limits or more than the limiter has; Redis errors
// are as AllowN's.
func (l *Limiter) Override(ctx context.Context, d time.Duration, limits ...Limit) error {
	if d < 0 {
		return fmt.Errorf("%w: override for %v", ErrInvalidArgument, d)
	}
	if len(limits) == 0 || len(limits) > len(l.limits) {
		return fmt.Errorf("%w: %d limits to override, the limiter has %d", ErrInvalidArgument, len(limits), len(l.limits))
	}
	var rates []int
	for i, o := range limits {
		code := l.limits[i]
		o.Period = cmp.Or(o.Period, code.Period) // 0: the limit's own
		if o.Period != code.Period {
			return fmt.Errorf("%w: override %d has period %v, the limit's is %v (an override changes rates, not periods)",
				ErrInvalidLimit, i, o.Period, code.Period)
		}
		if err := o.validate(l.alg); err != nil {
			return fmt.Errorf("%w (key %q, override %s)", err, l.key, o)
		}
		rates = append(rates, o.Rate, o.Burst)
	}
	_, err := l.controlCall(ctx, &protocol.Request{Op: protocol.OpOverride, X: min(ceilMicros(d), maxPeriodUS), Rates: rates})
	if err == nil {
		until := int64(math.MaxInt64) // until cleared
		if d > 0 {
			until = time.Now().Add(d).UnixNano()
		}
		raise(&l.client().key(l.t.tag).overridden, until)
	}
	return err
}

// ClearOverride removes an override set by Override: every process's next call
// enforces the limits it passes again. It returns Redis errors as AllowN.
func (l *Limiter) ClearOverride(ctx context.Context) error {
	_, err := l.controlCall(ctx, &protocol.Request{Op: protocol.OpClear})
	if err == nil {
		l.client().key(l.t.tag).overridden.Store(0)
	}
	return err
}

// controlCall makes one of the control ops, which act on the key whichever handle makes
// them: a bad tenant's handle makes none (usable).
func (l *Limiter) controlCall(ctx context.Context, call *protocol.Request) (reply, error) {
	if err := l.usable(); err != nil {
		return reply{}, err
	}
	if err := ctx.Err(); err != nil {
		return reply{}, err
	}
	return l.send(ctx, l.client().key(l.t.tag), call, nil)
}

// resume handles the resume of a pause that ended at end (server µs; 0: unknown or
// none): the hold ends if this process resumed (own) or its pause had reached Redis;
// the sleepers booked at or after end book again now, with those whose bookings come
// back after it (move), once per pause resumed, whatever the order of the pauses' ends:
// a pause set after a resume may end before the pause that resume ended. Resume's reply
// and the notice of the same resume both come, in either order (they come on different
// connections); the second finds end among the resumes handled (ended) and moves
// nothing (docs/design.md, "Control, pause and resume"). Ends tell pauses apart, not
// resumes' order: the notice of another process's resume that comes after the reply of
// a later Resume made by this process is handled as new, and moves the sleepers booked
// at or after its end.
func (ks *keyState) resume(end int64, own bool) {
	ks.heard.Lock()
	defer ks.heard.Unlock()
	if h := ks.hold.Load(); h != 0 && (own || ks.landed.Load()) {
		ks.mu.Lock()
		if ks.hold.CompareAndSwap(h, 0) { // unless a Pause since holds anew
			close(ks.unhold) // wakes the callers held
			ks.unhold = make(chan struct{})
		}
		ks.mu.Unlock()
	}
	ks.pauseEnd.CompareAndSwap(end, 0) // its sleepers booked inside it stay
	if end <= 0 || slices.Contains(ks.ended[:], end) {
		return
	}
	ks.ended[ks.nended] = end
	ks.nended = (ks.nended + 1) % len(ks.ended)
	ks.move(func(s *sleeper) bool { return s.g.token >= end })
}

// paused handles the notice of a pause of the key until end (server µs), which any
// process publishes when it sets one: this process's sleepers booked before its end
// book again now, and so after it, in their order, once per pause end. A sleeper whose
// booking comes back after the notice is moved once it lands (move).
//
// A pause whose resume this process has handled (ended), the last one or an
// earlier one, is over: word of it that comes after the resume was read before it
// (checkPauses' inspect, or the pause's notice overtaken by Resume's reply, which
// comes on another connection) and changes nothing. Acted on, it would take the
// sleepers the resume booked again from now, all before its end, and book them again
// once more, behind what others booked meanwhile.
func (ks *keyState) paused(end int64) {
	ks.heard.Lock()
	defer ks.heard.Unlock()
	if slices.Contains(ks.ended[:], end) {
		return
	}
	if old := ks.pauseEnd.Swap(end); old != end {
		ks.move(func(s *sleeper) bool { return s.g.token < end })
	}
}

// raise sets a to v if v is larger, and reports whether it did.
func raise(a *atomic.Int64, v int64) bool {
	for {
		old := a.Load()
		if old >= v {
			return false
		}
		if a.CompareAndSwap(old, v) {
			return true
		}
	}
}

// pass waits until this process's hold on the key ends (or a resume ends it), listening
// for resumes (l: see listenNotices); it returns the hold it found over and whether it
// waited. It fails with ctx.Err() if ctx ends first, or at once with
// ErrWouldExceedDeadline if the hold ends after ctx's deadline.
func (ks *keyState) pass(ctx context.Context, l *Limiter) (seen int64, held bool, err error) {
	for {
		ks.mu.Lock()
		unhold := ks.unhold // taken before the hold is read: an end after the read closes it
		ks.mu.Unlock()
		seen = ks.hold.Load()
		d := time.Until(time.Unix(0, seen))
		if d <= 0 {
			return seen, held, nil
		}
		if clock.MaxWait(ctx) < d {
			return seen, held, fmt.Errorf("jobthrottle: %w: this process holds the key %v more", waiter.ErrWouldExceedDeadline, d)
		}
		if !held {
			held = true
			defer ks.listenNotices(l)()
		}
		select {
		case <-time.After(d): // collected unfired (Go 1.23)
		case <-unhold:
		case <-ctx.Done():
			return seen, held, ctx.Err()
		}
	}
}
