package throttle

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The reference model of lua/semaphore.lua, which FuzzSemaphore (semaphore_fuzz_test.go)
// runs every input against.

// semModel is the semaphore script's rules in plain Go (see semaphore.lua's header): the
// lease set, whose members are holders' tokens and the ids of places a slot was handed
// to; the queue's places (arrival order) and their lapse times, kept apart as the script
// keeps them in three keys; each key's expiry where it matters; and the pause.
type semModel struct {
	leases map[string]int64 // member -> expiry, µs
	queue  []semPlace       // :semq, by arrival then member
	lapse  map[string]int64 // :semx, member -> when the place lapses
	qExp   int64            // when :semq expires (its TTL follows :semx's latest lapse)
	paused int64
}

type semPlace struct {
	member string // "<id>:<ttl_us>"
	at     int64  // arrival
}

func newSemModel() *semModel {
	return &semModel{leases: map[string]int64{}, lapse: map[string]int64{}, qExp: 1 << 62}
}

func (m *semModel) place(member string) int {
	return slices.IndexFunc(m.queue, func(p semPlace) bool { return p.member == member })
}

func (m *semModel) unqueue(member string) {
	if i := m.place(member); i >= 0 {
		m.queue = slices.Delete(m.queue, i, i+1)
	}
	delete(m.lapse, member)
}

// semOp is one request: the op (semAcquire, semExtend, semRelease), the caller's token
// and place, the semaphore's max and TTL (µs), and whether a denied acquire joins the
// queue. Its arguments are valid (the script refuses the others with JTARG).
type semOp struct {
	op           int
	token, place string
	max          int
	ttl          int64
	join         bool
}

// call is one script call of a writing op; it returns {ok, wait_us, held}.
func (m *semModel) call(now int64, o semOp) [3]int64 {
	if now >= m.qExp {
		m.queue = nil
	}
	// expired leases and lapsed places go
	for id, e := range m.leases {
		if e <= now {
			delete(m.leases, id)
		}
	}
	for p, e := range m.lapse {
		if e <= now {
			m.unqueue(p)
		}
	}
	paused := m.paused > now
	// the free slots go to the places at the head of the queue, each a lease of its
	// place's TTL under the place's id (one slot per place handed, even to an id that
	// holds a lease already)
	handoff := func() {
		if paused {
			return
		}
		for free := o.max - len(m.leases); free > 0 && len(m.queue) > 0; free-- {
			p := m.queue[0]
			m.unqueue(p.member)
			i := strings.LastIndexByte(p.member, ':')
			httl, _ := strconv.ParseInt(p.member[i+1:], 10, 64)
			m.leases[p.member[:i]] = now + httl
		}
	}
	me := o.place + ":" + strconv.FormatInt(o.ttl, 10)
	reply := func(ok bool, wait int64) [3]int64 {
		r := [3]int64{0, wait, int64(len(m.leases))}
		if ok {
			r[0] = 1
		}
		if len(m.lapse) > 0 { // :semq's TTL follows :semx's latest lapse, in whole ms (at least 1)
			_, q := m.ends()
			m.qExp = now + 1000*max(1, (q-now+999)/1000)
		}
		return r
	}
	handoff() // the queue goes before the caller
	switch o.op {
	case semRelease:
		_, held := m.leases[o.token]
		delete(m.leases, o.token)
		if o.place != "" {
			m.unqueue(me)
			delete(m.leases, o.place)
		}
		handoff()
		return reply(held, 0)
	case semExtend:
		_, held := m.leases[o.token]
		if held {
			m.leases[o.token] = now + o.ttl
		}
		return reply(held, 0)
	}
	_, held := m.leases[o.token]
	_, handed := m.leases[o.place]
	if held || handed || !paused && len(m.leases) < o.max {
		if !held && handed {
			delete(m.leases, o.place) // the slot handed to the place passes to the token
		}
		m.leases[o.token] = now + o.ttl
		m.unqueue(me)
		return reply(true, 0)
	}
	n := len(m.leases)
	place := m.place(me)
	queued := place >= 0
	if !queued {
		place = len(m.queue)
	}
	var wait int64
	if k := min(n-o.max+place, n-1); k >= 0 { // the lease whose expiry frees a slot for this caller
		wait = m.expiries(now)[k]
	}
	if paused {
		wait = max(wait, m.paused-now)
	}
	wait = max(wait, 1)
	if o.join {
		if !queued {
			at := now
			for _, p := range m.queue {
				at = max(at, p.at+1)
			}
			m.queue = append(m.queue, semPlace{member: me, at: at})
			slices.SortFunc(m.queue, func(a, b semPlace) int { return cmp.Or(cmp.Compare(a.at, b.at), strings.Compare(a.member, b.member)) })
		}
		m.lapse[me] = now + o.ttl
	}
	return reply(false, wait)
}

// expiries returns the time from now until each lease expires, earliest first (ties
// by member, as a sorted set orders them).
func (m *semModel) expiries(now int64) []int64 {
	type lease struct {
		id string
		e  int64
	}
	var ls []lease
	for i, e := range m.leases {
		ls = append(ls, lease{i, e})
	}
	slices.SortFunc(ls, func(a, b lease) int { return cmp.Or(cmp.Compare(a.e, b.e), strings.Compare(a.id, b.id)) })
	out := make([]int64, len(ls))
	for i, l := range ls {
		out[i] = l.e - now
	}
	return out
}

// inspect is what Semaphore.Inspect reports (TTL aside): live leases and their
// expiries (the first 100), live places, the pause. It changes nothing.
func (m *semModel) inspect(now int64, max int) SemaphoreState {
	st := SemaphoreState{Max: max, PausedFor: micros(maxOf(0, m.paused-now)), Expiries: []time.Duration{}}
	for _, e := range m.expiries(now) {
		if e > 0 {
			st.Held++
			if len(st.Expiries) < semInspectLimit {
				st.Expiries = append(st.Expiries, micros(e))
			}
		}
	}
	for _, e := range m.lapse {
		if e > now {
			st.Waiting++
		}
	}
	return st
}

func maxOf(a, b int64) int64 { return max(a, b) }

// ends returns when the lease set and the queue are last needed (0: empty).
func (m *semModel) ends() (leases, queue int64) {
	for _, e := range m.leases {
		leases = max(leases, e)
	}
	for _, e := range m.lapse {
		queue = max(queue, e)
	}
	return leases, queue
}
