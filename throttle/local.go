package throttle

import (
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
)

// localLog is FailLocal's in-process limiter: the permit log of lua/log.lua in Go, with
// every limit cut to the process's share of the fleet. It decides while Redis is
// unreachable; times are the Go clock's, in microseconds.
type localLog struct {
	unit    string        // what its limits count ("": calls)
	limits  []Limit       // the process's share
	maxN    int           // the largest n the share can ever grant
	span    time.Duration // its longest period: how long a grant counts in it
	cap     bool          // a tenant's caps' (localCaps): a denial it causes is ByCap
	mu      sync.Mutex
	entries []localEntry
}

type localEntry struct {
	at int64 // µs
	n  int
}

// newLocalLog cuts each limit (all of one unit) to the process's share of a fleet.
func newLocalLog(limits []Limit, a *algorithm, fleet int) *localLog {
	g := &localLog{maxN: maxRate}
	for _, l := range limits {
		share := a.share(l, fleet)
		g.unit, g.limits = l.Unit, append(g.limits, share)
		g.maxN, g.span = min(g.maxN, share.Rate), max(g.span, share.Period)
	}
	return g
}

// newLocalLogs is newLocalLog of each unit's limits (limits in byUnit's order); caps: they
// are a tenant's caps.
func newLocalLogs(limits []Limit, a *algorithm, fleet int, caps bool) []*localLog {
	var logs []*localLog
	for i := 0; i < len(limits); {
		j := i + 1
		for j < len(limits) && limits[j].Unit == limits[i].Unit {
			j++
		}
		g := newLocalLog(limits[i:j], a, fleet)
		g.cap = caps
		logs, i = append(logs, g), j
	}
	return logs
}

// acquireLocal takes need(its unit) permits on every log of logs (locked in order: the
// limits', then a tenant's caps') at the earliest time all have room, or none.
func acquireLocal(now int64, need func(unit string) int, maxWait int64, logs ...*localLog) grant {
	for _, g := range logs {
		g.mu.Lock()
		defer g.mu.Unlock()
		g.trim(now)
	}
	t, any := now, false
	for moved := true; moved; { // each fit moves t only later
		moved = false
		for _, g := range logs {
			if n := need(g.unit); n > 0 {
				if f := g.fit(n, t); f > t {
					t, moved = f, true
				}
				any = true
			}
		}
	}
	if !any {
		return grant{granted: true, local: true}
	}
	r := grant{local: true, wait: time.Duration(t-now) * time.Microsecond}
	if t-now > maxWait {
		// denied by the logs whose own room comes later, as the script says: a tenant's
		// caps (FlagCap) or the limits
		var limits, caps int64
		for _, g := range logs {
			if n := need(g.unit); n > 0 && g.cap {
				caps = max(caps, g.fit(n, now))
			} else if n > 0 {
				limits = max(limits, g.fit(n, now))
			}
		}
		if caps > limits {
			r.flags = protocol.FlagCap
		}
		return r
	}
	for _, g := range logs {
		if n := need(g.unit); n > 0 {
			g.take(n, t)
		}
	}
	r.granted, r.token = true, t
	return r
}

// trim drops what no window can see any more (g.mu held).
func (g *localLog) trim(now int64) {
	i := 0
	for i < len(g.entries) && g.entries[i].at <= now-ceilMicros(g.span) {
		i++
	}
	g.entries = g.entries[i:]
}

// fit returns the earliest time >= t at which n permits fit every limit (g.mu held).
func (g *localLog) fit(n int, t int64) int64 {
	if k := len(g.entries); k > 0 {
		t = max(t, g.entries[k-1].at)
	}
	for _, l := range g.limits {
		// the permit that must have left the window: walk back from the newest
		need, seen := l.Rate-n, 0
		for j := len(g.entries) - 1; j >= 0; j-- {
			seen += g.entries[j].n
			if seen > need {
				t = max(t, g.entries[j].at+l.periodMicros())
				break
			}
		}
	}
	return t
}

