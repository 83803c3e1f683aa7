package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// inspected is what a reference model says Inspect must report (TTL aside: real
// servers under a test clock stretch TTLs, see redistest.FakeTTL).
func inspected(alg Algorithm, limits []Limit, remaining int, next, reset int64, booked int, ahead, paused int64, avail []int) LimiterState {
	st := LimiterState{
		Algorithm: alg, Remaining: remaining, NextFree: micros(next), ResetAfter: micros(reset),
		Booked: booked, BookedAhead: micros(max(0, ahead)), PausedFor: micros(max(0, paused)),
	}
	for i, l := range limits {
		c := l.Rate
		if alg == TokenBucket {
			c = l.burst()
		}
		st.Limits = append(st.Limits, LimitState{Limit: l, Capacity: c, Used: c - avail[i]})
	}
	return st
}

// state is what Inspect must report for the log and window algorithms at now, from
// the model's grants and the rules of lua/log.lua's and lua/window.lua's detail.
func (m *model) state(now int64) LimiterState {
	avail := make([]int, len(m.limits))
	booked := 0
	var ahead int64
	for i, l := range m.limits {
		p := l.periodMicros()
		switch m.alg {
		case FixedWindow:
			w, lw := floorDiv(now, p), floorDiv(m.latest, p)
			switch {
			case len(m.grants) > 0 && lw > w: // bookings in a later window close this one
				avail[i] = 0
				if m.latest > now {
					booked = max(booked, m.windowCount(i, lw))
				}
			default:
				avail[i] = l.Rate - m.windowCount(i, w)
			}
		default:
			avail[i] = l.Rate
			for _, g := range m.grants {
				if g.rec > now-p {
					avail[i] -= g.n
				}
			}
		}
	}
	switch m.alg {
	case FixedWindow:
		ahead = m.latest - now
	default:
		for _, g := range m.grants {
			start := g.at // SlidingCounter: when its sub-bucket starts
			if m.alg == SlidingCounter {
				start = g.rec - m.bucket
			}
			if start > now {
				booked += g.n
				ahead = start - now
			}
		}
	}
	return inspected(m.alg, m.limits, m.remaining(now), m.earliest(now, 1)-now, int64(m.reset(now)/time.Microsecond),
		booked, ahead, m.paused-now, avail)
}

// inspBucket is a reference for the token bucket: golang.org/x/time/rate's rules
// (advance, reserveN, CancelAt) as lua/bucket.lua's header states them, in exact
// integers: a limit's tokens are counted in ticks, p ticks a token and r ticks a µs, so
// nothing rounds but a booking's time, up to the µs. A pause only delays bookings.
type inspBucket struct {
	limits []Limit
	u, e   []int64 // per limit: the tokens at last (ticks), the latest booking (µs)
	last   int64   // µs
	paused int64   // when a pause ends, µs (0: none)
}

func newInspBucket(limits []Limit) *inspBucket {
	m := &inspBucket{limits: limits, u: make([]int64, len(limits)), e: make([]int64, len(limits))}
	for i, l := range limits {
		m.u[i] = int64(l.burst()) * l.periodMicros() // a full bucket
	}
	return m
}

// rpb are limit i's r, p and b·p: ticks per µs, ticks per token, the full bucket.
func (m *inspBucket) rpb(i int) (r, p, full int64) {
	l := m.limits[i]
	return int64(l.Rate), l.periodMicros(), int64(l.burst()) * l.periodMicros()
}

// advance counts the tokens at now (x/time/rate's advance).
func (m *inspBucket) advance(now int64) {
	for i := range m.limits {
		r, _, full := m.rpb(i)
		m.u[i] = min(full, m.u[i]+(now-m.last)*r)
	}
	m.last = now
}

// fit is the earliest time at or after t0 when every bucket holds n (each limit's own
// time rounded up to the µs).
func (m *inspBucket) fit(now, t0 int64, n int) int64 {
	t := t0
	for i := range m.limits {
		r, p, _ := m.rpb(i)
		if d := int64(n)*p - m.u[i]; d > 0 {
			t = max(t, now+(d+r-1)/r)
		}
	}
	return t
}

