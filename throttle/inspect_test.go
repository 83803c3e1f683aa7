package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
)

var fakeInspectSemaphore = redistest.FakeClockScript(lua.InspectSemaphore.Source())

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
// the model's grants and the rules inspect_sw.lua, inspect_sc.lua and inspect_fw.lua
// state.
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

// state is what Inspect must report for the token bucket at now (inspect_tb.lua).
func (m *bucketModel) state(now int64) LimiterState {
	m.live(now)
	avail := make([]int, len(m.limits))
	t := max(now, m.paused, m.latest)
	booked := 0
	for i, l := range m.limits {
		e := m.emission(i)
		ahead := new(big.Rat).Sub(m.at(i, now), rat(now))
		avail[i] = int(ratFloor(new(big.Rat).Sub(rat(int64(l.burst())), new(big.Rat).Quo(ahead, e))))
		booked = max(booked, -avail[i])
		need := new(big.Rat).Add(m.at(i, now), new(big.Rat).Mul(rat(int64(1-l.burst())), e))
		t = max(t, ratCeil(need))
	}
	remaining, reset := m.report(now)
	return inspected(TokenBucket, m.limits, remaining, t-now, int64(reset/time.Microsecond), booked, m.latest-now, m.paused-now, avail)
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
		b := tl.b
		ctx := context.Background()
		pause := tl.script(lua.Pause, fakePause)
		var logm *model
		var tbm *bucketModel
		if c.alg == TokenBucket {
			tbm = newBucketModel(c.limits)
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
				r, err := l.call(ctx, opAcquire, n, 0)
				if err != nil {
					t.Fatal(err)
				}
				var want Result
				if tbm != nil {
					want, _, _ = tbm.allow(now, n, 0)
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
				r, err := l.call(ctx, opAcquire, n, maxWait)
				if err != nil {
					t.Fatal(err)
				}
				var token int64
				if tbm != nil {
					_, _, token = tbm.allow(now, n, maxWait)
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
				if _, err := l.call(ctx, opCancel, bk.n, bk.token); err != nil {
					t.Fatal(err)
				}
				if tbm != nil {
					tbm.cancel(now, bk.token, bk.n)
				} else {
					logm.cancel(now, bk.token, bk.n)
				}
			default: // pause
				d := 1 + rng.Int63n(int64(longest/time.Microsecond)/2)
				what = fmt.Sprintf("pause(%dµs)", d)
				if err := pause.Run(ctx, b.Client, l.keys[1:2], d).Err(); err != nil {
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
				if err := b.Client.Del(ctx, l.keys...).Err(); err != nil {
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
			before := dumpKeys(t, b, l.keys)
			st, err := l.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if after := dumpKeys(t, b, l.keys); after != before {
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

// A key of another type, or state jobthrottle did not write, is ErrCorruptState; a
// done context is its error, without a call.
func TestInspectErrors(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range []Algorithm{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow} {
			l, err := New(b.Client, "bad"+alg.String(), PerSecond(10), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Client.HSet(ctx, l.keys[0], "a", "b").Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Inspect(ctx); !errors.Is(err, ErrCorruptState) {
				t.Fatalf("%v on a hash: %v, want ErrCorruptState", alg, err)
			}
			if err := b.Client.Del(ctx, l.keys[0]).Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.Client.Set(ctx, l.keys[1], "x", 0).Err(); err != nil {
				t.Fatal(err)
			}
			if st, err := l.Inspect(ctx); err != nil || st.PausedFor != 0 {
				t.Fatalf("%v with junk in the pause key: %+v, %v, want no pause (as the limiter reads it)", alg, st, err)
			}
			if err := b.Client.Del(ctx, l.keys[1]).Err(); err != nil {
				t.Fatal(err)
			}
			if err := b.Client.HSet(ctx, l.keys[1], "a", "b").Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := l.Inspect(ctx); !errors.Is(err, ErrCorruptState) {
				t.Fatalf("%v with a hash as pause key: %v, want ErrCorruptState", alg, err)
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
		if err := b.Client.Set(ctx, s.keys[0], "x", 0).Err(); err != nil {
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
		if b.Kind == redistest.Cluster {
			steps = 80
		}
		tl := newTimeline(t, b)
		const semMax, ttl = 3, 400 * time.Millisecond
		s, err := NewSemaphore(b.Client, "seminspect", semMax, WithKeyPrefix(b.Prefix), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		tag := "{" + b.Prefix + "seminspect}"
		tl.tags = append(tl.tags, tag)
		tl.at(0)
		pause := lua.Pause.Script()
		if b.Real() {
			s.script, s.view, pause = fakeSemaphore, fakeInspectSemaphore, fakePause
		}
		m := newSemModel()
		ids := []string{}
		for i := 0; i < 8; i++ {
			ids = append(ids, newLeaseID())
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
				r, err := s.run(ctx, sop, id, queue, false)
				if err != nil {
					t.Fatal(err)
				}
				want := m.call(now, sop, id, semMax, ttlUS, queue)
				if r.ok != (want[0] == 1) {
					t.Fatalf("step %d: op %d: ok %v, model %v", i, sop, r.ok, want)
				}
			default:
				d := 1 + rng.Int63n(int64(ttl/time.Microsecond))
				if err := pause.Run(ctx, b.Client, s.keys[3:4], d).Err(); err != nil {
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

// InspectAll answers as Inspect does for each limiter, in one pipeline per client,
// including a limiter whose key is corrupt (its error alone) and, on miniredis after
// SCRIPT FLUSH, scripts the server no longer has.
func TestInspectAll(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		var lims []*Limiter
		for i, alg := range []Algorithm{SlidingWindow, SlidingCounter, TokenBucket, FixedWindow, SlidingWindow} {
			l, err := New(b.Client, fmt.Sprintf("all%d", i), PerMinute(10), WithAlgorithm(alg), WithKeyPrefix(b.Prefix),
				WithLimits(PerHour(100)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.AllowN(ctx, i+1); err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		if err := b.Client.Del(ctx, lims[4].keys[0]).Err(); err != nil {
			t.Fatal(err)
		}
		if err := b.Client.HSet(ctx, lims[4].keys[0], "a", "b").Err(); err != nil {
			t.Fatal(err)
		}
		check := func(what string) {
			t.Helper()
			states, errs := InspectAll(ctx, lims)
			for i, l := range lims {
				want, werr := l.Inspect(ctx)
				if (errs[i] == nil) != (werr == nil) || !errors.Is(errs[i], ErrCorruptState) && errs[i] != nil {
					t.Fatalf("%s: limiter %d: error %v, Inspect's %v", what, i, errs[i], werr)
				}
				if d := states[i].ResetAfter - want.ResetAfter; d < 0 || d > time.Second { // Inspect runs later
					t.Fatalf("%s: limiter %d: ResetAfter %v, then Inspect's %v", what, i, states[i].ResetAfter, want.ResetAfter)
				}
				// real time passes between the two
				states[i].TTL, want.TTL, states[i].ResetAfter, want.ResetAfter = 0, 0, 0, 0
				if fmt.Sprint(states[i]) != fmt.Sprint(want) {
					t.Fatalf("%s: limiter %d: %+v, Inspect says %+v", what, i, states[i], want)
				}
			}
			if errs[4] == nil {
				t.Fatalf("%s: the corrupt key inspected without error", what)
			}
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
