package throttle

import (
	"slices"
	"time"
)

// model is a plain-Go reference for the log-based and window algorithms: a list of
// grants, and the rule each algorithm states, computed the slow, obvious way.
type model struct {
	alg    Algorithm
	limits []Limit
	bucket int64 // SlidingCounter's sub-bucket, µs
	grants []modelGrant
	paused int64 // when a pause on the key ends, µs (0: none)
	latest int64 // FixedWindow: when the latest grant takes effect (a cancel keeps it)
	// FixedWindow: permits given back by cancels, by limit and window
	back map[[2]int64]int
}

type modelGrant struct {
	at  int64 // when it takes effect, µs
	rec int64 // the time the algorithm counts it at, µs
	n   int
}

func newModel(alg Algorithm, limits []Limit, buckets int) *model {
	m := &model{alg: alg, limits: limits}
	if alg == SlidingCounter {
		shortest := limits[0].periodMicros()
		for _, l := range limits {
			shortest = min(shortest, l.periodMicros())
		}
		m.bucket = (shortest + int64(buckets) - 1) / int64(buckets)
	}
	return m
}

func (m *model) record(t int64) int64 {
	if m.alg == SlidingCounter {
		return (floorDiv(t, m.bucket) + 1) * m.bucket
	}
	return t
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

// fits reports whether n more permits taking effect at t keep every limit.
func (m *model) fits(t int64, n int) bool {
	for i, l := range m.limits {
		p := l.periodMicros()
		used := 0
		if m.alg == FixedWindow {
			used -= m.back[[2]int64{int64(i), floorDiv(t, p)}]
		}
		for _, g := range m.grants {
			switch m.alg {
			case FixedWindow:
				if floorDiv(g.at, p) == floorDiv(t, p) {
					used += g.n
				}
			default: // permits counted at a time after T - period hold a place at T
				if g.rec > t-p {
					used += g.n
				}
			}
		}
		if used+n > l.Rate {
			return false
		}
	}
	return true
}

// earliest returns the first time at or after now, and not before any grant (FIFO),
// when n permits fit. Candidates are now, the FIFO floor and every time a permit leaves
// a window (or a window starts).
func (m *model) earliest(now int64, n int) int64 {
	floor := max(now, m.paused)
	if m.alg == FixedWindow {
		floor = max(floor, m.latest)
	} else if len(m.grants) > 0 {
		last := m.grants[len(m.grants)-1]
		switch m.alg {
		case SlidingCounter:
			floor = max(floor, last.rec-m.bucket)
		default:
			floor = max(floor, last.at)
		}
	}
	cands := []int64{floor}
	for _, g := range m.grants {
		for _, l := range m.limits {
			p := l.periodMicros()
			if m.alg == FixedWindow {
				cands = append(cands, (floorDiv(g.at, p)+1)*p)
			} else {
				cands = append(cands, g.rec+p)
			}
		}
	}
	best := int64(-1)
	for _, c := range cands {
		if c >= floor && (best < 0 || c < best) && m.fits(c, n) {
			best = c
		}
	}
	return best
}

// allow is AllowN with maxWait (µs): it returns what the limiter must answer.
func (m *model) allow(now int64, n int, maxWait int64) (Result, int64) {
	var res Result
	t := now
	if n > 0 {
		t = m.earliest(now, n)
	}
	if t-now <= maxWait {
		res.Allowed = true
		if n > 0 {
			m.grants = append(m.grants, modelGrant{at: t, rec: m.record(t), n: n})
			m.latest = t
		}
	} else {
		res.RetryAfter = time.Duration(t-now) * time.Microsecond
	}
	res.Remaining = m.remaining(now)
	res.ResetAfter = m.reset(now)
	if !res.Allowed || n == 0 {
		t = 0
	}
	return res, t
}

func (m *model) remaining(now int64) int {
	rem := maxRate
	for _, l := range m.limits {
		rem = min(rem, l.Rate)
	}
	if m.paused > now {
		return 0
	}
	if m.alg == FixedWindow && m.latest > now {
		return 0
	}
	if len(m.grants) > 0 && m.alg != FixedWindow {
		last := m.grants[len(m.grants)-1]
		if last.at > now || (m.alg == SlidingCounter && last.rec-m.bucket > now) {
			return 0
		}
	}
	for i, l := range m.limits {
		p := l.periodMicros()
		used := 0
		if m.alg == FixedWindow {
			used = m.windowCount(i, floorDiv(now, p))
		} else {
			for _, g := range m.grants {
				if g.rec > now-p {
					used += g.n
				}
			}
		}
		rem = min(rem, l.Rate-used)
	}
	return max(0, rem)
}

// windowCount is what FixedWindow counts for limit i in window w (start w × period).
func (m *model) windowCount(i int, w int64) int {
	p := m.limits[i].periodMicros()
	used := -m.back[[2]int64{int64(i), w}]
	for _, g := range m.grants {
		if floorDiv(g.at, p) == w {
			used += g.n
		}
	}
	return used
}

func (m *model) reset(now int64) time.Duration {
	var r int64
	if m.alg == FixedWindow { // the windows of the latest grant that still count permits
		for i, l := range m.limits {
			p := l.periodMicros()
			if w := floorDiv(m.latest, p); len(m.grants) > 0 && m.windowCount(i, w) > 0 {
				r = max(r, (w+1)*p-now)
			}
		}
		return time.Duration(r) * time.Microsecond
	}
	for _, g := range m.grants {
		for _, l := range m.limits {
			if l.periodMicros() != maxPeriodOf(m.limits) {
				continue // the log keeps entries for the longest period
			}
			r = max(r, g.rec+l.periodMicros()-now)
		}
	}
	return time.Duration(r) * time.Microsecond
}

// cancel is a script's cancel: n permits booked to take effect at token are given
// back if token is still ahead. The permit log gives back up to n of the permits
// recorded at the token's (recorded) time; FixedWindow takes n off each limit's count
// whose window holding the latest grant holds the token. It reports whether anything
// was given back.
func (m *model) cancel(now, token int64, n int) bool {
	if token <= now || n <= 0 || len(m.grants) == 0 {
		return false
	}
	if m.alg == FixedWindow {
		freed := false
		for i, l := range m.limits {
			p := l.periodMicros()
			w := floorDiv(m.latest, p)
			if floorDiv(token, p) != w {
				continue
			}
			if c := m.windowCount(i, w); c > 0 {
				if m.back == nil {
					m.back = map[[2]int64]int{}
				}
				m.back[[2]int64{int64(i), w}] += min(n, c)
				freed = true
			}
		}
		return freed
	}
	rt := m.record(token)
	freed := false
	for i := len(m.grants) - 1; i >= 0 && n > 0; i-- {
		if g := &m.grants[i]; g.rec == rt {
			take := min(n, g.n)
			g.n -= take
			n -= take
			freed = true
		}
	}
	m.grants = slices.DeleteFunc(m.grants, func(g modelGrant) bool { return g.n == 0 })
	return freed
}

// pause is pause.lua: no grants until now + d, or a later pause already set. It
// returns the time until the pause ends.
func (m *model) pause(now, d int64) int64 {
	m.paused = max(m.paused, now+d)
	return m.paused - now
}

func maxPeriodOf(limits []Limit) int64 {
	var p int64
	for _, l := range limits {
		p = max(p, l.periodMicros())
	}
	return p
}

// maxInWindow returns the most permits that took effect in any window of length p
// (half-open, [s, s+p)), from the grants' real times: the bound every limit must keep.
func maxInWindow(grants []modelGrant, p int64) int {
	best := 0
	for i := range grants {
		sum := 0
		for j := i; j < len(grants) && grants[j].at < grants[i].at+p; j++ {
			sum += grants[j].n
		}
		best = max(best, sum)
	}
	return best
}