// allow is an acquire of n with maxWait (µs) at now: booked at the time fit finds if it
// comes within maxWait (and within 2^50/r µs); it returns the reply and the token.
func (m *inspBucket) allow(now int64, n int, maxWait int64) (Result, int64) {
	m.advance(now)
	t := now
	if n > 0 {
		t = m.fit(now, max(now, m.paused), n)
	}
	horizon := int64(protocol.MaxWait)
	for i := range m.limits {
		r, _, _ := m.rpb(i)
		horizon = min(horizon, (1<<50)/r)
	}
	var res Result
	var token int64
	if t-now <= maxWait && t-now <= horizon {
		res.Allowed = true
		if n > 0 {
			for i := range m.limits {
				r, p, full := m.rpb(i)
				d, s := int64(n)*p-m.u[i], int64(0)
				if d > 0 {
					s = (d+r-1)/r*r - d // the rounding of the limit's own time up to the µs
				}
				// the tokens at t, less n, counted back to now: a booking that a pause or
				// another limit put later spends the refill the burst would have cut
				m.u[i] = min(m.u[i], full-(t-now)*r+s) - int64(n)*p
				m.e[i] = t
			}
			token = t
		}
	} else {
		res.RetryAfter = micros(t - now)
	}
	res.Remaining, res.ResetAfter = m.report(now)
	return res, token
}

// cancel gives back n booked at token (CancelAt at now): each limit gets n less what was
// booked after it, up to its burst; the latest booking moves back before it.
func (m *inspBucket) cancel(now, token int64, n int) bool {
	m.advance(now)
	if token < now || n == 0 {
		return false
	}
	freed := false
	for i := range m.limits {
		r, p, full := m.rpb(i)
		np := int64(n) * p
		if restore := min(np, np-(m.e[i]-token)*r); restore > 0 {
			m.u[i], freed = min(full, m.u[i]+restore), true
			if token == m.e[i] && token-floorDiv(np, r) >= now {
				m.e[i] = token - floorDiv(np, r)
			}
		}
	}
	return freed
}

func (m *inspBucket) pause(now, d int64) {
	m.paused = max(m.paused, now+d)
}

// report returns what a call made now could still get and the time until every bucket
// is full.
func (m *inspBucket) report(now int64) (int, time.Duration) {
	remaining, reset := int64(maxRate), int64(0)
	for i := range m.limits {
		r, p, full := m.rpb(i)
		remaining = min(remaining, floorDiv(m.u[i], p))
		reset = max(reset, (full-m.u[i]+r-1)/r)
	}
	if m.paused > now {
		remaining = 0
	}
	return int(max(0, remaining)), micros(reset)
}

// state is what Inspect must report at now: per limit its whole tokens (negative when
// it owes), the most any bucket owes as Booked, until the latest booking as BookedAhead.
func (m *inspBucket) state(now int64) LimiterState {
	m.advance(now)
	avail := make([]int, len(m.limits))
	booked, ahead := 0, int64(0)
	for i := range m.limits {
		_, p, _ := m.rpb(i)
		avail[i] = int(floorDiv(m.u[i], p))
		booked = max(booked, -avail[i])
		ahead = max(ahead, m.e[i]-now)
	}
	remaining, reset := m.report(now)
	next := m.fit(now, max(now, m.paused), 1) - now
	return inspected(TokenBucket, m.limits, remaining, next, int64(reset/time.Microsecond), booked, ahead, m.paused-now, avail)
}

