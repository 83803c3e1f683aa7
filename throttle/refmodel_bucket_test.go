package throttle

import (
	"math/big"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
)

// bucketModel is a plain-Go reference for the token bucket: golang.org/x/time/rate's
// Limiter (advance, reserveN, CancelAt, SetLimitAt, SetBurstAt), the slow, obvious way,
// in exact rational arithmetic on whole-µs times, one per limit, and what lua/bucket.lua's
// header adds where x/time/rate has nothing to say: several limits decided together, a
// pause, a booking bounded by maxWait and by 2^50/rate, an operator's override that ends
// by itself, and an absent state key (full buckets). FuzzTokenBucket checks the script
// against it request for request, and against x/time/rate itself where both apply.
type bucketModel struct {
	given  []Limit         // the callers' limits
	over   *bucketOverride // nil: none
	paused int64           // when a pause ends, µs (0: none)
	lims   []bucketLimit   // nil: no state, every bucket full
	// lims are an absent state read as full buckets for one call: unless the call
	// changes them (and so writes them), the state stays absent
	virtual bool
}

// bucketLimit is one limit's x/time/rate Limiter: its tokens at last, and the rate and
// burst in force.
type bucketLimit struct {
	rate      *big.Rat // tokens per µs: Rate / period
	burst     int64
	tokens    *big.Rat // at last; negative when booked ahead
	last      int64
	lastEvent int64 // when the latest booking takes effect (0: none)
}

// bucketOverride is an operator's override: the rate and burst (0: the rate) of the
// first len(rates) limits, until end.
type bucketOverride struct {
	end   int64
	rates [][2]int
}

func newBucketModel(limits []Limit) *bucketModel {
	return &bucketModel{given: limits}
}

func rat(v int64) *big.Rat { return new(big.Rat).SetInt64(v) }

