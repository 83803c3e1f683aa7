package throttle

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Wait is shorthand for WaitN(ctx, 1).
func (l *Limiter) Wait(ctx context.Context) error { return l.WaitN(ctx, 1) }

// WaitN books n permits and sleeps until they take effect: one Redis call however
// many callers wait, served in arrival order across every process.
//
// It returns at once, booking nothing: ctx.Err() for a done context; an error wrapping
// ErrExceedsLimit for n above what the limit can ever grant, waiter.ErrWouldExceedDeadline
// when the permits would come after ctx's deadline, or waiter.ErrNilReserver for a nil
// *Limiter. If ctx ends while it sleeps, it returns ctx.Err() at once; its booking goes
// back in the background, before any call this process makes on the key afterwards. A
// Pause by this process, or a Resume of the key by any, while
// it sleeps gives its booking back and books again, with the process's other waiters, in
// their order. Called during this process's hold, or caught by one as its booking comes
// back from Redis or comes due, it books when the hold ends.
//
// On a tenant's handle (Tenant), a call whose turn has not come, or whose permits would
// come beyond the tenants' horizon, sleeps until Redis says to ask again and asks again,
// keeping its place in its tenant's queue; on a Cost handle, a call whose costs would
// come beyond the horizon (see Cost) does too, holding no place. It returns
// waiter.ErrWouldExceedDeadline at once when that comes after ctx's deadline.
func (l *Limiter) WaitN(ctx context.Context, n int) error {
	_, err := l.waitN(ctx, n)
	return err
}

// waitN is WaitN, returning the grant it slept on.
func (l *Limiter) waitN(ctx context.Context, n int) (grant, error) {
	if err := l.check(ctx, n); err != nil {
		return grant{}, err
	}
	start, waited := clock.Now(), false
	var g grant
	ks := l.client().key(l.t.tag)
	var ticket int64 // a tenant's place, while its turn has not come
	for {
		seen, held, err := ks.pass(ctx, l)
		if err != nil {
			return grant{}, err
		}
		waited = waited || held
		fctx, from := ks.fly(ctx)
		g, err = l.acquire(fctx, n, clock.MaxWait(ctx), nil, ticket, true)
		if err != nil || !g.granted || g.wait <= 0 {
			ks.land(from)
		}
		if err != nil {
			return grant{}, err
		}
		if g.granted && g.wait > 0 {
			waited = true
			if g, seen, err = ks.sleep(ctx, l, n, moved{g, nil, seen, from}); err != nil {
				return grant{}, err
			}
		}
		// a tenant's place is held, or a call of costs was told when to ask again (it
		// books no further than its horizon ahead): ask again then
		if !g.granted && (g.ticket != 0 || len(l.costs) > 0) && g.wait <= clock.MaxWait(ctx) {
			ticket, waited = g.ticket, true
			if err := waiter.NewReservation(true, g.wait, nil).Wait(ctx); err != nil {
				if ticket != 0 { // its place goes back, or its tenant waits behind it
					ks.leave(func() { _ = l.giveBack(givingBack(ctx), n, grant{ticket: ticket}) })
				}
				return grant{}, err
			}
			continue
		}
		if !g.granted {
			return grant{}, fmt.Errorf("jobthrottle: key %q: %w: n=%d would wait %v", l.key, waiter.ErrWouldExceedDeadline, n, g.wait)
		}
		ticket = 0
		if ks.hold.Load() == seen {
			break
		}
		// A hold began after this call passed the last one, and no move took its
		// booking: its permits fall inside the hold, unused; book again after it.
		waited = true
	}
	if waited && l.hooks.Waited != nil {
		l.hooks.Waited(l.key, n, clock.Now().Sub(start))
	}
	return g, nil
}