// Inspect reports what the reference models say on random timelines of grants,
// bookings ahead, cancels and pauses, for every algorithm, with one to three limits.
func TestInspectMatchesReferenceModel(t *testing.T) {
	cases := []modelCase{
		{SlidingWindow, []Limit{PerSecond(5)}},
		{SlidingWindow, []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 10, Period: time.Second}}},
		{SlidingCounter, []Limit{PerSecond(5)}},
		{SlidingCounter, []Limit{{Rate: 4, Period: 250 * ms}, {Rate: 9, Period: time.Second}, {Rate: 20, Period: 3 * time.Second}}},
		{FixedWindow, []Limit{PerSecond(5)}},
		{FixedWindow, []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 8, Period: time.Second}}},
		{TokenBucket, []Limit{{Rate: 5, Period: time.Second, Burst: 3}}},
		{TokenBucket, []Limit{{Rate: 3, Period: 200 * ms, Burst: 2}, {Rate: 7, Period: time.Second, Burst: 5}}},
	}
	eachModelCase(t, cases, "inspect", 1000, 150, 60, func(t *testing.T, tl *timeline, l *Limiter, c modelCase, rng *rand.Rand, steps int) {
		ctx := context.Background()
		var logm *model
		var tbm *inspBucket
		if c.alg == TokenBucket {
			tbm = newInspBucket(c.limits)
		} else {
			logm = newModel(c.alg, c.limits, 4)
		}
		longest := time.Duration(maxPeriodOf(c.limits)) * time.Microsecond
		type held struct {
			n     int
			token int64
		}
		var bookings []held
		var at time.Duration
		for i := 0; i < steps; i++ {
			at += time.Duration(rng.Int63n(int64(longest / 4)))
			tl.at(at)
			now := tl.now.UnixMicro()
			what := ""
			switch op := rng.Intn(10); {
			case op < 4: // AllowN
				n := rng.Intn(l.maxN + 1)
				what = fmt.Sprintf("AllowN(%d)", n)
				r, err := l.acquire(ctx, n, 0, nil, 0, false)
				if err != nil {
					t.Fatal(err)
				}
				var want Result
				if tbm != nil {
					want, _ = tbm.allow(now, n, 0)
				} else {
					want, _ = logm.allow(now, n, 0)
				}
				if got := r.result(); got != want {
					t.Fatalf("%v %v step %d %s: got %+v, model %+v", c.alg, c.limits, i, what, got, want)
				}
			case op < 8: // book ahead
				n := 1 + rng.Intn(l.maxN)
				maxWait := rng.Int63n(2 * int64(longest/time.Microsecond))
				what = fmt.Sprintf("Reserve(%d, %dµs)", n, maxWait)
				r, err := l.acquire(ctx, n, micros(maxWait), nil, 0, false)
				if err != nil {
					t.Fatal(err)
				}
				var token int64
				if tbm != nil {
					_, token = tbm.allow(now, n, maxWait)
				} else {
					_, token = logm.allow(now, n, maxWait)
				}
				if r.token != token {
					t.Fatalf("%v %v step %d %s: token %d, model %d", c.alg, c.limits, i, what, r.token, token)
				}
				if r.granted && r.wait > 0 {
					bookings = append(bookings, held{n, token})
				}
			case op < 9 && len(bookings) > 0: // cancel a booking
				k := rng.Intn(len(bookings))
				bk := bookings[k]
				bookings = append(bookings[:k], bookings[k+1:]...)
				what = fmt.Sprintf("cancel(%d at %d)", bk.n, bk.token)
				rep, err := l.client().do(&request{ctx: ctx, t: l.t, ks: l.client().key(l.t.tag), call: l.request(protocol.OpCancel, bk.n, bk.token), timeout: l.timeout})
				if err != nil {
					t.Fatal(err)
				}
				var freed bool
				if tbm != nil {
					freed = tbm.cancel(now, bk.token, bk.n)
				} else {
					freed = logm.cancel(now, bk.token, bk.n)
				}
				if got := rep.v[0] == 1; got != freed {
					t.Fatalf("%v %v step %d %s: freed %v, model %v", c.alg, c.limits, i, what, got, freed)
				}
			default: // pause
				d := 1 + rng.Int63n(int64(longest/time.Microsecond)/2)
				what = fmt.Sprintf("pause(%dµs)", d)
				if err := l.Pause(ctx, micros(d)); err != nil {
					t.Fatal(err)
				}
				if tbm != nil {
					tbm.pause(now, d)
				} else {
					logm.pause(now, d)
				}
			}
			// inspect now and a moment later (bookings due, windows moving)
			for _, later := range []time.Duration{0, time.Duration(rng.Int63n(int64(longest / 2)))} {
				at += later
				tl.at(at)
				now := tl.now.UnixMicro()
				var want LimiterState
				if tbm != nil {
					want = tbm.state(now)
				} else {
					want = logm.state(now)
				}
				wantInspected(t, l, want, "%v %v step %d after %s, inspected at t0+%v", c.alg, c.limits, i, what, at)
			}
		}
	})
}

