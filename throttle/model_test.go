package throttle

import (
	"time"
)

// model is a plain-Go reference for the log-based and window algorithms: a list of
// grants, and the rule each algorithm states, computed the slow, obvious way.
type model struct {
	alg    Algorithm
	limits []Limit
	bucket int64 // SlidingCounter's sub-bucket, µs
	grants []modelGrant
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
	for _, l := range m.limits {
		p := l.periodMicros()
		used := 0
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
	floor := now
	if len(m.grants) > 0 {
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
	if len(m.grants) > 0 {
		last := m.grants[len(m.grants)-1]
		if last.at > now || (m.alg == SlidingCounter && last.rec-m.bucket > now) {
			return 0
		}
	}
	for _, l := range m.limits {
		p := l.periodMicros()
		used := 0
		for _, g := range m.grants {
			if m.alg == FixedWindow {
				if floorDiv(g.at, p) == floorDiv(now, p) {
					used += g.n
				}
			} else if g.rec > now-p {
				used += g.n
			}
		}
		rem = min(rem, l.Rate-used)
	}
	return max(0, rem)
}

func (m *model) reset(now int64) time.Duration {
	var r int64
	for _, g := range m.grants {
		for _, l := range m.limits {
			p := l.periodMicros()
			end := g.rec + p
			if m.alg == FixedWindow {
				end = (floorDiv(g.at, p) + 1) * p
			} else if l.periodMicros() != maxPeriodOf(m.limits) {
				continue // the log keeps entries for the longest period
			}
			r = max(r, end-now)
		}
	}
	return time.Duration(r) * time.Microsecond
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