// sleeper is a WaitN asleep on its booking, its own while it is in its key's
// sleepers; a move that takes it out sends the new booking on moved.
type sleeper struct {
	l     *Limiter
	ctx   context.Context
	n     int
	g     grant
	moved chan moved
	// while a move has it (set under ks.mu as the move takes it): back is closed once
	// the move has given its booking back; stage says whether the move books it again
	back  chan struct{}
	stage atomic.Int32
	from  chan struct{} // the flight of the booking it sleeps on (see fly)
}

// The stages of a sleeper a move took: its booking is being given back, or it is
// being booked again, or its caller left first and it is not booked again.
const (
	moving int32 = iota
	rebooking
	gone
)

// moved is a booking for a sleeper to sleep on, made after the hold seen (its first,
// or one a move made once that hold was over), or why there is none; from is its
// flight, which the sleeper ends as it takes it in.
type moved struct {
	g    grant
	err  error
	seen int64
	from chan struct{}
}

// sleep sleeps on first.g, n permits booked after the hold first.seen, until it takes
// effect, following the moves of holds, pauses and resumes, and returns the booking
// slept on and its hold. A hold begun since seen that did not move it gives the booking
// back at once.
func (ks *keyState) sleep(ctx context.Context, l *Limiter, n int, first moved) (grant, int64, error) {
	defer ks.listenNotices(l)() // a pause or a resume concerns it while it sleeps or is moved
	s := &sleeper{l: l, ctx: ctx, n: n, moved: make(chan moved, 1)}
	s.moved <- first
	seen := first.seen
	var due <-chan time.Time
	var wake time.Time       // when the booking in hand takes effect, by this process's clock
	var done <-chan struct{} // ctx's, once the booking in hand is entered: a give-back on it goes through leave
	for {
		select {
		case <-due:
			// Its permits take effect after ctx's deadline: the deadline ends the wait,
			// however late ctx's own timer runs (the select picks either when both are
			// ready, and a context's deadline is closed by a goroutine of its own).
			if dl, ok := ctx.Deadline(); ok && wake.After(dl) {
				return ks.leaveAsleep(s, seen, cmp.Or(ctx.Err(), context.DeadlineExceeded))
			}
			if ks.claim(s) {
				return s.g, seen, nil
			}
			// a move took the booking as it came due: the new one comes on s.moved
		case m := <-s.moved:
			if m.err != nil || !m.g.granted {
				ks.land(m.from)
				return m.g, seen, m.err
			}
			s.g, seen = m.g, m.seen
			if !ks.enter(s, seen, m.from) { // its next booking goes after the give-back
				ks.leave(func() { l.lateGiveBack(n, s.g) })
				return s.g, seen, nil
			}
			wake = time.Now().Add(s.g.wait)
			due, done = time.After(s.g.wait), ctx.Done() // (due: collected unfired, unstopped, Go 1.23)
		case <-done:
			return ks.leaveAsleep(s, seen, ctx.Err())
		}
	}
}

// leaveAsleep ends the sleep of s, whose caller leaves with err: the process's next
// calls on the key go after the give-back of its booking.
func (ks *keyState) leaveAsleep(s *sleeper, seen int64, err error) (grant, int64, error) {
	if ks.claim(s) {
		ks.leave(func() { s.l.lateGiveBack(s.n, s.g) })
	} else if back := s.back; s.stage.CompareAndSwap(moving, gone) { // being moved: not booked again
		ks.leave(func() { <-back })
	} else { // being booked again: the new booking goes back when it comes
		ks.leave(func() {
			m := <-s.moved
			s.l.lateGiveBack(s.n, m.g)
			ks.land(m.from)
		})
	}
	return grant{}, seen, err
}

// enter registers s, booked after the hold seen on the flight from, and ends that
// flight, unless a hold began since: that hold's move may have run without s (Pause
// sets the hold before its move takes ks.mu, so s either sees the new hold here or is
// found by the move).
func (ks *keyState) enter(s *sleeper, seen int64, from chan struct{}) bool {
	defer ks.land(from) // once s is in the sleepers: a move waiting for the flight finds it
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.hold.Load() != seen {
		return false
	}
	if ks.sleepers == nil {
		ks.sleepers = map[*sleeper]struct{}{}
	}
	s.from = from
	ks.sleepers[s] = struct{}{}
	return true
}

