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
// this process holds the key, it books when the hold ends.
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	if err := l.check(ctx, n); err != nil {
		return err
	}
	start := clock.Now()
	slept := false
	ks := l.c.key(l.t.tag)
	held, err := ks.pass(ctx)
	if err != nil {
		return err
	}
	g, err := l.acquire(ctx, n, maxWait(ctx), nil)
	if err != nil {
		return err
	}
	if g.granted && g.wait > 0 {
		slept = true
		if g, err = ks.sleep(ctx, l, n, g); err != nil {
			return err
		}
	}
	if !g.granted {
		return fmt.Errorf("jobthrottle: key %q: %w: n=%d would wait %v", l.key, waiter.ErrWouldExceedDeadline, n, g.wait)
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

// moved is a sleeper's booking after a move: booked again, or why not.
type moved struct {
	g   grant
	err error
}

// sleep sleeps on g, a booking of n permits for l, until it takes effect, and returns
// it; if a hold or a resume moves it meanwhile, it sleeps on the new booking. If ctx
// ends first, it returns ctx.Err() at once; the booking is given back in the
// background.
func (ks *keyState) sleep(ctx context.Context, l *Limiter, n int, g grant) (grant, error) {
	s := &sleeper{l: l, ctx: ctx, n: n, g: g, moved: make(chan moved, 1)}
	ks.enter(s)
	defer ks.leave(s)
	t := time.NewTimer(g.wait)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			if s.owner.CompareAndSwap(sleeperOwns, settled) {
				return s.g, nil
			}
			// a move took the booking as it came due: the new one comes on s.moved
		case m := <-s.moved:
			if m.err != nil || !m.g.granted {
				return m.g, m.err
			}
			s.g = m.g
			s.owner.Store(sleeperOwns)
			t.Reset(m.g.wait)
			ks.mu.Lock()
			ks.sleepers[s] = struct{}{} // movable again
			ks.mu.Unlock()
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
			return grant{}, ctx.Err()
		}
	}
}

// enter registers s; the first sleeper of the key listens for resumes on its channel.
func (ks *keyState) enter(s *sleeper) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.sleepers == nil {
		ks.sleepers = map[*sleeper]struct{}{}
	}
	ks.sleepers[s] = struct{}{}
	if ks.listen == nil {
		ks.listen = &listener{channel: wakeChannel(ks.tag), check: make(chan struct{}, 1), resumed: ks.resumed}
		h := ks.client.hub
		if !h.listen(ks.listen) {
			h.subscribe(ks.listen)
		}
	}
}

// leave unregisters s; the last sleeper stops listening.
func (ks *keyState) leave(s *sleeper) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	delete(ks.sleepers, s)
	if len(ks.sleepers) == 0 && ks.listen != nil {
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
		_, _ = ks.pass(context.Background())
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
			ss[i].moved <- moved{g, res.err}
		}
	}()
}

// request returns a request of l's script on ks.
func (l *Limiter) request(ctx context.Context, ks *keyState, fields []any, timeout time.Duration) *request {
	return &request{ctx: ctx, t: l.t, ks: ks, fields: fields, timeout: timeout}
}
