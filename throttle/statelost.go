package throttle

import (
	"context"
	"sync"
	"time"
)

// stateWatch is what a configuration remembers of its own latest grant on a key, to
// notice (Hooks.StateLost) a reply from a state that no longer holds it: the key was
// evicted, deleted, or lost in a failover or restart.
//
// Only grants that take effect at once are checked: their reply carries the server time
// (token - wait), so server times are compared with server times, never the Go clock's.
// A state still there holds our permits until they leave their windows (the bucket:
// until they have come back), and only our own cancel takes them out, so the reply's
// Remaining can be no more than what they leave; a larger one means they are gone.
// Other processes only add permits, and give back only their own: no false alarm.
type stateWatch struct {
	mu   sync.Mutex
	mark stateMark
}

// stateMark is one grant, by the server's clock (µs).
type stateMark struct {
	token int64 // when its n permits take effect; 0: none
	at    int64 // when the call that made it ran
	n     int
}

// observe checks g, the grant of n permits of a call made after mark, reports a lost
// state to the hook, and remembers a newer grant.
func (l *Limiter) observe(ctx context.Context, ks *keyState, cs *configState, mark stateMark, n int, g grant) {
	if !g.granted || n == 0 || g.token == 0 || l.limits[0].Unit != "" { // (Remaining counts calls)
		return
	}
	at := g.token - g.wait.Microseconds()
	if g.wait == 0 && mark.token != 0 && mark.at < at && mark.token <= at && g.remaining > l.mostRemaining(mark, at, n) &&
		!l.overridden(ctx, ks) {
		l.hooks.StateLost(l.key)
	}
	cs.watch.mu.Lock()
	if at > cs.watch.mark.at {
		cs.watch.mark = stateMark{token: g.token, at: at, n: n}
	}
	cs.watch.mu.Unlock()
	ks.keepFor(g.wait + l.counted) // a Limiter built later on the key compares with it
}

// mostRemaining is the largest Remaining a call granting n at server time now (not
// booked ahead) can report while the state still holds mark's permits.
func (l *Limiter) mostRemaining(mark stateMark, now int64, n int) int {
	most := maxRate
	for _, lim := range l.limits {
		if lack, ok := l.a.lack(lim, mark.token, mark.n, now); ok && lim.Unit == "" {
			most = min(most, l.a.maxN(lim)-lack-n) // maxN: the capacity
		}
	}
	return max(0, most)
}

// overridden reports whether an override of the key's rates, which raises Remaining as a
// lost state does, may be in force: one this process set, or one a read of the key finds
// (then not read again until its end). A read that fails reports none.
func (l *Limiter) overridden(ctx context.Context, ks *keyState) bool {
	if time.Now().UnixNano() < ks.overridden.Load() {
		return true
	}
	st, err := l.Inspect(ctx)
	if err != nil || st.Override <= 0 {
		return false
	}
	raise(&ks.overridden, time.Now().Add(st.Override).UnixNano())
	return true
}