// fly registers a WaitN's booking (its first, or a move's) about to be sent: the
// flight, which land ends once the booking is in the sleepers or will not be. A move
// takes the sleepers of the bookings in flight as it starts once they land: a booking
// sent before a pause or a resume reached Redis may come back after its notice or
// reply was handled, still where the pause put it or before the pause; sent after, it
// was booked knowing it. The booking's calls go under the ctx returned: they wait
// (settle) only for the give-backs begun before the flight, not for those of callers
// that left while it was on its way, which may wait for a move that waits for it.
func (ks *keyState) fly(ctx context.Context) (context.Context, chan struct{}) {
	c := make(chan struct{})
	ks.mu.Lock()
	ks.flying = append(ks.flying, c)
	before := slices.Clone(ks.leaving)
	ks.mu.Unlock()
	return context.WithValue(ctx, flightKey{}, before), c
}

type flightKey struct{}

// land ends the flight c.
func (ks *keyState) land(c chan struct{}) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if i := slices.Index(ks.flying, c); i >= 0 {
		ks.flying = slices.Delete(ks.flying, i, i+1)
		close(c)
	}
}

// claim takes s out of the sleepers, and reports false if a move took it first.
func (ks *keyState) claim(s *sleeper) bool {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	_, ok := ks.sleepers[s]
	delete(ks.sleepers, s)
	return ok
}

// listenNotices hands the pauses and resumes published on the key's channel to paused
// and resume until done is called, through the key's one listener in this process:
// every WaitN of the process that sleeps, is moved or is held listens through it, and it
// stays from one user to the next until the key goes (endNotices). l is a handle on the
// key for checkPauses.
func (ks *keyState) listenNotices(l *Limiter) (done func()) {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	if ks.notices == nil {
		n := &listener{channel: keys.Name(ks.tag, keys.Wake), check: make(chan struct{}, 1), paused: ks.paused,
			resumed: func(end int64) { ks.resume(end, false) }}
		stop := make(chan struct{})
		ks.notices, ks.unlisten = n, stop
		if h := ks.client.hub; h.listen(n) {
			signal(n.check) // live for another listener: a notice may have gone by before n listened
		} else {
			h.subscribe(n) // its confirmation signals n.check
		}
		go ks.checkPauses(l, n.check, stop)
	}
	ks.nlisten++
	return func() {
		ks.mu.Lock()
		defer ks.mu.Unlock()
		if ks.nlisten--; ks.nlisten == 0 && ks.gone {
			ks.stopNotices()
		}
	}
}

// endNotices ends the key's listener as the key goes (dropped as idle, or its client
// closed), or once its last user leaves. Until then it stays from one user to the next: a
// process whose waiters sleep one after another keeps one subscription, and so checks for
// a missed pause once, not at every sleep (TestSleepsInTurnKeepOneSubscription).
func (ks *keyState) endNotices() {
	ks.mu.Lock()
	defer ks.mu.Unlock()
	ks.gone = true
	if ks.nlisten == 0 {
		ks.stopNotices()
	}
}

// stopNotices ends the key's listener, if any (ks.mu held).
func (ks *keyState) stopNotices() {
	if ks.notices != nil {
		ks.client.hub.unlisten(ks.notices)
		close(ks.unlisten)
		ks.notices, ks.unlisten = nil, nil
	}
}

