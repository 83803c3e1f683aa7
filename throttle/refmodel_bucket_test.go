package throttle

import (
	"math/big"
	"time"
)

// bucketModel is a plain-Go reference for the token bucket, GCRA the slow, obvious
// way: exact rational arithmetic on each limit's theoretical arrival time (TAT), the
// rules gcra.lua's header states, and the state key's expiry. (x/time/rate, the other
// reference, works in floats and has no several limits, bookings capped by maxWait or
// pauses; the fuzz target checks the two agree where both apply.)
type bucketModel struct {
	limits  []Limit
	tat     []*big.Rat // per limit, µs; at or before now means a full bucket
	latest  int64      // L: when the latest grant takes or took effect
	paused  int64      // when a pause on the key ends, µs (0: none)
	expires int64      // when the state key expires, µs; at or before now: no key
}

func newBucketModel(limits []Limit) *bucketModel {
	return &bucketModel{limits: limits, tat: make([]*big.Rat, len(limits))}
}

func rat(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }

// emission is period / rate, the time one permit takes to come back, µs.
func (m *bucketModel) emission(i int) *big.Rat {
	l := m.limits[i]
	return new(big.Rat).SetFrac64(l.periodMicros(), int64(l.Rate))
}

func ratMax(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) >= 0 {
		return a
	}
	return b
}

func ratCeil(r *big.Rat) int64 {
	q, m := new(big.Int).DivMod(r.Num(), r.Denom(), new(big.Int))
	if m.Sign() != 0 {
		q.Add(q, big.NewInt(1))
	}
	return q.Int64()
}

func ratFloor(r *big.Rat) int64 {
	q := new(big.Int).Div(r.Num(), r.Denom()) // Euclidean: floor for a positive divisor
	return q.Int64()
}

// live drops the state once its key has expired: an absent key is full buckets.
func (m *bucketModel) live(now int64) bool {
	if now >= m.expires {
		for i := range m.tat {
			m.tat[i] = nil
		}
		m.latest = 0
		return false
	}
	return true
}

// at returns limit i's TAT, or now if it is earlier (a full bucket).
func (m *bucketModel) at(i int, now int64) *big.Rat {
	if m.tat[i] == nil {
		return rat(now)
	}
	return ratMax(m.tat[i], rat(now))
}

// save is what the script writes: every TAT, with a TTL (whole ms, at least 1) that
// lasts until every bucket is full again.
func (m *bucketModel) save(now int64) {
	var ttl int64
	for i := range m.limits {
		ttl = max(ttl, ratCeil(new(big.Rat).Sub(m.at(i, now), rat(now))))
	}
	m.expires = now + 1000*max(1, (ttl+999)/1000)
}

// report returns what a call made now could still get and the time until every
// bucket is full again.
func (m *bucketModel) report(now int64) (int, time.Duration) {
	remaining, reset := int64(maxRate), int64(0)
	for i, l := range m.limits {
		ahead := new(big.Rat).Sub(m.at(i, now), rat(now)) // µs until full
		tokens := new(big.Rat).Sub(rat(int64(l.burst())), new(big.Rat).Quo(ahead, m.emission(i)))
		remaining = min(remaining, ratFloor(tokens))
		reset = max(reset, ratCeil(ahead))
	}
	if m.paused > now || m.latest > now {
		remaining = 0
	}
	return int(max(0, remaining)), time.Duration(reset) * time.Microsecond
}

// allow is an acquire of n with maxWait (µs): the earliest time, not before a pause's
// end nor the latest grant, when every bucket holds n; granted if that is within
// maxWait (cut to 2^50 / rate). It returns the reply, the wait and the token.
func (m *bucketModel) allow(now int64, n int, maxWait int64) (Result, int64, int64) {
	m.live(now)
	for _, l := range m.limits {
		maxWait = min(maxWait, (1<<50)/int64(l.Rate))
	}
	t := max(now, m.paused, m.latest)
	if n > 0 {
		for i, l := range m.limits {
			// conforming: max(TAT, t) + n × emission - t <= burst × emission
			need := new(big.Rat).Add(m.at(i, now), new(big.Rat).Mul(rat(int64(n-l.burst())), m.emission(i)))
			t = max(t, ratCeil(need))
		}
	}
	wait := t - now
	if n == 0 {
		wait = 0
	}
	var res Result
	if wait > maxWait {
		res.RetryAfter = time.Duration(wait) * time.Microsecond
		res.Remaining, res.ResetAfter = m.report(now)
		return res, wait, 0
	}
	res.Allowed = true
	token := int64(0)
	if n > 0 {
		for i := range m.limits {
			m.tat[i] = new(big.Rat).Add(ratMax(m.at(i, now), rat(t)), new(big.Rat).Mul(rat(int64(n)), m.emission(i)))
		}
		m.latest = t
		m.save(now)
		token = t
	}
	res.Remaining, res.ResetAfter = m.report(now)
	return res, wait, token
}

// cancel gives back what x/time/rate gives back for a booking of n at token: n
// permits less the time booked after it, per limit, if the state is there and token
// is still ahead. It reports whether anything was given back, and the reset after.
func (m *bucketModel) cancel(now, token int64, n int) (bool, time.Duration) {
	freed := false
	if m.live(now) && token > now {
		for i := range m.limits {
			e := m.emission(i)
			nT := new(big.Rat).Mul(rat(int64(n)), e)
			back := new(big.Rat).Sub(nT, rat(m.latest-token))
			if back.Cmp(nT) > 0 {
				back = nT
			}
			if back.Sign() > 0 {
				m.tat[i] = ratMax(rat(now), new(big.Rat).Sub(m.at(i, now), back))
				freed = true
			}
		}
		if freed {
			m.save(now)
		}
	}
	_, reset := m.report(now)
	return freed, reset
}

// pause is pause.lua on the key (see model.pause).
func (m *bucketModel) pause(now, d int64) int64 {
	m.paused = max(m.paused, now+d)
	return m.paused - now
}

// evict forgets the state, as if its key had been deleted.
func (m *bucketModel) evict() {
	m.expires = 0
	m.live(1)
}
