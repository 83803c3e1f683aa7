package throttle

import (
	"math/bits"
	"sync"
)

// stateWatch is what a Limiter remembers of its own latest grant, to notice (for
// Hooks.StateLost) a reply from a state that no longer holds it: the key was evicted,
// deleted, or lost in a failover or restart.
//
// Only granted calls that take effect at once are checked: their reply carries the
// server time (token - wait), so the check compares server times with server times
// and never the Go clock. A state that is still there holds our permits until they
// leave their windows (the token bucket: until its arrival time has passed them), and
// nothing but our own cancel takes them out, so the reply's Remaining can be no more
// than what those permits leave; a larger one means they are gone. Other processes
// only add permits, and give back only their own, so they cannot cause a false alarm.
type stateWatch struct {
	mu   sync.Mutex
	mark stateMark
}

// stateMark is one grant of this Limiter, by the server's clock (µs).
type stateMark struct {
	token int64 // when its n permits take effect; 0: none
	at    int64 // when the call that made it ran
	n     int
}

// before reports whether the mark is a grant made, and taken effect, before server
// time at (µs).
func (m stateMark) before(at int64) bool {
	return m.token != 0 && m.at < at && m.token <= at
}

// get returns the mark as it is before a call (the call must run after its grant).
func (w *stateWatch) get() stateMark {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mark
}

// observe checks the reply r to a call (op, n, waitOrToken) made after mark, reports
// a lost state to the hook, and remembers a newer grant.
func (l *Limiter) observe(mark stateMark, op, n int, waitOrToken int64, r reply) {
	w := l.latest
	if op == opCancel {
		if r.granted {
			w.mu.Lock()
			if w.mark.token == waitOrToken { // our latest grant was (partly) given back
				w.mark = stateMark{}
			}
			w.mu.Unlock()
		}
		return
	}
	if !r.granted || n == 0 || r.token == 0 {
		return
	}
	at := r.token - r.wait.Microseconds()
	// only a grant taking effect at once is checked (see stateWatch)
	if r.wait == 0 && mark.before(at) && r.remaining > l.mostRemaining(mark, at, n) {
		l.hooks.StateLost(l.key)
	}
	w.mu.Lock()
	if at > w.mark.at {
		w.mark = stateMark{token: r.token, at: at, n: n}
	}
	w.mu.Unlock()
	l.keep(r.wait + l.keepFor) // a Limiter built later on the key compares with it
}

// mostRemaining is the largest Remaining a call granting n at server time now (not
// booked ahead) can report while the state still holds mark's permits.
func (l *Limiter) mostRemaining(mark stateMark, now int64, n int) int {
	most := maxRate
	for _, lim := range l.limits {
		p, rate := lim.periodMicros(), int64(lim.Rate)
		switch l.alg {
		case SlidingWindow, SlidingCounter: // mark's permits count while in the window
			if mark.token+p > now {
				most = min(most, lim.Rate-mark.n-n)
			}
		case FixedWindow: // ... while in the same aligned window
			if mark.token/p == now/p { // server times are positive

				most = min(most, lim.Rate-mark.n-n)
			}
		case TokenBucket:
			// the arrival time is at least token + n_mark × period/rate, so the bucket
			// lacks a = (token - now) × rate / period + n_mark tokens besides the n taken
			// now: Remaining <= burst - n - ceil(a), when a > 0
			since := uint64(now - mark.token)
			hi, lo := bits.Mul64(since, uint64(rate))
			owed := uint64(mark.n) * uint64(p) // <= 2^50
			if hi != 0 || lo >= owed {
				continue
			}
			lack := int((owed - lo + uint64(p) - 1) / uint64(p)) // ceil(a), a in tokens × period

			most = min(most, lim.burst()-n-lack)
		}
	}
	return max(0, most)
}
