package lua

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"golang.org/x/time/rate"
)

// The token bucket's replies: remaining and reset, the pause delaying a booking that then
// spends the refill its burst would have cut, Inspect.
func TestTokenBucketOps(t *testing.T) {
	c := call{a: tokenBucket, limits: []limit{{10, sec, 4}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "tb", []step{
			w(0, inspect(), "full", 1, 4, 0, 0, nil, nil, 0, []int64{0, 0, 0, -2, 0, 0, 10, 4, 4}),
			w(0, acquire(3, 0), "", 1, 1, 0, 300*ms, tok(0), 0, 0),
			w(0, acquire(3, 0), "two short", 0, 1, 200*ms, 300*ms, 0, 0, group),
			w(0, acquire(3, sec), "", 1, 0, 200*ms, 600*ms, tok(200*ms), 0, 0),
			w(100*ms, inspect(), "owes 1", 1, 0, 200*ms, 500*ms, nil, nil, 0, []int64{1, 100 * ms, 0, 500, 0, 0, 10, 4, -1}),
			w(100*ms, cancel(3, tok(200*ms)), "the latest", 1, 0, 0, 200*ms, 0, 0, 0),
			w(100*ms, pause(900*ms), "", 1, 0, 900*ms, 0, 0, 0, 0),
			w(100*ms, acquire(4, 2*sec), "at the pause's end", 1, 0, 900*ms, sec+400*ms-100*ms, tok(sec), 0, protocol.FlagPaused),
		})
	})
}

// bucketRef drives one token bucket key and a golang.org/x/time/rate Limiter side by side:
// the callers' limit is {rate, period, burst}; an override stands in for SetLimitAt and
// SetBurstAt (a clear when the limits come back to the callers').
type bucketRef struct {
	t        testing.TB
	b        *redistest.Backend
	c        call
	tag      string
	clock    *clock
	lim      *rate.Limiter
	r, burst int64 // the limits in force
}

// newBucketRef starts both at Epoch with the callers' limit {r, period, callers} and the
// burst burst in force (an override at Epoch when it is not the callers').
func newBucketRef(t testing.TB, b *redistest.Backend, name string, r, period, callers, burst int64) *bucketRef {
	tag := tagOf(b, name)
	f := &bucketRef{t: t, b: b, tag: tag, clock: newClock(t, b, tag),
		c:   call{a: tokenBucket, limits: []limit{{r, period, callers}}},
		lim: rate.NewLimiter(perSecond(r, period), int(burst)), r: r, burst: callers}
	if burst != callers {
		f.set(r, burst)
	}
	return f
}

func perSecond(r, period int64) rate.Limit { return rate.Limit(float64(r) * 1e6 / float64(period)) }

// at moves both clocks to Epoch + us.
func (f *bucketRef) at(us int64) time.Time {
	f.clock.set(f.t, redistest.Epoch.Add(time.Duration(us)*time.Microsecond))
	return f.clock.now
}

// reserve books n with max wait maxWait (µs) on both, and returns the script's reply and
// x/time/rate's reservation (nil when it denies): reserveN's decision, taken through the
// exported API (TokensAt tells the wait; ReserveN books it), with a nanosecond for its
// float rounding.
func (f *bucketRef) reserve(n, maxWait int64) (res, *rate.Reservation, time.Duration) {
	now := f.clock.now
	got := f.c.one(f.t, f.b, f.tag, acquire(int(n), maxWait))
	wait := time.Duration(0)
	if short := float64(n) - f.lim.TokensAt(now); short > 0 {
		wait = time.Duration(short / float64(f.lim.Limit()) * float64(time.Second))
	}
	if wait > time.Duration(maxWait)*time.Microsecond+time.Nanosecond {
		return got, nil, wait
	}
	r := f.lim.ReserveN(now, int(n))
	return got, r, r.DelayFrom(now)
}

// set changes the limits in force at now on both.
func (f *bucketRef) set(r, burst int64) {
	now := f.clock.now
	f.lim.SetLimitAt(now, perSecond(r, f.c.limits[0].period))
	f.lim.SetBurstAt(now, int(burst))
	f.r, f.burst = r, burst
	op := clearOver()
	if r != f.c.limits[0].rate || burst != f.c.limits[0].burst {
		op = override(0, int(r), int(burst))
	}
	if got := f.c.one(f.t, f.b, f.tag, op); got.v[0] != 1 {
		f.t.Fatalf("set %d, %d: %v", r, burst, got)
	}
}