// The state key's TTL is reported as Redis keeps it (real time, production scripts):
// after a grant of a 10-per-second sliding window it is at most a second, and 0
// once the key is gone.
func TestInspectTTL(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range []Algorithm{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow} {
			l, err := New(b.Client, "ttl"+alg.String(), PerSecond(10), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			st, err := l.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if st.TTL != 0 || st.Limits[0].Used != 0 || st.Remaining != 10 {
				t.Fatalf("%v before any grant: %+v, want TTL 0, Used 0, Remaining 10", alg, st)
			}
			// A fixed window's state ends with its window (whole seconds of the server's
			// clock): when a boundary passes between the grant and Inspect (a starved
			// machine ran them far apart: TTL 0 was seen), both are made again in the
			// next window, the server's TIME around them telling.
			for try := 0; ; try++ {
				before, err := b.Client.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				if _, err := l.AllowN(ctx, 3); err != nil {
					t.Fatal(err)
				}
				if st, err = l.Inspect(ctx); err != nil {
					t.Fatal(err)
				}
				after, err := b.Client.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				if alg != FixedWindow || before.Truncate(time.Second).Equal(after.Truncate(time.Second)) || try == 5 {
					break
				}
				if err := b.Client.Del(ctx, l.t.keys...).Err(); err != nil {
					t.Fatal(err)
				}
			}
			// the scripts round TTLs up to whole ms: a period of 1s gives at most 1s
			// (the sliding counter's last bucket ends up to 20ms later)
			if st.TTL <= 0 || st.TTL > time.Second+20*time.Millisecond {
				t.Fatalf("%v: TTL %v after a grant, want in (0, 1.02s]", alg, st.TTL)
			}
			if got, want := st.Limits[0].Used, 3; got != want && alg != TokenBucket {
				t.Fatalf("%v: Used %d, want %d", alg, got, want)
			}
		}
	})
}

// Inspect writes nothing: the keys and their values (DUMP) are the same before and
// after, with bookings ahead and a pause in place.
func TestInspectWritesNothing(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range []Algorithm{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow} {
			// per hour: a fixed window's boundary does not pass between the calls
			l, err := New(b.Client, "ro"+alg.String(), PerHour(10), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 3; i++ {
				if _, err := l.Reserve(ctx, 5, 2*time.Hour); err != nil {
					t.Fatal(err)
				}
			}
			if err := l.Pause(ctx, time.Minute); err != nil {
				t.Fatal(err)
			}
			before := dumpKeys(t, b, l.t.keys)
			st, err := l.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if after := dumpKeys(t, b, l.t.keys); after != before {
				t.Fatalf("%v: Inspect changed the keys:\nbefore %s\nafter  %s", alg, before, after)
			}
			if st.PausedFor <= 59*time.Second || st.Booked == 0 || st.BookedAhead == 0 || st.Remaining != 0 {
				t.Fatalf("%v: %+v, want paused about a minute, bookings ahead, nothing remaining", alg, st)
			}
		}
	})
}

func dumpKeys(t *testing.T, b *redistest.Backend, keys []string) string {
	t.Helper()
	s := ""
	for _, k := range keys {
		ctx := context.Background()
		typ, err := b.Client.Type(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		var v any
		switch typ {
		case "string":
			v, err = b.Client.Get(ctx, k).Result()
		case "list":
			v, err = b.Client.LRange(ctx, k, 0, -1).Result()
		}
		if err != nil {
			t.Fatal(err)
		}
		ttl, err := b.Client.PExpireTime(ctx, k).Result() // absolute: it does not move with real time
		if err != nil {
			t.Fatal(err)
		}
		s += fmt.Sprintf("%s=%s:%q(%v) ", k, typ, v, ttl)
	}
	return s
}

// A state key of another type, or of the algorithm's type holding numbers or a meta
// jobthrottle did not write, is ErrCorruptState; a done context is its error, without a
// call.
func TestInspectErrors(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			l, err := New(b.Client, "bad"+alg.String(), PerSecond(10), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			state, head := l.stateKey(), l.t.head
			junk := map[string]func() error{
				"a hash": func() error { return b.Client.HSet(ctx, state, "a", "b").Err() },
			}
			if alg == SlidingWindow || alg == SlidingCounter {
				junk["a meta not ours"] = func() error { return b.Client.RPush(ctx, state, "x", "0").Err() }
				junk["numbers not ours"] = func() error { return b.Client.RPush(ctx, state, head, "0", "x", "1").Err() }
			} else {
				junk["a meta not ours"] = func() error { return b.Client.Set(ctx, state, "0 0\nx", 0).Err() }
				junk["numbers not ours"] = func() error { return b.Client.Set(ctx, state, "x\n"+head, 0).Err() }
			}
			for what, plant := range junk {
				if err := plant(); err != nil {
					t.Fatal(err)
				}
				if _, err := l.Inspect(ctx); !errors.Is(err, ErrCorruptState) {
					t.Fatalf("%v on %s: %v, want ErrCorruptState", alg, what, err)
				}
				if err := b.Client.Del(ctx, state).Err(); err != nil {
					t.Fatal(err)
				}
			}
			done, cancel := context.WithCancel(ctx)
			cancel()
			if _, err := l.Inspect(done); !errors.Is(err, context.Canceled) {
				t.Fatalf("%v: done context: %v", alg, err)
			}
		}
		s, err := NewSemaphore(b.Client, "badsem", 3, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Client.Set(ctx, s.t.keys[0], "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Inspect(ctx); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("semaphore on a string: %v, want ErrCorruptState", err)
		}
	})
}

