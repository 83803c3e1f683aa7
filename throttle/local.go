package throttle

import (
	"sync"
	"time"
)

// localLog is FailLocal's in-process limiter: the permit log of lua/log.lua in Go, with
// every limit cut to the process's share of the fleet. It decides while Redis is
// unreachable; times are the Go clock's, in microseconds.
type localLog struct {
	mu      sync.Mutex
	limits  []Limit // the process's share
	entries []localEntry
}

type localEntry struct {
	at int64 // µs
	n  int
}

// newLocalLog cuts each limit to 1/fleet of it, rounding down but never below 1. A
// token bucket's share is a log of its burst's share per the time the bucket takes to
// refill that share, which keeps both its burst and its rate.
func newLocalLog(limits []Limit, alg Algorithm, fleet int) *localLog {
	share := make([]Limit, len(limits))
	for i, l := range limits {
		rate := max(1, l.Rate/fleet)
		period := l.Period
		if alg == TokenBucket {
			burst := max(1, l.burst()/fleet)
			// burst permits per the time the fleet's share takes to refill them
			period = time.Duration(float64(l.Period) * float64(burst) * float64(fleet) / float64(l.Rate))
			rate = burst
		}
		share[i] = Limit{Rate: rate, Period: period}
	}
	return &localLog{limits: share}
}

// maxN is the largest n the share can ever grant.
func (g *localLog) maxN() int {
	m := maxRate
	for _, l := range g.limits {
		m = min(m, l.Rate)
	}
	return m
}

// acquire is the script's acquire on the local log (see lua/log.lua).
func (g *localLog) acquire(now int64, n int, maxWait int64) reply {
	g.mu.Lock()
	defer g.mu.Unlock()
	var pmax int64
	for _, l := range g.limits {
		pmax = max(pmax, l.periodMicros())
	}
	// trim what no window can see any more
	i := 0
	for i < len(g.entries) && g.entries[i].at <= now-pmax {
		i++
	}
	g.entries = g.entries[i:]

	t := now
	if k := len(g.entries); k > 0 {
		t = max(t, g.entries[k-1].at)
	}
	if n > 0 {
		for _, l := range g.limits {
			// the permit that must have left the window: walk back from the newest
			need, p := l.Rate-n, l.periodMicros()
			seen := 0
			for j := len(g.entries) - 1; j >= 0; j-- {
				seen += g.entries[j].n
				if seen > need {
					t = max(t, g.entries[j].at+p)
					break
				}
			}
		}
	}
	r := reply{local: true}
	wait := t - now
	if n == 0 {
		wait = 0
	}
	if wait > maxWait {
		r.wait = time.Duration(wait) * time.Microsecond
		return r
	}
	r.granted = true
	r.wait = time.Duration(wait) * time.Microsecond
	if n > 0 {
		if k := len(g.entries); k > 0 && g.entries[k-1].at == t {
			g.entries[k-1].n += n
		} else {
			g.entries = append(g.entries, localEntry{at: t, n: n})
		}
		r.token = t
	}
	return r
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
