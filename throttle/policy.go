package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/redis/go-redis/v9"
)

// FailurePolicy is what a limiter does when Redis is unreachable (see ErrUnavailable
// for what counts). Bad input and script errors are errors under every policy.
type FailurePolicy struct {
	mode  failMode
	fleet int
}

type failMode int

const (
	failClosed failMode = iota
	failOpen
	failLocal
)

var (
	// FailClosed, the default: the call returns an error wrapping ErrUnavailable and
	// grants nothing. Nothing is ever over the limit; work waits for Redis.
	FailClosed = FailurePolicy{mode: failClosed}

	// FailOpen grants every request while Redis is unreachable, calling the Degraded
	// hook. Work goes on at any rate; use it where a missed limit costs less than
	// stopped work.
	FailOpen = FailurePolicy{mode: failOpen}
)

// FailLocal returns the policy that decides in-process while Redis is unreachable:
// each process enforces its share, every limit (and every tenant's cap) divided by
// fleetSize (rounded down, at least 1), with the sliding window's exactness; so as long
// as at most fleetSize processes run, the fleet stays within the limits and caps. A request larger than the share
// can ever grant fails with ErrUnavailable. When Redis answers again decisions go back
// to it; the grants made locally are not known to Redis, so for one period after the
// outage the fleet can reach the limit once in Redis and once in the local shares.
func FailLocal(fleetSize int) FailurePolicy {
	return FailurePolicy{mode: failLocal, fleet: fleetSize}
}

// String returns "FailClosed", "FailOpen" or "FailLocal(n)".
func (p FailurePolicy) String() string {
	switch p.mode {
	case failOpen:
		return "FailOpen"
	case failLocal:
		return fmt.Sprintf("FailLocal(%d)", p.fleet)
	}
	return "FailClosed"
}

// WithFailurePolicy sets what a Limiter or Semaphore does when Redis is unreachable;
// the default is FailClosed (see NewSemaphore for how a Semaphore applies it). Under
// FailOpen and FailLocal a failed call makes the limiter decide without Redis for a
// short while (250ms, growing to 1s while Redis stays away) before it tries Redis
// again, so an outage does not cost every call a timeout; one call then probes Redis
// and, when it answers, every decision goes back to it. Only decisions go without
// Redis: a give-back, a lease's extension or release, a settle, an inspect and an
// operator's call go to Redis all the same.
func WithFailurePolicy(p FailurePolicy) CommonOption {
	return commonOption(func(c *config) {
		if c.check(p.mode != failLocal || p.fleet >= 1, "%w: FailLocal fleet size %d, want >= 1", ErrInvalidArgument, p.fleet) {
			c.policy = p
		}
	})
}

// reloadSlots asks a cluster client to read the slot map again (in the background, at
// most 5 a second) after a call failed because Redis could not serve it, so that a dead
// master's promoted replica serves at once: go-redis reads the map by itself only on a
// MOVED reply, which a dead node never sends, or every ClusterStateReloadInterval (a
// minute by default).
func reloadSlots(rdb redis.UniversalClient) {
	if c, ok := rdb.(*redis.ClusterClient); ok {
		c.ReloadState(context.Background())
	}
}

// breaker remembers that Redis was unreachable, so that FailOpen and FailLocal decide
// locally for a while instead of paying a timeout on every call.
type breaker struct {
	mu        sync.Mutex
	downUntil time.Time
	backoff   time.Duration
}

const (
	breakerFirst = 250 * time.Millisecond
	breakerMax   = time.Second
)

// local reports whether a call goes without Redis now, decided by the policy: under
// FailOpen or FailLocal, a call asking for a grant (acquire) while the key's breaker is
// open. Every other call (a give-back, a lease's extension or release, a settle, an
// inspect, an operator's control) has no answer but Redis's, so it goes to Redis.
func (p FailurePolicy) local(ks *keyState, acquire bool) bool {
	return acquire && p.mode != failClosed && ks.breaker.skip(time.Now())
}

// skip reports whether a call under FailOpen or FailLocal should not try Redis now;
// once the quiet time is over it lets one caller through to probe.
func (b *breaker) skip(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.downUntil.IsZero() && !now.Before(b.downUntil) {
		b.downUntil = now.Add(b.backoff) // this caller probes; others stay local
		return false
	}
	return now.Before(b.downUntil)
}

// failed opens the breaker and returns for how long.
func (b *breaker) failed(now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.downUntil.IsZero() {
		b.backoff = breakerFirst
	} else {
		b.backoff = min(2*b.backoff, breakerMax)
	}
	b.downUntil = now.Add(b.backoff)
	return b.backoff
}

func (b *breaker) succeeded() {
	b.mu.Lock()
	b.downUntil = time.Time{}
	b.mu.Unlock()
}

// idle reports whether the breaker is closed, or its quiet time over, at now.
func (b *breaker) idle(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.downUntil.Before(now)
}

// withLocalLogs calls f with FailLocal's shares at now (µs): of the limits, and a
// tenant's of its caps, which are kept while f runs (localCaps.with).
func (l *Limiter) withLocalLogs(ks *keyState, now int64, f func(logs []*localLog)) {
	cs := l.configState(ks)
	if l.tenant == nil || cs.caps == nil {
		f(cs.local)
		return
	}
	cs.caps.with(l.tenant.name, now, func(caps []*localLog) { f(append(slices.Clip(cs.local), caps...)) })
}

// need returns what a call of n takes from the limits of unit.
func (l *Limiter) need(unit string, n int) int {
	if unit == "" {
		return n
	}
	for _, c := range l.costs {
		if c.Unit == unit {
			return c.N
		}
	}
	return 0
}

// degrades reports whether err leaves the call to a FailOpen or FailLocal policy.
func (p FailurePolicy) degrades(err error) bool {
	return err != nil && p.mode != failClosed && errors.Is(err, ErrUnavailable)
}

// degraded decides an acquire of n permits within maxWait µs without Redis, under
// FailOpen or FailLocal; cause is why Redis was not used.
func (l *Limiter) degraded(ks *keyState, n int, maxWait int64, cause error) (grant, error) {
	g := grant{granted: true, local: true} // FailOpen's
	if l.policy.mode == failLocal {
		var err error
		now := clock.Now().UnixMicro()
		l.withLocalLogs(ks, now, func(logs []*localLog) {
			span := time.Duration(0)
			for _, lg := range logs {
				if m := l.need(lg.unit, n); m > lg.maxN {
					err = fmt.Errorf("%w (n=%d is above this process's share %d)", cause, m, lg.maxN)
					return
				}
				span = max(span, lg.span)
			}
			g = acquireLocal(now, func(unit string) int { return l.need(unit, n) }, maxWait, logs...)
			if g.granted && g.token != 0 {
				ks.keepFor(g.wait + span) // the grant counts in the shares until then
			}
		})
		if err != nil {
			return grant{}, err
		}
	}
	if l.hooks.Degraded != nil {
		l.hooks.Degraded(l.key, l.policy, cause)
	}
	return g, nil
}
