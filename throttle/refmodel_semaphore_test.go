package throttle

import (
	"cmp"
	"slices"
	"strconv"
	"strings"
)

// The reference model of lua/semaphore.lua, which FuzzSemaphore (fuzz_semaphore_test.go)
// runs every input against.

// semModel is the semaphore script's rules in plain Go (see semaphore.lua's header):
// the lease set, the queue's places (arrival order) and their lapse times, kept apart
// as the script keeps them in three keys, and each key's expiry where it matters.
type semModel struct {
	leases map[string]int64 // id -> expiry, µs
	queue  []semPlace       // :semq, by arrival then member
	lapse  map[string]int64 // :semx, member -> when the place lapses
	qExp   int64            // when :semq expires (its TTL follows :semx's latest lapse)
	paused int64
}

type semPlace struct {
	member string // "id:ttl_us"
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

// call is one script call; it returns {ok, wait_us, held}.
func (m *semModel) call(now int64, op int, id string, limit int, ttl int64, queue bool) [3]int64 {
	if now >= m.qExp {
		m.queue = nil
	}
	for i, e := range m.leases {
		if e <= now {
			delete(m.leases, i)
		}
	}
	for p, e := range m.lapse {
		if e <= now {
			m.unqueue(p)
		}
	}
	paused := m.paused > now
	handoff := func() {
		for !paused && len(m.leases) < limit && len(m.queue) > 0 {
			p := m.queue[0]
			m.unqueue(p.member)
			hid, hs, _ := strings.Cut(p.member, ":")
			httl, _ := strconv.ParseInt(hs, 10, 64)
			m.leases[hid] = now + httl
		}
	}
	me := id + ":" + strconv.FormatInt(ttl, 10)
	reply := func(ok bool, wait int64) [3]int64 {
		r := [3]int64{0, wait, int64(len(m.leases))}
		if ok {
			r[0] = 1
		}
		if len(m.lapse) > 0 { // the script's finish: :semq's TTL follows :semx's,
			_, q := m.ends() // in whole ms (at least 1) from now, as jt_expire sets it
			m.qExp = now + 1000*max(1, (q-now+999)/1000)
		}
		return r
	}
	handoff()
	_, held := m.leases[id]
	switch op {
	case semRelease:
		delete(m.leases, id)
		m.unqueue(me)
		handoff()
		return reply(held, 0)
	case semExtend:
		if held {
			m.leases[id] = now + ttl
		}
		return reply(held, 0)
	}
	if held {
		m.leases[id] = now + ttl
		m.unqueue(me)
		return reply(true, 0)
	}
	n := len(m.leases)
	if !paused && n < limit {
		m.leases[id] = now + ttl
		return reply(true, 0)
	}
	place := m.place(me)
	queued := place >= 0
	if !queued {
		place = len(m.queue)
	}
	var wait int64
	if k := min(n-limit+place, n-1); k >= 0 {
		type lease struct {
			id string
			e  int64
		}
		var ls []lease
		for i, e := range m.leases {
			ls = append(ls, lease{i, e})
		}
		slices.SortFunc(ls, func(a, b lease) int { return cmp.Or(cmp.Compare(a.e, b.e), strings.Compare(a.id, b.id)) })
		wait = ls[k].e - now
	}
	if paused {
		wait = max(wait, m.paused-now)
	}
	wait = max(wait, 1)
	if queue {
		if !queued {
			at := now
			for _, p := range m.queue {
				at = max(at, p.at+1)
			}
			m.queue = append(m.queue, semPlace{member: me, at: at})
			slices.SortFunc(m.queue, func(a, b semPlace) int { return cmp.Or(cmp.Compare(a.at, b.at), strings.Compare(a.member, b.member)) })
		}
		m.lapse[me] = now + ttl
	}
	return reply(false, wait)
}

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