func ratMin(a, b *big.Rat) *big.Rat {
	if a.Cmp(b) <= 0 {
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

// inForce returns limit i's rate (per period) and burst as enforced at now: the
// callers', or an override's until it ends.
func (m *bucketModel) inForce(i int, now int64) (rate, burst int) {
	l := m.given[i]
	rate, burst = l.Rate, l.burst()
	if o := m.over; o != nil && o.end > now && i < len(o.rates) {
		rate, burst = o.rates[i][0], o.rates[i][1]
		if burst == 0 {
			burst = rate
		}
	}
	return rate, burst
}

// advance is x/time/rate's: limit i's tokens at t >= last, refilled at the rate up to
// the burst.
func (m *bucketModel) advance(i int, t int64) *big.Rat {
	l := &m.lims[i]
	tok := new(big.Rat).Add(l.tokens, new(big.Rat).Mul(rat(t-l.last), l.rate))
	return ratMin(tok, rat(l.burst))
}

// set is x/time/rate's SetLimitAt and SetBurstAt at t: the tokens held at t are kept
// (a lower burst caps them at its next advance), the new rate and burst count from t.
func (m *bucketModel) set(i int, t int64, rate, burst int) {
	l := &m.lims[i]
	l.tokens, l.last = m.advance(i, t), t
	l.rate, l.burst = new(big.Rat).SetFrac64(int64(rate), m.given[i].periodMicros()), int64(burst)
}

// ended ends an override whose end is at or before now: the rates change back at its
// end (SetLimitAt and SetBurstAt there).
func (m *bucketModel) ended(now int64) {
	if o := m.over; o != nil && o.end <= now {
		if m.lims != nil {
			for i := range m.lims {
				r, b := m.inForce(i, o.end)
				m.set(i, o.end, r, b)
			}
		}
		m.over = nil
	}
}

// at brings the model to now for a call: an override that has ended changes the rates
// back at its end, and an absent state is read as full buckets at the limits in force
// (virtual: done forgets them unless the call changed them).
func (m *bucketModel) at(now int64) {
	m.ended(now)
	if m.lims == nil {
		m.lims, m.virtual = make([]bucketLimit, len(m.given)), true
		for i := range m.lims {
			r, b := m.inForce(i, now)
			m.lims[i] = bucketLimit{rate: new(big.Rat).SetFrac64(int64(r), m.given[i].periodMicros()), burst: int64(b),
				tokens: rat(int64(b)), last: now}
		}
	}
}

// done ends a call: an absent state it read and did not change stays absent.
func (m *bucketModel) done() {
	if m.virtual {
		m.lims, m.virtual = nil, false
	}
}

// report returns what a call made now could still get (0 while paused) and the time
// until every bucket is full at the rates in force.
func (m *bucketModel) report(now int64) (int, time.Duration) {
	remaining, reset := int64(maxRate), int64(0)
	for i, l := range m.lims {
		tok := m.advance(i, now)
		remaining = min(remaining, ratFloor(tok))
		reset = max(reset, ratCeil(new(big.Rat).Quo(new(big.Rat).Sub(rat(l.burst), tok), l.rate)))
	}
	if m.paused > now {
		remaining = 0
	}
	return int(max(0, remaining)), time.Duration(reset) * time.Microsecond
}

// horizon is how far ahead a booking may take effect: 2^50/rate µs for every limit.
func (m *bucketModel) horizon(now int64) int64 {
	h := int64(protocol.MaxWait)
	for i := range m.given {
		r, _ := m.inForce(i, now)
		h = min(h, maxBucketUS/int64(r))
	}
	return h
}

// fit returns when n permits can take effect: at the latest of now, the pause's end
// and each limit's own time (x/time/rate's, rounded up to the µs), and by how much each
// limit's own time was rounded up (µs). n = 0 takes effect now.
func (m *bucketModel) fit(now int64, n int) (int64, []*big.Rat) {
	t := max(now, m.paused)
	rounding := make([]*big.Rat, len(m.lims))
	for i, l := range m.lims {
		rounding[i] = new(big.Rat)
		if need := new(big.Rat).Sub(rat(int64(n)), m.advance(i, now)); n > 0 && need.Sign() > 0 {
			exact := new(big.Rat).Quo(need, l.rate)
			ti := ratCeil(exact)
			rounding[i].Sub(rat(ti), exact)
			t = max(t, now+ti)
		}
	}
	if n == 0 {
		t = now
	}
	return t, rounding
}

// nextFree is the time until an acquire of one permit would take effect (Inspect).
func (m *bucketModel) nextFree(now int64) int64 {
	t, _ := m.fit(now, 1)
	return t - now
}

// allow is an acquire of n with maxWait (µs), n at most capacity(now): each limit's
// own time is x/time/rate's, rounded up to the µs; the booking goes at the latest of
// them and the pause's end, if that is within maxWait and the horizon. There each
// limit takes n from the bucket as it will be then, capped at its burst: x/time/rate's
// tokens -= n when it goes at the limit's own time; later, it also spends the refill
// the burst would have cut meanwhile. It returns the reply, the wait and the token.
func (m *bucketModel) allow(now int64, n int, maxWait int64) (Result, int64, int64) {
	m.at(now)
	defer m.done()
	t, rounding := m.fit(now, n)
	wait := t - now
	var res Result
	if wait > maxWait || wait > m.horizon(now) {
		res.RetryAfter = time.Duration(wait) * time.Microsecond
		res.Remaining, res.ResetAfter = m.report(now)
		return res, wait, 0
	}
	res.Allowed = true
	token := int64(0)
	if n > 0 {
		for i := range m.lims {
			l := &m.lims[i]
			refill := new(big.Rat).Mul(new(big.Rat).Sub(rat(wait), rounding[i]), l.rate)
			l.tokens = new(big.Rat).Sub(ratMin(m.advance(i, now), new(big.Rat).Sub(rat(l.burst), refill)), rat(int64(n)))
			l.last, l.lastEvent = now, t
		}
		token, m.virtual = t, false
	}
	res.Remaining, res.ResetAfter = m.report(now)
	return res, wait, token
}

// cancel is x/time/rate's CancelAt(now) of n booked at token, per limit: nothing when
// token is past; else the limit gets back n less what was booked after the booking
// (rate × (lastEvent - token), from now once lastEvent is past), never more than n (see
// behindLatest), up to its burst, when that is positive, and the latest booking moves
// back by n/rate when it is this one (not before now). The rate is the one in force at
// the cancel (x/time/rate: the reservation's). It reports whether any limit got tokens
// back, and the reset after.
func (m *bucketModel) cancel(now, token int64, n int) (bool, time.Duration) {
	m.at(now)
	defer m.done()
	freed := false
	if token >= now && token > 0 && n > 0 {
		for i := range m.lims {
			l := &m.lims[i]
			restore := new(big.Rat).Sub(rat(int64(n)), new(big.Rat).Mul(rat(max(l.lastEvent, now, token)-token), l.rate))
			if restore.Sign() <= 0 {
				continue
			}
			freed, m.virtual = true, false
			l.tokens = ratMin(new(big.Rat).Add(m.advance(i, now), restore), rat(l.burst))
			l.last = now
			if prev := token - ratFloor(new(big.Rat).Quo(rat(int64(n)), l.rate)); token == l.lastEvent && prev >= now {
				l.lastEvent = prev
			}
		}
	}
	_, reset := m.report(now)
	return freed, reset
}

// behindLatest reports whether a booking at token lies after a limit's latest booking
// time (a booking made since lies before it, or the latest is past): x/time/rate's
// CancelAt then gives back more than n, which could grant beyond the burst and refill;
// the bucket gives back n at most.
func (m *bucketModel) behindLatest(token int64) bool {
	for _, l := range m.lims {
		if l.lastEvent < token {
			return true
		}
	}
	return false
}

// pause is the pause op: no booking before now + d, or a later pause already set. It
// returns the time until the pause ends.
func (m *bucketModel) pause(now, d int64) int64 {
	m.paused = max(m.paused, now+d)
	return m.paused - now
}

// resume ends the pause.
func (m *bucketModel) resume() { m.paused = 0 }

// override sets the rates and bursts of the first len(rates) limits until now + d (d
// = 0: 2^45µs), clear (rates nil) removes the override: each changes the rates at now
// as SetLimitAt and SetBurstAt do.
func (m *bucketModel) override(now, d int64, rates [][2]int) {
	m.at(now)
	defer m.done()
	if rates == nil {
		m.over = nil
	} else {
		if d == 0 {
			d = maxPeriodUS
		}
		m.over = &bucketOverride{end: now + d, rates: rates}
	}
	for i := range m.lims {
		r, b := m.inForce(i, now)
		if l := m.lims[i]; l.burst != int64(b) || l.rate.Cmp(new(big.Rat).SetFrac64(int64(r), m.given[i].periodMicros())) != 0 {
			m.virtual = false // a change of the limits in force is written
		}
		m.set(i, now, r, b)
	}
}

// detail is Inspect's view: per limit the tokens held, rounded down; the most
// permits any bucket owes; the time until the latest booking.
func (m *bucketModel) detail(now int64) (avail []int, booked int, ahead int64) {
	for i, l := range m.lims {
		a := int(ratFloor(m.advance(i, now)))
		avail = append(avail, a)
		booked = max(booked, -a)
		ahead = max(ahead, l.lastEvent-now)
	}
	return avail, booked, ahead
}

// needed is how long the state is needed from now: until every bucket is full, at the
// rates in force and, from an override's end on, at the callers' with the tokens held at
// the end, and until the latest booking (a change of limits can fill a bucket before it,
// and a cancel still counts from it). (A bucket full at an override's lower burst is not
// full at the callers', and an absent state would be: full at the limits in force when it
// is read.)
func (m *bucketModel) needed(now int64) int64 {
	m.ended(now)
	if m.lims == nil {
		return 0
	}
	var need int64
	for i, l := range m.lims {
		tok := m.advance(i, now)
		full := ratCeil(new(big.Rat).Quo(new(big.Rat).Sub(rat(l.burst), tok), l.rate))
		if o := m.over; o != nil && o.end > now {
			r, b := m.inForce(i, o.end)
			if now+full > o.end || l.burst < int64(b) {
				rate := new(big.Rat).SetFrac64(int64(r), m.given[i].periodMicros())
				tok = ratMin(m.advance(i, o.end), rat(int64(b)))
				full = o.end - now + ratCeil(new(big.Rat).Quo(new(big.Rat).Sub(rat(int64(b)), tok), rate))
			}
		}
		need = max(need, full, l.lastEvent-now)
	}
	return need
}

// tokens returns limit i's tokens at now.
func (m *bucketModel) tokens(now int64, i int) *big.Rat {
	m.at(now)
	defer m.done()
	return m.advance(i, now)
}

// evict forgets the state, as if its key had been deleted: full buckets, and no pause or
// override (the state's meta held them).
func (m *bucketModel) evict() { m.lims, m.paused, m.over = nil, 0, nil }
