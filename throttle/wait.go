package throttle

import (
	"context"
	"fmt"
	"github.com/jobthrottle/jobthrottle/internal/clock"
	"math"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
)

// Wait is shorthand for WaitN(ctx, 1).
func (l *Limiter) Wait(ctx context.Context) error {
	return l.WaitN(ctx, 1)
}

// WaitN books n permits and sleeps until they take effect: one Redis call however
// many callers wait, served in arrival order across every process.
//
// It returns at once, booking nothing: an error wrapping ErrExceedsLimit for n above
// what the limit can ever grant; ctx.Err() for a done context; an error wrapping
// waiter.ErrWouldExceedDeadline when the permits would come after ctx's deadline. If
// ctx ends while it sleeps, it returns ctx.Err() at once and its booking is given back
// in the background. If this process pauses the key (Pause), or the key's pause is
// resumed (Resume, from any process), while it sleeps, its booking is given back and
// booked again, with the other waiters of the process, in their order; called while
// this process holds the key, it books when the hold ends. A hold that begins while
// its booking is on its way back from Redis, or as the booking comes due, holds it
// too: it gives the booking back if it can and books again when the hold ends. A nil
// *Limiter returns an error wrapping waiter.ErrNilReserver, as its Reserve does.
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	if l == nil {
		return fmt.Errorf("%w: nil *throttle.Limiter", waiter.ErrNilReserver)
	}
	if err := l.check(ctx, n); err != nil {
		return err
	}
	start := clock.Now()
	slept, held := false, false
	ks := l.client().key(l.t.tag)
	for {
		seen, h, err := ks.pass(ctx)
		if err != nil {
			return err
		}
		held = held || h
		g, err := l.acquire(ctx, n, maxWait(ctx), nil)
		if err != nil {
			return err
		}
		if g.granted && g.wait > 0 {
			slept = true
			if g, seen, err = ks.sleep(ctx, l, n, g, seen); err != nil {
				return err
			}
		}
		if !g.granted {
			return fmt.Errorf("jobthrottle: key %q: %w: n=%d would wait %v", l.key, waiter.ErrWouldExceedDeadline, n, g.wait)
		}
		if ks.hold.Load() == seen {
			break
		}
		// A hold began after this call passed the last one, and no move took its
		// booking: its permits fall inside the hold, unused; book again after it.
		held = true
	}
	if (slept || held) && l.hooks.Waited != nil {
		l.hooks.Waited(l.key, n, clock.Now().Sub(start))
	}
	return nil
}

// maxWait is how long ctx lets a caller wait: until its deadline, or for ever.
func maxWait(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(0, time.Until(dl))
	}
	return time.Duration(math.MaxInt64)
}

// sleeper is a WaitN asleep on its booking, registered with its key's state so that a
// hold or a resume can move it (see keyState.move).
type sleeper struct {
	l     *Limiter
	ctx   context.Context
	n     int
	g     grant
	owner atomic.Int32 // who gives the booking back if it is not used: sleeperOwns or movedOwns
	moved chan moved   // the booking was moved: its new grant
}

const (
	sleeperOwns int32 = iota // it sleeps on it
	movedOwns                // a move gives it back and books again
	settled                  // used, or given back by its sleeper
)

// moved is a sleeper's booking after a move: booked again once the hold seen (the
// key's hold as the move passed it) was over, or why not.
type moved struct {
	g    grant
	err  error
	seen int64
}

// sleep sleeps on g, a booking of n permits for l made after the caller passed the
// hold seen, until it takes effect, and returns it with the hold its booking was made
// after; if a hold or a resume moves it meanwhile, it sleeps on the new booking. A hold
// that began after seen and did not move it (it came before the booking was
// registered) ends the sleep at once, the booking given back: the caller, finding the
// key's hold is no longer the one returned, books again. If ctx ends first, it returns
// ctx.Err() at once; the booking is given back in the background.
func (ks *keyState) sleep(ctx context.Context, l *Limiter, n int, g grant, seen int64) (grant, int64, error) {
	s := &sleeper{l: l, ctx: ctx, n: n, g: g, moved: make(chan moved, 1)}
	ks.mu.Lock()
	ks.listenOn() // a resume concerns it while it sleeps or is moved
	ks.mu.Unlock()
	defer func() {
		ks.mu.Lock()
		ks.listenOff()
		ks.mu.Unlock()
	}()
	if !ks.enter(s, seen) {
		l.lateGiveBack(n, g)
		return g, seen, nil
	}
	defer ks.leave(s)
	t := time.NewTimer(g.wait)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if s.owner.CompareAndSwap(sleeperOwns, settled) {
				return s.g, seen, nil
			}
			// a move took the booking as it came due: the new one comes on s.moved
		case m := <-s.moved:
			if m.err != nil || !m.g.granted {
				return m.g, seen, m.err
			}
			s.g, seen = m.g, m.seen
			s.owner.Store(sleeperOwns)
			if !ks.enter(s, seen) { // a hold began after the move passed the last one
				s.owner.Store(settled)
				l.lateGiveBack(n, s.g)
				return s.g, seen, nil
			}
			t.Reset(m.g.wait)
		case <-ctx.Done():
			if s.owner.CompareAndSwap(sleeperOwns, settled) {
				go l.lateGiveBack(n, s.g)
			} else { // being moved: the new booking, when it comes, goes back
				go func() {
					if m := <-s.moved; m.err == nil && m.g.granted && m.g.wait > 0 {
						l.lateGiveBack(n, m.g)
					}
				}()
			}
			return grant{}, seen, ctx.Err()
		}
	}
}