// Semaphore.Inspect reports what the semaphore model holds on random timelines of
// acquires (queueing or not), extends, releases and pauses.
func TestSemaphoreInspectMatchesModel(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		steps := 200
		if b.Kind != redistest.Standalone { // as eachModelCase
			steps = 80
		}
		tl := newTimeline(t, b)
		const semMax, ttl = 3, 400 * time.Millisecond
		s := tl.semaphore("seminspect", semMax, WithLeaseTTL(ttl))
		pauser := tl.limiter("seminspect", PerSecond(1)) // a pause is the key's, for limiters and semaphores alike
		m := newSemModel()
		ids := []string{}
		for i := 0; i < 8; i++ {
			ids = append(ids, newToken())
		}
		rng := rand.New(rand.NewSource(3))
		var at time.Duration
		ttlUS := ceilMicros(ttl)
		for i := 0; i < steps; i++ {
			at += time.Duration(rng.Int63n(int64(ttl / 3)))
			tl.at(at)
			now := tl.now.UnixMicro()
			id := ids[rng.Intn(len(ids))]
			switch op := rng.Intn(10); {
			case op < 9:
				sop := []int{semAcquire, semAcquire, semExtend, semRelease}[op%4]
				queue := sop == semAcquire && rng.Intn(2) == 0
				r, err := s.call(ctx, sop, id, id, queue, false)
				if err != nil {
					t.Fatal(err)
				}
				want := m.call(now, semOp{op: sop, token: id, place: id, max: semMax, ttl: ttlUS, join: queue})
				if r.ok != (want[0] == 1) {
					t.Fatalf("step %d: op %d: ok %v, model %v", i, sop, r.ok, want)
				}
			default:
				d := 1 + rng.Int63n(int64(ttl/time.Microsecond))
				if err := pauser.Pause(ctx, micros(d)); err != nil {
					t.Fatal(err)
				}
				m.paused = max(m.paused, now+d)
			}
			at += time.Duration(rng.Int63n(int64(ttl / 2)))
			tl.at(at)
			now = tl.now.UnixMicro()
			got, err := s.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			want := SemaphoreState{Max: semMax, PausedFor: micros(max(0, m.paused-now)), Expiries: []time.Duration{}}
			var exps []int64
			for _, e := range m.leases {
				if e > now {
					exps = append(exps, e-now)
				}
			}
			slices.Sort(exps)
			for _, e := range exps {
				want.Expiries = append(want.Expiries, micros(e))
			}
			want.Held = len(exps)
			for _, e := range m.lapse {
				if e > now {
					want.Waiting++
				}
			}
			got.TTL = 0
			if fmt.Sprint(got) != fmt.Sprint(want) {
				t.Fatalf("step %d at t0+%v:\n got %+v\nwant %+v", i, at, got, want)
			}
		}
	})
}