// cancel gives back n booked at token on the script, and cancels r on x/time/rate.
func (f *bucketRef) cancel(n, token int64, r *rate.Reservation) res {
	r.CancelAt(f.clock.now)
	return f.c.one(f.t, f.b, f.tag, cancel(int(n), token))
}

// The bucket decides as x/time/rate does, decision for decision: random timelines of
// acquires with max waits, cancels of their bookings, and changes of rate and burst, one
// limit, µs times.
//   - exact: rates that divide 20 per period, a period and every step a multiple of 20 µs.
//     Every time and token count is then a whole µs and tick on both sides, so every
//     decision and wait must be equal (x/time/rate's float time within a nanosecond).
//   - any: any rate, period and step, no cancels. The script's wait is x/time/rate's rounded
//     up to the µs (its documented rounding), its decisions the same.
func TestBucketMatchesXTimeRate(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		timelines := 12
		if b.Kind == redistest.Mini {
			timelines = 24
		}
		for seed := range timelines {
			exact := seed%2 == 0
			t.Run(fmt.Sprintf("seed%d/exact=%v", seed, exact), func(t *testing.T) {
				bucketTimeline(t, b, uint64(seed), exact, 150)
			})
		}
	})
}

func bucketTimeline(t *testing.T, b *redistest.Backend, seed uint64, exact bool, steps int) {
	rng := rand.New(rand.NewPCG(seed, 11))
	divisors := []int64{1, 2, 4, 5, 10, 20}
	pickRate := func() int64 {
		if exact {
			return divisors[rng.IntN(len(divisors))]
		}
		return 1 + rng.Int64N(300)
	}
	period := int64(20 * (1 + rng.IntN(100000))) // up to 2 s
	if !exact {
		period = 1 + rng.Int64N(2*sec)
	}
	// the callers' burst is 8; overrides set the burst in force (n is at most both)
	f := newBucketRef(t, b, fmt.Sprintf("xtr%d", seed), pickRate(), period, 8, 1+rng.Int64N(8))
	type booking struct {
		n, token int64
		r        *rate.Reservation
	}
	var held []booking // bookings made since the limits last changed
	now := int64(0)
	for step := range steps {
		d := rng.Int64N(period/2 + 1)
		if exact {
			d -= d % 20
		}
		now += d
		at := f.at(now)
		trace := fmt.Sprintf("step %d at +%dµs (rate %d/%dµs, burst %d)", step, now, f.r, period, f.burst)
		switch k := rng.IntN(10); {
		case k < 6:
			n := 1 + rng.Int64N(f.burst)
			maxWait := []int64{0, rng.Int64N(period), rng.Int64N(4 * period), 1 << 40}[rng.IntN(4)]
			got, r, wait := f.reserve(n, maxWait)
			if got.failed() || (got.v[0] == 1) != (r != nil) {
				t.Fatalf("%s: acquire %d, max wait %dµs: script %v, x/time/rate wait %v, granted %v", trace, n, maxWait, got, wait, r != nil)
			}
			// the script's wait is x/time/rate's rounded up to the µs
			us := time.Duration(got.v[2]) * time.Microsecond
			if wait > us+time.Nanosecond || us-wait >= time.Microsecond+time.Nanosecond || (exact && (us-wait > time.Nanosecond || wait-us > time.Nanosecond)) {
				t.Fatalf("%s: acquire %d, max wait %dµs: script waits %v, x/time/rate %v", trace, n, maxWait, us, wait)
			}
			if r != nil {
				if got.v[4] != at.UnixMicro()+got.v[2] {
					t.Fatalf("%s: token %d, want now + wait", trace, got.v[4])
				}
				held = append(held, booking{n, got.v[4], r})
			}
		case k < 8 && exact && len(held) > 0:
			i := rng.IntN(len(held))
			bk := held[i]
			held = append(held[:i], held[i+1:]...)
			if d := bk.token - at.UnixMicro(); d == 0 {
				continue // x/time/rate's float time may fall a nanosecond either side of now
			}
			got := f.cancel(bk.n, bk.token, bk.r)
			if got.v[0] == 1 && bk.token < at.UnixMicro() {
				t.Fatalf("%s: cancel of a booking past: %v", trace, got)
			}
		case k < 9:
			f.set(pickRate(), 1+rng.Int64N(8))
			held = nil // x/time/rate cancels with the reservation's rate, the script with the rate in force
		default:
			if f.c.limits[0].rate != f.r || f.c.limits[0].burst != f.burst {
				f.set(f.c.limits[0].rate, f.c.limits[0].burst)
				held = nil
			}
		}
		// remaining is x/time/rate's whole tokens
		got := f.c.one(t, b, f.tag, inspect())
		if want := int64(f.lim.TokensAt(at) + 1e-9); got.v[1] != max(0, want) && exact {
			t.Fatalf("%s: remaining %d, x/time/rate holds %v tokens", trace, got.v[1], f.lim.TokensAt(at))
		}
	}
}