// take books n permits at t (g.mu held).
func (g *localLog) take(n int, t int64) {
	if k := len(g.entries); k > 0 && g.entries[k-1].at == t {
		g.entries[k-1].n += n
	} else {
		g.entries = append(g.entries, localEntry{at: t, n: n})
	}
}

// cancel gives back n permits booked at token, if that is still in the future.
func (g *localLog) cancel(now, token int64, n int) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if token <= now {
		return false
	}
	for j := len(g.entries) - 1; j >= 0; j-- {
		if g.entries[j].at == token {
			g.entries[j].n -= min(n, g.entries[j].n)
			if g.entries[j].n == 0 {
				g.entries = append(g.entries[:j], g.entries[j+1:]...)
			}
			return true
		}
	}
	return false
}

// localCaps are the process's shares of each tenant's caps, by tenant, made as tenants
// come; one whose grants no window counts any more goes when more than localCapsSweep
// are kept.
type localCaps struct {
	mu      sync.Mutex // held while a tenant's logs are used (with), so the sweep waits
	make    func() []*localLog
	tenants map[string][]*localLog
}

const localCapsSweep = 1024

// with calls f with tenant's logs at now (µs), holding c.mu: a sweep cannot forget them
// between f finding them idle and booking in them, which would leave the booking in
// logs the tenant's next call no longer finds. Every local decision on the key locks
// the limits' logs too, so holding c.mu meanwhile serializes nothing more.
func (c *localCaps) with(tenant string, now int64, f func([]*localLog)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f(c.of(tenant, now))
}

// of returns tenant's logs (c.mu held).
func (c *localCaps) of(tenant string, now int64) []*localLog {
	g := c.tenants[tenant]
	if g == nil {
		if len(c.tenants) >= localCapsSweep {
			for name, logs := range c.tenants {
				idle := true
				for _, o := range logs {
					o.mu.Lock()
					o.trim(now)
					idle = idle && len(o.entries) == 0
					o.mu.Unlock()
				}
				if idle {
					delete(c.tenants, name)
				}
			}
		}
		g = c.make()
		c.tenants[tenant] = g
	}
	return g
}

// localSem is a Semaphore's in-process stand-in while Redis is unreachable: FailLocal's
// share of the slots (max/fleet, at least 1), or, under FailOpen, as many as asked.
// Leases expire after the lease TTL unless extended, by the Go clock.
type localSem struct {
	mu     sync.Mutex
	max    int // 0: no limit (FailOpen)
	leases map[string]time.Time
}

func newLocalSem(slots int, p FailurePolicy) *localSem {
	s := &localSem{leases: map[string]time.Time{}}
	if p.mode == failLocal {
		s.max = max(1, slots/p.fleet)
	}
	return s
}

// acquire grants id a lease until now+ttl if a slot is free, or returns the time until
// the earliest lease expires.
func (s *localSem) acquire(now time.Time, id string, ttl time.Duration) (bool, time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var earliest time.Time
	for lid, exp := range s.leases {
		if !exp.After(now) {
			delete(s.leases, lid)
		} else if earliest.IsZero() || exp.Before(earliest) {
			earliest = exp
		}
	}
	if _, held := s.leases[id]; held || s.max == 0 || len(s.leases) < s.max {
		if s.max != 0 {
			s.leases[id] = now.Add(ttl)
		}
		return true, 0
	}
	return false, max(earliest.Sub(now), time.Microsecond)
}

// renew gives id's lease ttl more from now, or frees it when ttl is 0; it reports
// whether the lease was live.
func (s *localSem) renew(now time.Time, id string, ttl time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	exp, ok := s.leases[id]
	live := s.max == 0 || ok && exp.After(now)
	delete(s.leases, id)
	if live && ttl > 0 && s.max != 0 {
		s.leases[id] = now.Add(ttl)
	}
	return live
}