// Inspects made at once share round trips (every call does: see send.go) and each gets
// what it would get alone: many goroutines inspecting limiters of every algorithm, a
// semaphore and a key of foreign data, at a time that stands still, get the states (and
// the error) Inspect gave them one by one, in fewer round trips than calls; on
// miniredis after SCRIPT FLUSH too (EVAL for the scripts the server lost).
func TestConcurrentInspectsShareRoundTrips(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		var lims []*Limiter
		for i, alg := range []Algorithm{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow, SlidingWindow, TokenBucket} {
			l := tl.limiter(fmt.Sprintf("all%d", i), PerMinute(10), WithAlgorithm(alg), WithLimits(PerHour(100)))
			if _, err := l.AllowN(ctx, i+1); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Reserve(ctx, 10, time.Hour); err != nil { // booked ahead
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		if err := lims[5].Pause(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		corrupt := lims[4]
		if err := b.Client.Del(ctx, corrupt.stateKey()).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.Client.HSet(ctx, corrupt.stateKey(), "a", "b").Err(); err != nil {
			t.Fatal(err)
		}
		sem := tl.semaphore("all-sem", 3)
		mustTry(t, sem)
		tl.at(time.Second) // the clock stands here from now on
		type answer struct {
			st  string
			err error
		}
		alone := make([]answer, len(lims)+1)
		inspect := func(i int) answer { // TTL aside: real servers count it on the real clock
			if i == len(lims) {
				st, err := sem.Inspect(ctx)
				st.TTL = 0
				return answer{fmt.Sprint(st), err}
			}
			st, err := lims[i].Inspect(ctx)
			st.TTL = 0
			return answer{fmt.Sprint(st), err}
		}
		for i := range alone {
			alone[i] = inspect(i)
		}
		if !errors.Is(alone[4].err, ErrCorruptState) {
			t.Fatalf("the foreign key: %v, want ErrCorruptState", alone[4].err)
		}
		check := func(what string) {
			t.Helper()
			rt := &roundTrips{}
			rdb := b.Client
			rdb.AddHook(rt)
			defer rt.stop()
			const rounds = 8
			calls := rounds * len(alone)
			// the first round trips wait until every call is under way: the others queue
			// behind them, whatever the scheduler does
			var returned atomic.Int64
			rt.hold(func() bool {
				c := lims[0].client()
				c.mu.Lock()
				defer c.mu.Unlock()
				return int64(c.calls)+returned.Load() >= int64(calls) // every call queued, in flight or answered
			})
			got := make([]answer, calls)
			var wg sync.WaitGroup
			for k := range got {
				wg.Add(1)
				go func() {
					defer wg.Done()
					got[k] = inspect(k % len(alone))
					returned.Add(1)
				}()
			}
			wg.Wait()
			for k, a := range got {
				w := alone[k%len(alone)]
				if a.st != w.st || fmt.Sprint(a.err) != fmt.Sprint(w.err) {
					t.Fatalf("%s: call %d: %s %v; alone %s %v", what, k, a.st, a.err, w.st, w.err)
				}
			}
			if n := rt.n.Load(); n >= int64(calls) {
				t.Fatalf("%s: %d calls made %d round trips, want them shared", what, calls, n)
			}
			t.Logf("%s: %d Inspects at once in %d round trips, each as alone", what, calls, rt.n.Load())
		}
		check("loaded")
		if b.Kind == redistest.Mini {
			if err := b.Client.ScriptFlush(ctx).Err(); err != nil {
				t.Fatal(err)
			}
			check("after SCRIPT FLUSH")
		}
	})
}

// roundTrips is a go-redis hook that counts pipelines (every round trip of the
// package's client is one) and can hold them until a condition holds (or signalWait
// passes); stop lets everything through.
type roundTrips struct {
	n     atomic.Int64
	mu    sync.Mutex
	until func() bool
	off   atomic.Bool
}

func (r *roundTrips) hold(until func() bool) {
	r.mu.Lock()
	r.until = until
	r.mu.Unlock()
}

func (r *roundTrips) stop() { r.off.Store(true) }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if r.off.Load() {
			return next(ctx, cmds)
		}
		scripts := false
		for _, c := range cmds {
			scripts = scripts || c.Name() == "evalsha" || c.Name() == "eval"
		}
		if !scripts { // a connection's handshake, say
			return next(ctx, cmds)
		}
		r.n.Add(1)
		r.mu.Lock()
		until := r.until
		r.mu.Unlock()
		for deadline := time.Now().Add(signalWait); until != nil && !until() && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		return next(ctx, cmds)
	}
}

// A tenant's handle's Inspect gives the weight its requests are queued with: an
// operator's while one lasts (OverrideWeight), not the handle's own.
func TestInspectTenantWeightInForce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("weighed", PerSecond(20))
		acme := l.Tenant("acme")
		if _, err := acme.acquire(ctx, 1, time.Hour, nil, 0, true); err != nil {
			t.Fatal(err)
		}
		if err := acme.OverrideWeight(ctx, time.Minute, 5); err != nil {
			t.Fatal(err)
		}
		st, err := acme.Inspect(ctx)
		if err != nil || st.Tenant == nil || st.Tenant.Weight != 5 {
			t.Fatalf("Inspect under an operator's weight 5: %+v, %v; want weight 5", st.Tenant, err)
		}
		tl.at(2 * time.Minute)
		if st, err = acme.Inspect(ctx); err != nil || st.Tenant.Weight != 1 {
			t.Fatalf("Inspect once the operator's weight ended: %+v, %v; want the handle's 1", st.Tenant, err)
		}
	})
}