// x/time/rate's rate_test.go cases that map onto a Redis bucket, with its times: d =
// 100ms, tN = t0 + N·d; request{t, n, act, ok} books n at t, to act at act; a cancel
// happens at the time given.
func TestBucketXTimeRateCases(t *testing.T) {
	const d = 100 * ms
	type step struct {
		at     int64 // in d
		n      int64
		act    int64 // in d; -1: a cancel of the booking named by cancel
		cancel int
	}
	cases := []struct {
		name         string
		rate, burst  int64 // per second
		callers      int64 // the callers' burst, when it is not burst (an override sets burst)
		steps        []step
		limit, bur2  int64 // SetLimitAt/SetBurstAt: the new rate and burst ...
		setAt, setAf int   // ... at setAt (in d), after step setAf
	}{
		{name: "TestCancelMulti", rate: 10, burst: 4, steps: []step{
			{0, 4, 0, 0}, {0, 3, 3, 0}, {0, 1, 4, 0}, {0, 1, 5, 0},
			{1, 1, -1, 3},        // rC.CancelAt(t1): one token back
			{1, 3, -1, 1},        // rA.CancelAt(t1): two back, as if C was never booked
			{1, 3, 5, 0}}, setAf: -1},
		{name: "TestReserveJumpBackCancel", rate: 10, burst: 2, steps: []step{
			{1, 2, 1, 0}, {1, 2, 3, 0}, {1, 1, 4, 0},
			{0, 2, -1, 1},        // cancel at t0: one token back
			{1, 2, 4, 0}}, setAf: -1},
		{name: "TestReserveSetLimit", rate: 5, burst: 2, steps: []step{
			{0, 2, 0, 0}, {0, 2, 4, 0}, {2, 1, 4, 0}}, limit: 10, bur2: 2, setAt: 2, setAf: 1},
		{name: "TestReserveSetBurst", rate: 5, burst: 2, callers: 4, steps: []step{
			{0, 2, 0, 0}, {0, 2, 4, 0}, {0, 4, 9, 0}}, limit: 5, bur2: 4, setAt: 3, setAf: 1},
		{name: "TestReserveSetLimitCancel", rate: 5, burst: 2, steps: []step{
			{0, 2, 0, 0}, {0, 2, 4, 0},
			{2, 2, -1, 1},        // r.CancelAt(t2): two tokens back
			{2, 2, 3, 0}}, limit: 10, bur2: 2, setAt: 2, setAf: 1},
		{name: "TestWaitCancel", rate: 10, burst: 3, steps: []step{
			{0, 2, 0, 0}, {0, 3, 2, 0}, // WaitN(3) would wait 2d ...
			{1, 3, -1, 1},        // ... and is cancelled after d: three tokens back
			{1, 2, 1, 0}}, setAf: -1}, // WaitN(2) goes at once
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				f := newBucketRef(t, b, tc.name, tc.rate, sec, max(tc.callers, tc.burst), tc.burst)
				var tokens []int64
				for i, s := range tc.steps {
					f.at(s.at * d)
					if s.act == -1 {
						got := f.c.one(t, b, f.tag, cancel(int(s.n), tokens[s.cancel]))
						if got.v[0] != 1 {
							t.Fatalf("step %d: cancel: %v, want freed", i, got)
						}
						tokens = append(tokens, 0)
						continue
					}
					got := f.c.one(t, b, f.tag, acquire(int(s.n), 1<<40))
					if want := redistest.Epoch.UnixMicro() + s.act*d; got.v[0] != 1 || got.v[4] != want {
						t.Fatalf("step %d: acquire %d at t%d: %v, want token t%d", i, s.n, s.at, got, s.act)
					}
					tokens = append(tokens, got.v[4])
					if i == tc.setAf {
						f.at(int64(tc.setAt) * d)
						f.set(tc.limit, tc.bur2)
					}
				}
			})
		}
	})
}