// checkPauses asks Redis, through l, once per signal on check until stop is closed,
// whether the key is paused and until when, if this process has sleepers or bookings in
// flight on it then, and handles a pause found as its notice (paused). The hub signals
// check when the key's subscription is (re)confirmed: a pause published before, while
// this process's bookings were on their way or asleep with nothing subscribed, was not
// heard, and its sleepers booked before its end would go ahead inside it.
func (ks *keyState) checkPauses(l *Limiter, check, stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-check:
		}
		ks.mu.Lock()
		busy := len(ks.sleepers) > 0 || len(ks.flying) > 0
		ks.mu.Unlock()
		if !busy {
			continue
		}
		if end, err := l.pauseEnd(context.Background()); err == nil && end > 0 {
			ks.paused(end)
		}
	}
}

// move gives back, in one round trip, the bookings of the sleepers which selects, now
// and, once they land, among those of the bookings in flight now (see fly), the latest
// first so that a token bucket gets back all they took; once this process's hold is
// over, it books them again in one round trip, in their order, but those whose callers
// left meanwhile. (A booking still behind a resumed pause when the move books again
// would queue them all behind it.) A sleeper's caller that leaves during the move
// waits, through leave, for the move's give-back or its new booking: the move's calls
// wait for no give-back of its own sleepers (givingBack), only, before booking again,
// for those under way before.
func (ks *keyState) move(which func(*sleeper) bool) {
	backed := make(chan struct{})
	take := func(which func(*sleeper) bool) (ss []*sleeper) { // ks.mu held
		for s := range ks.sleepers {
			if !s.g.local && which(s) { // a local grant is not Redis's to move
				s.back = backed
				s.stage.Store(moving)
				ss = append(ss, s)
				delete(ks.sleepers, s)
			}
		}
		return ss
	}
	ks.mu.Lock()
	ss := take(which)
	flying := slices.Clone(ks.flying)
	ks.mu.Unlock()
	if len(ss) == 0 && len(flying) == 0 {
		return
	}
	go func() {
		if len(flying) > 0 {
			for _, c := range flying {
				<-c
			}
			ks.mu.Lock()
			ss = append(ss, take(func(s *sleeper) bool { return slices.Contains(flying, s.from) && which(s) })...)
			ks.mu.Unlock()
			if len(ss) == 0 {
				return
			}
		}
		slices.SortFunc(ss, func(a, b *sleeper) int { return cmp.Compare(a.g.token, b.g.token) })
		back := make([]*request, len(ss))
		var timeout time.Duration
		for i, s := range ss {
			back[len(ss)-1-i] = &request{ctx: givingBack(context.Background()), t: s.l.t, ks: ks,
				call: s.l.request(protocol.OpCancel, s.n, s.g.token), timeout: s.l.timeout}
			timeout = max(timeout, s.l.timeout)
		}
		ks.client.doAll(back)
		close(backed)
		seen, _, _ := ks.pass(context.Background(), ss[0].l)
		ks.settle(context.Background(), time.Now().Add(timeout))
		var again []*request
		var booked []*sleeper
		var froms []chan struct{}
		for _, s := range ss {
			if !s.stage.CompareAndSwap(moving, rebooking) { // its caller left
				continue
			}
			x := min(int64(clock.MaxWait(s.ctx)/time.Microsecond), protocol.MaxWait)
			call := s.l.request(protocol.OpAcquire, s.n, x)
			call.Hold = s.l.tenant != nil
			// not cut short by its caller leaving: the leave waits for its reply
			again = append(again, &request{ctx: givingBack(s.ctx), t: s.l.t, ks: ks, call: call, late: s.l.late(s.n), timeout: s.l.timeout})
			booked = append(booked, s)
			_, from := ks.fly(s.ctx) // (its calls, givingBack, wait for no give-back)
			froms = append(froms, from)
		}
		if len(again) == 0 {
			return
		}
		for i, res := range ks.client.doAll(again) {
			s := booked[i]
			g, err := decodeGrant(res.rep), res.err
			if err == nil {
				s.l.report(s.n, g)
			} else { // as a WaitN's booking made now: the failure policy decides
				g, err = s.l.refused(ks, s.n, again[i].call.X, err)
			}
			s.moved <- moved{g, err, seen, froms[i]}
		}
	}()
}
