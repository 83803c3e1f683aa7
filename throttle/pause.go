package throttle

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

var _ waiter.Gate = (*Limiter)(nil)

// Pause stops all grants on the limiter's key, across every process and algorithm,
// for d: until then every call is denied, and bookings start after the pause. A
// longer pause already set is kept. Waiters of this process that booked ahead give
// their booking back and book again after the pause; callers in other processes that
// booked before the pause keep their booking (see the README's "Guarantees and
// failure modes").
//
// No Reserve of this process on the key books anything while Pause runs: Pause
// returns, and lets them go on, once every waiter it woke has given its booking back
// (or its booking has taken effect), waiting at most 100ms for them. So none of them
// books again behind a booking another is about to give back, and the first permits
// after the pause take effect when it ends. (TokenBucket and FixedWindow give back
// only the latest booking: with them the other bookings the pause moved stay counted,
// unused, and fewer permits come in the time they cover.)
//
// Before it calls Redis, Pause holds this process (see Hold): from the moment it is
// called, Wait and the HTTP transport of this process send nothing on the key until
// d has passed, even if the Redis call is slow or fails.
//
// The HTTP transport (waiter.NewTransport) calls Pause when a server answers 429 or
// 503 with Retry-After. It returns an error wrapping ErrInvalidArgument for d <= 0.
func (l *Limiter) Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: pause %v", ErrInvalidArgument, d)
	}
	l.Hold(d)
	us := min(ceilMicros(d), maxPeriodUS)
	l.moved.gate.Lock()
	_, err := l.exec(ctx, lua.Pause, l.keys[1:2], []any{us})
	if err == nil {
		l.moved.fire(l.clock)
	}
	l.moved.gate.Unlock()
	if err != nil {
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
// it counts by the Limiter's clock (WithClock).
func (l *Limiter) Hold(d time.Duration) {
	if d <= 0 {
		return
	}
	l.moved.hold(l.clock.Now().Add(d))
}

// Pass returns (false, nil) at once unless this process holds the key (see Hold and
// Pause). While it does, Pass waits until the hold ends and returns (true, nil); it
// returns ctx.Err() if ctx ends first, and at once an error wrapping
// waiter.ErrWouldExceedDeadline if the hold ends after ctx's deadline. Wait calls it;
// code that takes permits with Allow or Reserve may call it before acting on them.
func (l *Limiter) Pass(ctx context.Context) (held bool, err error) {
	return l.moved.pass(ctx, l.clock)
}

// hold sets the end of this process's hold to until, unless a later one is set.
func (p *pauseSignal) hold(until time.Time) {
	u := until.UnixNano()
	for {
		old := p.held.Load()
		if old >= u || p.held.CompareAndSwap(old, u) {
			return
		}
	}
}

// pass waits until no hold is set; see Limiter.Pass.
func (p *pauseSignal) pass(ctx context.Context, clock waiter.Clock) (held bool, err error) {
	for {
		d := time.Duration(p.held.Load() - clock.Now().UnixNano())
		if d <= 0 {
			return held, nil
		}
		if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
			return held, fmt.Errorf("%w: held for %v more", waiter.ErrWouldExceedDeadline, d)
		}
		held = true
		t := clock.NewTimer(d)
		select {
		case <-t.C():
			// the hold may have been made longer meanwhile: look again
		case <-ctx.Done():
			t.Stop()
			return held, ctx.Err()
		}
	}
}

// pauseSettle bounds how long Pause waits for the waiters it woke to give their
// bookings back. Waiters take one Redis call; a Reservation held by code that does
// not wait on it is never given back, and only this bound ends the wait for it.
const pauseSettle = 100 * time.Millisecond

// pauseSignal is what this process's Limiters on a key share about pauses: the hold
// (see Hold), the channel given to bookings as Moved (closed by fire, then replaced), the bookings
// made ahead that may not have taken effect yet, and a gate: Reserve holds it shared
// from before its script call until its booking is tracked, Pause holds it alone
// from before its script call until the bookings it woke are given back.
//
// Without the gate a woken waiter could book again before another gave back a
// booking that lies after the pause's end; bookings being first come, first served,
// it would be placed after that one, and so would everyone after it, leaving the
// slots between the pause's end and it unused.
type pauseSignal struct {
	gate    sync.RWMutex
	mu      sync.Mutex // guards ch, live and sweepAt
	ch      chan struct{}
	live    map[*liveBooking]struct{}
	sweepAt int           // sweep live when it grows to this size
	gone    chan struct{} // receives (without blocking) when a tracked booking is given back
	held    atomic.Int64  // until when (UnixNano, by the Limiters' clock) Pass waits; see Hold
}