// A bucket's change of limits settles its tokens at the change and counts at the new
// limits from then on: raising 5/s to 10/s brings the next permit sooner; a drained
// bucket of 1 per 2^45µs that callers deploy at 10/s (their head drifts from the
// stored one) refills at once at 10/s; lowering a drained 10/s burst-2 bucket to 1/s does
// not grant at once; raising the burst does not hand a drained bucket the new burst. An
// override that ends is settled at its end.
func TestBucketRateChanges(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		type change struct {
			name          string
			rate, period  int64
			burst         int64
			drain         int     // permits taken at Epoch
			after         int64   // µs later, the change:
			orate, oburst int     // an override, or ...
			deploy        []limit // ... the callers' new limits
			wait          int64   // an acquire of 1 then waits this, µs
		}
		for _, tc := range []change{
			{"raise the rate", 5, sec, 1, 1, 100 * ms, 10, 1, nil, 50 * ms},
			{"deploy a fast rate over a slow one", 1, 1 << 45, 1, 1, 100 * ms, 0, 0, []limit{{10, sec, 1}}, 100 * ms},
			{"lower the rate", 10, sec, 2, 2, 0, 1, 2, nil, sec},
			{"raise the burst", 10, sec, 2, 2, 0, 10, 8, nil, 100 * ms},
		} {
			tag := tagOf(b, strings.ReplaceAll(tc.name, " ", ""))
			clk := newClock(t, b, tag)
			c := call{a: tokenBucket, limits: []limit{{tc.rate, tc.period, tc.burst}}}
			if got := c.one(t, b, tag, acquire(tc.drain, 0)); got.v[0] != 1 {
				t.Fatalf("%s: drain: %v", tc.name, got)
			}
			clk.add(t, time.Duration(tc.after)*time.Microsecond)
			drifted := int64(0)
			if tc.deploy != nil {
				c.limits, drifted = tc.deploy, drift
			} else {
				c.one(t, b, tag, override(sec, tc.orate, tc.oburst))
			}
			if got := c.one(t, b, tag, acquire(1, 0)); got.v[2] != tc.wait || got.v[0] != 0 || got.v[6] != group|drifted {
				t.Fatalf("%s: %v, want a wait of %dµs, flags %d", tc.name, got, tc.wait, group|drifted)
			}
		}
		// the override of 1/s ends at +1.1s: 10/s from then on
		tag := tagOf(b, "overrideends")
		clk := newClock(t, b, tag)
		c := call{a: tokenBucket, limits: []limit{{10, sec, 2}}}
		c.one(t, b, tag, acquire(2, 0))
		c.one(t, b, tag, override(sec, 1, 2))
		clk.add(t, 1100*time.Millisecond) // 1s at 1/s, then 100ms at 10/s: 2 tokens
		if got := c.one(t, b, tag, acquire(2, 0)); got.v[0] != 1 {
			t.Fatalf("after the override's end: %v, want 2 tokens", got)
		}
	})
}