// enter registers s, whose booking was made after the hold seen, and reports true. If
// a hold began since seen, it registers nothing and reports false: that hold's move may
// have run without s. (holdFor sets the hold before its move takes ks.mu, so a sleeper
// either sees the new hold here or is found by the move.)
func (ks *keyState) enter(s *sleeper, seen int64) bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.hold.Load() != seen {
		return false
	}
	if ks.sleepers == nil {
		ks.sleepers = map[*sleeper]struct{}{}
	}
	ks.sleepers[s] = struct{}{}
	return true
}

// leave unregisters s.
func (ks *keyState) leave(s *sleeper) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	delete(ks.sleepers, s)
}

// listenOn counts one more waiter that a resume concerns; the first one listens on the
// key's channel (ks.mu held).
func (ks *keyState) listenOn() {
	ks.listeners++
	if ks.listen == nil {
		ks.listen = &listener{channel: wakeChannel(ks.tag), check: make(chan struct{}, 1), resumed: ks.resumedNotice}
		h := ks.client.hub
		if !h.listen(ks.listen) {
			h.subscribe(ks.listen)
		}
	}
}

// listenOff counts one waiter less; the last one stops listening (ks.mu held).
func (ks *keyState) listenOff() {
	ks.listeners--
	if ks.listeners == 0 && ks.listen != nil {
		ks.client.hub.unlisten(ks.listen)
		ks.listen = nil
	}
}

// move gives back the bookings of the sleepers which selects and books them again
// once this process's hold on the key is over, in one round trip each time: the latest
// given back first, so that a token bucket gets back everything they took, and booked
// again in the order they were booked, so that they keep their order. Each sleeper then
// sleeps on its new booking.
func (ks *keyState) move(which func(*sleeper) bool) {
	ks.mu.Lock()
	var ss []*sleeper
	for s := range ks.sleepers {
		if !s.g.local && which(s) && s.owner.CompareAndSwap(sleeperOwns, movedOwns) { // a local grant is not Redis's to move
			ss = append(ss, s)
			delete(ks.sleepers, s)
		}
	}
	ks.mu.Unlock()
	if len(ss) == 0 {
		return
	}
	slices.SortFunc(ss, func(a, b *sleeper) int { return int(a.g.token - b.g.token) })
	go func() {
		var back []*request
		for i := len(ss) - 1; i >= 0; i-- {
			s := ss[i]
			back = append(back, s.l.request(context.Background(), ks, []any{opCancel, s.n, s.g.token, 0, 0}, s.l.timeout))
		}
		ks.client.doAll(back)
		seen, _, _ := ks.pass(context.Background())
		again := make([]*request, len(ss))
		for i, s := range ss {
			x := min(int64(maxWait(s.ctx)/time.Microsecond), maxWaitMicros)
			again[i] = s.l.request(s.ctx, ks, []any{opAcquire, s.n, x, 0, 0}, s.l.timeout)
			again[i].late = func(rep reply) {
				if g := decodeGrant(rep); g.granted && g.wait > 0 {
					s.l.lateGiveBack(s.n, g)
				}
			}
		}
		for i, res := range ks.client.doAll(again) {
			g := decodeGrant(res.rep)
			if res.err == nil {
				ss[i].l.report(ss[i].n, g)
			}
			ss[i].moved <- moved{g, res.err, seen}
		}
	}()
}

// request returns a request of l's script on ks.
func (l *Limiter) request(ctx context.Context, ks *keyState, fields []any, timeout time.Duration) *request {
	return &request{ctx: ctx, t: l.t, ks: ks, fields: fields, timeout: timeout}
}