// liveBooking is a booking made ahead, due at due by the Limiter's clock.
type liveBooking struct {
	p   *pauseSignal
	due time.Time
}

func newPauseSignal() *pauseSignal {
	return &pauseSignal{ch: make(chan struct{}), live: map[*liveBooking]struct{}{}, gone: make(chan struct{}, 1)}
}

// enter is called by Reserve before its script call; it returns the channel to give
// the booking as Moved. Pauses of this process on the key wait until leave.
func (p *pauseSignal) enter() <-chan struct{} {
	p.gate.RLock()
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ch
}

// leave ends what enter began. If the call booked permits that take effect after
// wait, it tracks them and returns their liveBooking; else nil.
func (p *pauseSignal) leave(booked bool, now time.Time, wait time.Duration) *liveBooking {
	defer p.gate.RUnlock()
	if !booked {
		return nil
	}
	b := &liveBooking{p: p, due: now.Add(wait)}
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.live) >= p.sweepAt { // amortised: drop what has taken effect
		for o := range p.live {
			if !o.due.After(now) {
				delete(p.live, o)
			}
		}
		p.sweepAt = 2*len(p.live) + 64
	}
	p.live[b] = struct{}{}
	return b
}

// giveBack returns cancel, made to tell a waiting Pause when the booking is gone.
func (b *liveBooking) giveBack(cancel func(ctx context.Context) error) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		err := cancel(ctx)
		b.p.mu.Lock()
		delete(b.p.live, b)
		b.p.mu.Unlock()
		select {
		case b.p.gone <- struct{}{}:
		default:
		}
		return err
	}
}

// fire wakes the waiters of every booking made so far (closing the channel they were
// given as Moved) and waits, at most pauseSettle, until each booking that had not yet
// taken effect is given back or takes effect. The caller holds the gate.
func (p *pauseSignal) fire(clock waiter.Clock) {
	p.mu.Lock()
	close(p.ch)
	p.ch = make(chan struct{})
	now := clock.Now()
	var woken []*liveBooking
	for b := range p.live {
		if b.due.After(now) {
			woken = append(woken, b)
		} else {
			delete(p.live, b)
		}
	}
	p.mu.Unlock()
	if len(woken) == 0 {
		return
	}
	patience := clock.NewTimer(pauseSettle)
	defer patience.Stop()
	for {
		// the time until the earliest booking still out takes effect; < 0: none is out
		next := time.Duration(-1)
		p.mu.Lock()
		now := clock.Now()
		for _, b := range woken {
			if _, out := p.live[b]; out && b.due.After(now) && (next < 0 || b.due.Sub(now) < next) {
				next = b.due.Sub(now)
			}
		}
		p.mu.Unlock()
		if next < 0 {
			return
		}
		t := clock.NewTimer(next)
		select {
		case <-p.gone:
		case <-t.C():
		case <-patience.C():
			t.Stop()
			return
		}
		t.Stop()
	}
}

type signalKey struct {
	rdb redis.Scripter
	tag string
}

// signals holds the signal of every key some Limiter of this process uses, weakly: an
// entry goes when the last Limiter of its key is collected, so per-tenant keys made
// and dropped by the million leave nothing behind.
var (
	signalsMu sync.Mutex
	signals   = map[signalKey]weak.Pointer[pauseSignal]{}
)

// pauseSignalFor returns the signal shared by every Limiter of this process on the same
// client and key.
func pauseSignalFor(rdb redis.Scripter, tag string) *pauseSignal {
	signalsMu.Lock()
	defer signalsMu.Unlock()
	k := signalKey{rdb, tag}
	if s := signals[k].Value(); s != nil {
		return s
	}
	s := newPauseSignal()
	signals[k] = weak.Make(s)
	runtime.AddCleanup(s, dropSignal, k)
	return s
}

func dropSignal(k signalKey) {
	signalsMu.Lock()
	defer signalsMu.Unlock()
	if signals[k].Value() == nil {
		delete(signals, k)
	}
}