// A bucket can be full while a booking still lies ahead: an override refills it faster
// than the rate the booking was made at. Its state keeps the booking's time until it is
// due (Inspect's BookedAhead; a cancel of an earlier booking counts from it), so the same
// requests reply and leave the keys alike made one by one (a resume or a clear writes the
// full bucket) and in one call; once nothing lies ahead, a full bucket's data goes, the
// override's meta alone kept. Bookings at +1s and +2s of 1 per second, then 100 per
// second: full by +30ms.
func TestBucketFullWithABookingAhead(t *testing.T) {
	c := call{a: tokenBucket, limits: []limit{{1, sec, 1}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tagA, tagB := tagOf(b, "fullaheadA"), tagOf(b, "fullaheadB")
		clk := newClock(t, b, tagA, tagB)
		for _, tag := range []string{tagA, tagB} {
			c.run(t, b, tag, acquire(1, 0), acquire(1, 3*sec), acquire(1, 3*sec), override(0, 100, 1))
		}
		clk.add(t, 50*time.Millisecond)
		reqs := []*protocol.Request{resume(), inspect(), clearOver(), inspect(), cancel(1, tok(sec)), inspect()}
		lone := c.loneThenOne(t, b, tagA, tagB, reqs...)
		if ahead := lone[5].extra[1]; ahead != 1950*ms {
			t.Errorf("BookedAhead %dµs, want 1950ms (the booking at +2s)", ahead)
		}
		if lone[4].v[0] != 0 {
			t.Errorf("cancel of the booking at +1s: %v, want nothing freed (the booking after it, counted at 100 per second, outweighs it)", lone[4])
		}
		sameUnder(t, b, tagA, tagB, []string{keys.State}, "after "+texts(reqs))
		if ttl := b.Client.PTTL(context.Background(), tagA+":"+keys.State).Val(); !b.Real() && ttl != 1950*time.Millisecond {
			t.Errorf("state TTL %v, want 1.95s (until the booking)", ttl)
		}
		// at +2s nothing lies ahead: the full bucket's data goes, an override's meta stays
		clk.set(t, redistest.Epoch.Add(2*time.Second))
		for _, tag := range []string{tagA, tagB} {
			c.run(t, b, tag, override(0, 100, 1), resume())
			if m, alone := meta(t, b.Client, tag+":"+keys.State); m == "" || !alone {
				t.Errorf("%s at +2s: meta %q alone %v, want the override's meta alone", tag, m, alone)
			}
		}
	})
}

// A settle for less gives back no more than the burst kept: 400 tokens a second, 400
// taken at 0 on an estimate, 200 at +0.5s (the bucket refilled to 200), the first settled
// at +0.6s as 0. Had it cost 0, the bucket was full at +0.5s, held 200 after the second
// and 240 at +0.6s: 240 may be taken then, not 241 (the whole estimate back would allow
// 400, 600 in 100ms). With nothing taken after a grant, all of it comes back (TestSettle);
// a take in the grant's slot before it does not count against it.
func TestBucketSettleRefundsWhatTheBurstKept(t *testing.T) {
	c := call{a: tokenBucket, limits: []limit{{1000, sec, 1000}, {400, sec, 400}}, units: []string{"", "tokens"}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, n := range []int{240, 241} {
			tag := tagOf(b, fmt.Sprintf("refund%d", n))
			clk := newClock(t, b, tag)
			g := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 400))
			clk.add(t, 500*time.Millisecond)
			c.one(t, b, tag, costs(acquire(1, 0), "tokens", 200))
			clk.add(t, 100*time.Millisecond)
			if got := c.one(t, b, tag, costs(settle(1, g.v[4], "1"), "tokens", 400, 0)); got.v[0] != 1 {
				t.Fatalf("the settle of 400 as 0: %v", got)
			}
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", n)); got.v[0] != map[int]int64{240: 1, 241: 0}[n] {
				t.Errorf("%d tokens at +0.6s: %v, want only 240 granted", n, got)
			}
		}
		// a take before the grant in its slot found the bucket full (no room): 200 at 0, 100 at
		// +0.1s, the second settled as 0 at +0.2s gets all 100 back (280: 240 at +0.1s had it
		// cost 0, and 40 refilled), not 281
		for _, n := range []int{280, 281} {
			tag := tagOf(b, fmt.Sprintf("refundslot%d", n))
			clk := newClock(t, b, tag)
			c.one(t, b, tag, costs(acquire(1, 0), "tokens", 200))
			clk.add(t, 100*time.Millisecond)
			g := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 100))
			clk.add(t, 100*time.Millisecond)
			c.one(t, b, tag, costs(settle(1, g.v[4], "1"), "tokens", 100, 0))
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", n)); got.v[0] != map[int]int64{280: 1, 281: 0}[n] {
				t.Errorf("%d tokens at +0.2s: %v, want only 280 granted", n, got)
			}
		}
	})
}

// A unit's notes that are not the bucket's (a negative or oversized number, an odd count)
// make its state foreign, as its other numbers do: ErrState, nothing written.
func TestBucketNotesForeign(t *testing.T) {
	c := call{a: tokenBucket, limits: []limit{{1000, sec, 1000}, {100, sec, 100}}, units: []string{"", "tokens"}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for i, notes := range []string{"r -1 5", "r 0 5 7", "r 0 99999999999999999", "r 0 5 x 1"} {
			tag := tagOf(b, fmt.Sprintf("notes%d", i))
			newClock(t, b, tag)
			key, text := tag+":u:tokens", fmt.Sprintf("%d 40000000 0 %s\ntb /tokens 100 1000000 100", redistest.Epoch.UnixMicro(), notes)
			if err := b.Client.Set(context.Background(), key, text, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if got := c.one(t, b, tag, costs(acquire(1, 0), "tokens", 1)); got.code() != protocol.ErrState {
				t.Errorf("notes %q: %v, want ErrState", notes, got)
			}
			if v := b.Client.Get(context.Background(), key).Val(); v != text {
				t.Errorf("notes %q: the state became %q", notes, v)
			}
		}
	})
}

// Refunds keep the rate used: a bucket of 6,000 tokens a minute (burst the same), a caller
// asking 100 tokens every 10ms, each grant settled 20ms later at 10-100 % of it, for 20s
// (simulated): the actual tokens granted come to at least 95 % of what the bucket allows
// (its burst and 20s of refill). Without refunds it would be about the mean actual share.
// JOBTHROTTLE_LONG=1: 100,000 tokens a minute, 1,000 asked every ms, a minute, miniredis
// alone (bench/RESULTS.md, "Token bucket refunds").
func TestBucketRefundsKeepTheRateUsed(t *testing.T) {
	rate, ask, step, steps, each := 6000, 100, 10*time.Millisecond, 2000, redistest.Each
	if os.Getenv("JOBTHROTTLE_LONG") != "" {
		rate, ask, step, steps = 100000, 1000, time.Millisecond, 60000
		each = func(t *testing.T, f func(*testing.T, *redistest.Backend)) { f(t, redistest.NewMini(t)) }
	}
	c := call{a: tokenBucket, limits: []limit{{1000000, sec, 1000000}, {int64(rate), 60 * sec, int64(rate)}}, units: []string{"", "tokens"}}
	each(t, func(t *testing.T, b *redistest.Backend) {
		tag := tagOf(b, "refunduse")
		clk := newClock(t, b, tag)
		rng := rand.New(rand.NewPCG(1, 2))
		type grant struct {
			due, token int64
			actual     int
		}
		var open []grant
		used := 0
		for i := range steps {
			for len(open) > 0 && open[0].due <= int64(i) {
				g := open[0]
				open = open[1:]
				if got := c.one(t, b, tag, costs(settle(1, g.token, fmt.Sprint(g.token, i)), "tokens", ask, g.actual)); got.v[0] != 1 {
					t.Fatalf("settle %v: %v", g, got)
				}
			}
			if g := c.one(t, b, tag, costs(acquire(1, 0), "tokens", ask)); g.v[0] == 1 {
				a := ask/10 + rng.IntN(ask*9/10+1)
				used += a
				open = append(open, grant{int64(i) + int64(20*time.Millisecond/step), g.v[4], a})
			}
			clk.add(t, step)
		}
		span := time.Duration(steps) * step
		allowed := float64(rate) + float64(rate)*span.Minutes()
		share := float64(used) / allowed
		redistest.Figure(t, "token bucket refunds, %s: %d actual tokens granted of the %.0f the bucket allows in %v: %.1f %%", b.Kind, used, allowed, span, 100*share)
		if share < 0.95 {
			t.Errorf("%.1f %% of the bucket's tokens used, want at least 95 %%", 100*share)
		}
	})
}
