package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"golang.org/x/time/rate"
)

func TestAlgorithmString(t *testing.T) {
	for a, want := range map[Algorithm]string{
		SlidingWindow:  "SlidingWindow",
		TokenBucket:    "TokenBucket",
		FixedWindow:    "FixedWindow",
		SlidingCounter: "SlidingCounter",
		Algorithm(4):   "Algorithm(4)",
		Algorithm(-1):  "Algorithm(-1)",
	} {
		if got := a.String(); got != want {
			t.Errorf("Algorithm(%d).String(): got %q, want %q", int(a), got, want)
		}
	}
}

// Each Algorithm names itself by its head's tag in the state it keeps (so one that meets
// another's state knows it); the log script serves SlidingWindow (an exact log) and
// SlidingCounter (sub-buckets), the others a script each.
func TestAlgorithmRunsItsScript(t *testing.T) {
	want := map[Algorithm]struct {
		tag    string
		script *script
	}{
		SlidingWindow:  {"sw", logScript},
		SlidingCounter: {"sc", logScript},
		TokenBucket:    {"tb", bucketScript},
		FixedWindow:    {"fw", windowScript},
	}
	for _, alg := range allAlgorithms {
		a := alg.algo()
		if a.tag != want[alg].tag || a.script != want[alg].script {
			t.Errorf("%v: tag %q, script %s; want %q, %s", alg, a.tag, a.script.sha, want[alg].tag, want[alg].script.sha)
		}
	}
	if logScript.sha == bucketScript.sha || logScript.sha == windowScript.sha || bucketScript.sha == windowScript.sha {
		t.Error("two algorithms' scripts have the same SHA")
	}
}

// head is what the limiter sends as ARGV[1]: the tag, the counter's buckets, then rate
// and period_us per limit, whole µs rounded up (and the burst for the token bucket), in
// order; a burst means nothing to the others. The largest n is the smallest rate (the
// token bucket: burst).
func TestLimitHead(t *testing.T) {
	limits := []Limit{{Rate: 5, Period: time.Second, Burst: 3}, {Rate: 1000, Period: time.Hour, Burst: 1200},
		{Rate: 7, Period: 1500 * time.Nanosecond, Burst: 20}}
	rdb := redistest.NewMini(t).Client
	for _, c := range []struct {
		alg  Algorithm
		want string
		maxN int
	}{
		{SlidingWindow, "sw 5 1000000 1000 3600000000 7 2", 5},
		{SlidingCounter, "sc 7 5 1000000 1000 3600000000 7 2", 5},
		{TokenBucket, "tb 5 1000000 3 1000 3600000000 1200 7 2 20", 3},
		{FixedWindow, "fw 5 1000000 1000 3600000000 7 2", 5},
	} {
		l, err := New(rdb, "k", limits[0], WithLimits(limits[1:]...), WithAlgorithm(c.alg), WithBuckets(7))
		if err != nil {
			t.Fatal(err)
		}
		if l.t.head != c.want || l.maxN != c.maxN {
			t.Errorf("%v: head %q, maxN %d; want %q, %d", c.alg, l.t.head, l.maxN, c.want, c.maxN)
		}
	}
}

// ---- SlidingWindow

// The seed's worked example (Redisson, 5 per second), with the wait Redisson gets wrong.
func TestSlidingWindowSeedExample(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("seed", PerSecond(5))
		runSteps(t, tl, l, []step{
			{0, 1, Result{true, 4, 0, 1000 * ms, false, false}},               // t0: take 1
			{100 * ms, 2, Result{true, 2, 0, 1000 * ms, false, false}},        // take 2
			{200 * ms, 3, Result{false, 2, 800 * ms, 900 * ms, false, false}}, // 3 fit when t0's permit leaves
			{1100 * ms, 1, Result{true, 4, 0, 1000 * ms, false, false}},       // t0 and t0+100 have left
		})
	})
}

// Grants of 1,1,1,2 then a request for 3: three permits must leave, so the wait runs
// to the third oldest (800ms), not the oldest (Redisson's 600ms); after it, one try.
func TestSlidingWindowWaitsForEnoughPermits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("enough", PerSecond(5))
		runSteps(t, tl, l, []step{
			{0, 1, Result{true, 4, 0, 1000 * ms, false, false}},
			{100 * ms, 1, Result{true, 3, 0, 1000 * ms, false, false}},
			{200 * ms, 1, Result{true, 2, 0, 1000 * ms, false, false}},
			{300 * ms, 2, Result{true, 0, 0, 1000 * ms, false, false}},
			{400 * ms, 3, Result{false, 0, 800 * ms, 900 * ms, false, false}},
			{1200 * ms, 3, Result{true, 0, 0, 1000 * ms, false, false}}, // first try after the wait
		})
	})
}

// ---- SlidingCounter

// A grant counts from the end of its bucket for one Period: 2 per second in 250ms
// buckets, a grant at t0+100ms holds its place until t0+1250ms. So a denied caller
// waits for that, and no Period ever holds more than Rate grants.
func TestSlidingCounterHoldsAPermitToItsBucketsEnd(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("sc", PerSecond(2), WithAlgorithm(SlidingCounter), WithBuckets(4))
		runSteps(t, tl, l, []step{
			{100 * ms, 1, Result{true, 1, 0, 1150 * ms, false, false}},          // counted at t0+250ms, until t0+1250ms
			{300 * ms, 1, Result{true, 0, 0, 1200 * ms, false, false}},          // counted at t0+500ms, until t0+1500ms
			{400 * ms, 1, Result{false, 0, 850 * ms, 1100 * ms, false, false}},  // the first leaves at t0+1250ms
			{1100 * ms, 1, Result{false, 0, 150 * ms, 400 * ms, false, false}},  // a sliding window would grant here
			{1249 * ms, 0, Result{true, 0, 0, 251 * ms, false, false}},          // n = 0 reads: still full
			{1250 * ms, 1, Result{true, 0, 0, 1250 * ms, false, false}},         // counted at t0+1500ms, until t0+2500ms
			{1400 * ms, 1, Result{false, 0, 100 * ms, 1100 * ms, false, false}}, // the second leaves at t0+1500ms
		})
	})
}

// The same grants in one bucket share its counter: the state holds one entry per
// bucket however many grants there are (memory O(buckets)).
func TestSlidingCounterOneEntryPerBucket(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("sc-mem", PerSecond(1000), WithAlgorithm(SlidingCounter), WithBuckets(4))
		for i := range 100 { // 100 grants over 700ms: buckets 0, 1 and 2
			at := time.Duration(i) * 7 * ms
			end := (at/(250*ms) + 1) * 250 * ms // the end of at's bucket
			runSteps(t, tl, l, []step{{at, 1, Result{true, 999 - i, 0, end + time.Second - at, false, false}}})
		}
		// list [meta, base, B1, S1, B2, S2, B3, S3]
		key := l.stateKey()
		n, err := b.Client.LLen(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, int64(2+2*3); got != want {
			t.Fatalf("%s holds %d items after 100 grants in 3 buckets, want %d", key, got, want)
		}
	})
}

// ---- TokenBucket (a change of its rates: control_xrate_test.go)

// The seed's token bucket: capacity 10, 10 per minute; take 5, take 5, ask 5.
func TestTokenBucketSeedExample(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("seed", Limit{Rate: 10, Period: time.Minute, Burst: 10}, WithAlgorithm(TokenBucket))
		runSteps(t, tl, l, []step{
			{0, 5, Result{true, 5, 0, 30 * time.Second, false, false}},
			{0, 5, Result{true, 0, 0, 60 * time.Second, false, false}},
			{0, 5, Result{false, 0, 30 * time.Second, 60 * time.Second, false, false}}, // 5 tokens take 30s to come
			{30 * time.Second, 5, Result{true, 0, 0, 60 * time.Second, false, false}},
		})
	})
}

// Decisions and waits match golang.org/x/time/rate with the same rate and burst,
// request for request, on random timelines.
func TestTokenBucketMatchesXTimeRate(t *testing.T) {
	noteMissingServers(t, "the property was checked on miniredis only", redistest.Standalone, redistest.Cluster)
	cases := []Limit{
		{Rate: 10, Period: time.Second, Burst: 1},
		{Rate: 3, Period: time.Second, Burst: 5}, // 333333.3µs per token
		{Rate: 7, Period: 100 * time.Millisecond, Burst: 20},
		{Rate: 100, Period: time.Minute, Burst: 100},
		{Rate: 9999, Period: time.Second, Burst: 50},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rng := rand.New(rand.NewSource(1))
		for ci, lim := range cases {
			tl := newTimeline(t, b)
			l := tl.limiter("oracle"+string(rune('a'+ci)), lim, WithAlgorithm(TokenBucket))
			perSec := float64(lim.Rate) / lim.Period.Seconds()
			oracle := rate.NewLimiter(rate.Limit(perSec), lim.Burst)
			interval := lim.Period / time.Duration(lim.Rate)
			var at time.Duration
			steps := 150
			if b.Kind != redistest.Standalone { // as eachModelCase
				steps = 60
			}
			ties := 0
			for i := 0; i < steps; i++ {
				at += time.Duration(rng.Int63n(int64(2*interval)/1000+1)) * time.Microsecond
				n := 1 + rng.Intn(lim.Burst)
				tl.at(at)
				now := redistest.Epoch.Add(at)
				tokens := oracle.TokensAt(now)
				if math.Abs(tokens-float64(n)) < 1e-6 {
					ties++ // exactly on the boundary: float rounding may decide either way
				}
				want := oracle.AllowN(now, n)
				got, err := l.AllowN(context.Background(), n)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed != want {
					t.Fatalf("%v step %d (t0+%v, n=%d, x/time/rate tokens %.9f): allowed %v, want %v",
						lim, i, at, n, tokens, got.Allowed, want)
				}
				if !want {
					wantWait := time.Duration(math.Ceil((float64(n)-tokens)/perSec*1e6)) * time.Microsecond
					if d := got.RetryAfter - wantWait; d < -time.Microsecond || d > time.Microsecond {
						t.Fatalf("%v step %d: RetryAfter %v, want %v", lim, i, got.RetryAfter, wantWait)
					}
				} else if wantRem := int(math.Floor(oracle.TokensAt(now) + 1e-9)); got.Remaining != wantRem {
					t.Fatalf("%v step %d: Remaining %d, want %d", lim, i, got.Remaining, wantRem)
				}
			}
			t.Logf("%v: %d steps match x/time/rate (%d on an exact boundary)", lim, steps, ties)
		}
	})
}

// Several token-bucket limits on one key decide like x/time/rate limiters checked
// together: granted only if every bucket has n tokens, and then taken from all.
func TestTokenBucketLimitsMatchXTimeRate(t *testing.T) {
	noteMissingServers(t, "the property was checked on miniredis only", redistest.Standalone, redistest.Cluster)
	limits := []Limit{
		{Rate: 5, Period: time.Second, Burst: 3},
		{Rate: 12, Period: 10 * time.Second, Burst: 8},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rng := rand.New(rand.NewSource(7))
		tl := newTimeline(t, b)
		l := tl.limiter("multi", limits[0], WithAlgorithm(TokenBucket), WithLimits(limits[1:]...))
		var oracles []*rate.Limiter
		for _, lim := range limits {
			oracles = append(oracles, rate.NewLimiter(rate.Limit(float64(lim.Rate)/lim.Period.Seconds()), lim.Burst))
		}
		var at time.Duration
		granted := 0
		for i := 0; i < 150; i++ {
			at += time.Duration(rng.Intn(400_000)) * time.Microsecond
			n := 1 + rng.Intn(3)
			now := redistest.Epoch.Add(at)
			want := true
			var wantWait time.Duration
			for _, o := range oracles {
				if tokens := o.TokensAt(now); tokens < float64(n) {
					want = false
					wantWait = max(wantWait, time.Duration(math.Ceil((float64(n)-tokens)/float64(o.Limit())*1e6))*time.Microsecond)
				}
			}
			if want {
				for _, o := range oracles {
					o.AllowN(now, n)
				}
				granted++
			}
			tl.at(at)
			got, err := l.AllowN(context.Background(), n)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want {
				t.Fatalf("step %d (t0+%v, n=%d): allowed %v, want %v", i, at, n, got.Allowed, want)
			}
			if !want {
				if d := got.RetryAfter - wantWait; d < -time.Microsecond || d > time.Microsecond {
					t.Fatalf("step %d: RetryAfter %v, want %v (the longest wait)", i, got.RetryAfter, wantWait)
				}
			}
		}
		t.Logf("150 steps, %d granted, all as two x/time/rate limiters checked together", granted)
	})
}

// The token bucket's state is "<last> <u1> <e1> ...\n<meta>" (lua/bucket.lua): when the
// tokens were counted, then per limit the tokens in ticks (p a token, r a µs) and the
// latest booking while it lies ahead (else 0), exact integers, negative tokens when booked ahead; the limits they
// were counted with are the meta's head's. It is written so, read back (the next
// decisions follow from it), taken as jobthrottle's by internal/keys (the operator's
// tools), and any other text is refused (ErrCorruptState) and left as it is.
func TestTokenBucketStateForm(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("bucket-form", Limit{Rate: 2, Period: time.Second}, WithAlgorithm(TokenBucket),
			WithLimits(Limit{Rate: 3, Period: 10 * time.Second}))
		t0 := tl.now.UnixMicro()
		head := "\ntb 2 1000000 2 3 10000000 3"
		state := func(want string) {
			t.Helper()
			got, err := b.Client.Get(ctx, l.stateKey()).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("state %q, want %q", got, want)
			}
			if err := keys.Check(keys.State, "string", []string{got}); err != nil {
				t.Fatalf("internal/keys does not take the state as jobthrottle's: %v", err)
			}
		}
		runSteps(t, tl, l, []step{{0, 2, Result{true, 0, 0, 6666667 * time.Microsecond, false, false}}}) // the second refills in 20/3s
		// 2 of 2 taken from the first (0 left), 2 of 3 from the second (1e7 ticks left); no
		// booking lies ahead (e 0: a past one decides nothing)
		state(fmt.Sprintf("%d 0 0 10000000 0", t0) + head)
		// at t0+100ms one permit is booked for t0+500ms, when the first has a token again
		tl.at(100 * ms)
		if r, err := l.Reserve(ctx, 1, time.Second); err != nil || !r.OK() || r.Delay() != 400*ms {
			t.Fatalf("Reserve: %v, want a booking 400ms ahead", err)
		}
		now := t0 + 100_000
		state(fmt.Sprintf("%d -800000 %d 300000 %d", now, now+400_000, now+400_000) + head)
		runSteps(t, tl, l, []step{
			{200 * ms, 1, Result{false, 0, 3133334 * time.Microsecond, 9800 * ms, false, false}}, // the second holds 6e5 of the 1e7 ticks of a token: (1e7-6e5)/3 µs
			{1 * time.Second, 1, Result{false, 0, 2333334 * time.Microsecond, 9 * time.Second, false, false}},
		})

		for _, foreign := range []string{
			"661f1e8ad4b6d:0:0",                                         // an older release's TAT, in hex
			fmt.Sprintf("%d 0 %d", t0, t0) + head,                       // the numbers of one limit, the head's two
			fmt.Sprintf("%d 0 %d 10000000", t0, t0) + head,              // a limit cut short
			fmt.Sprintf("%d 3000000 %d 10000000 %d", t0, t0, t0) + head, // more tokens than the burst
			fmt.Sprintf("%d 0 %d x %d", t0, t0, t0) + head,              // a word that is no number
			fmt.Sprintf("%d 0 %d 10000000 %d\nhello", t0, t0, t0),       // a meta not ours
			fmt.Sprintf("%d 0 %d 10000000 %d", t0, t0, t0),              // no meta
		} {
			if err := b.Client.Set(ctx, l.stateKey(), foreign, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			if _, err := l.AllowN(ctx, 1); !errors.Is(err, ErrCorruptState) {
				t.Fatalf("state %q: %v, want ErrCorruptState", foreign, err)
			}
			if got := b.Client.Get(ctx, l.stateKey()).Val(); got != foreign {
				t.Fatalf("state %q was changed to %q", foreign, got)
			}
		}
	})
}

// An override that lowers the burst cuts the tokens above it, and they stay cut when it
// ends: the tokens held at a change of burst are kept, as x/time/rate's SetBurstAt keeps
// them, even while the bucket is full at the lower burst (its state is kept until it is
// full at the callers' burst too).
func TestTokenBucketOverrideKeepsTheTokens(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		limit := Limit{Rate: 10, Period: time.Minute, Burst: 10}
		for _, c := range []struct {
			name string
			d    time.Duration // the override's length; 0: until cleared
		}{{"cleared", 0}, {"expired", 20 * time.Second}} {
			tl := newTimeline(t, b)
			l := tl.limiter("bucket-override-"+c.name, limit, WithAlgorithm(TokenBucket))
			oracle := rate.NewLimiter(rate.Limit(float64(limit.Rate)/limit.Period.Seconds()), limit.Burst)
			t0 := tl.now
			if r, err := l.AllowN(ctx, 2); err != nil || !r.Allowed || r.Remaining != 8 {
				t.Fatalf("%s: AllowN(2): %+v %v", c.name, r, err)
			}
			oracle.AllowN(t0, 2)
			if err := l.Override(ctx, c.d, Limit{Rate: 10, Burst: 5}); err != nil {
				t.Fatal(err)
			}
			oracle.SetBurstAt(t0, 5)
			// 10s later the bucket is full at 5: nothing of it would be left to count from
			tl.at(10 * time.Second)
			if c.d == 0 {
				if err := l.ClearOverride(ctx); err != nil {
					t.Fatal(err)
				}
				oracle.SetBurstAt(tl.now, 10)
			} else {
				tl.at(c.d)
				oracle.SetBurstAt(t0.Add(c.d), 10)
			}
			want := int(oracle.TokensAt(tl.now))
			r, err := l.AllowN(ctx, 0)
			if err != nil || r.Remaining != want {
				t.Fatalf("%s: after the override: Remaining %d (%v), want %d, the tokens x/time/rate keeps", c.name, r.Remaining, err, want)
			}
			if want >= limit.Burst {
				t.Fatalf("%s: the oracle holds a full bucket: the case shows nothing", c.name)
			}
		}
	})
}

// ---- FixedWindow

// Windows are aligned on multiples of Period since the Unix epoch: t0 (redistest.Epoch,
// 03:04:05) is a second boundary, and 55s before a minute boundary. A denied caller
// waits exactly until its window ends, and a new window has the whole rate, even right
// after a full one: the known 2 × Rate at the boundary.
func TestFixedWindowAlignedWindows(t *testing.T) {
	if Epoch := redistest.Epoch; Epoch.Truncate(time.Second) != Epoch || Epoch.Second() != 5 {
		t.Fatalf("the timelines below assume t0 = redistest.Epoch is hh:mm:05.000, not %v", Epoch)
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("fw-second", PerSecond(3), WithAlgorithm(FixedWindow))
		runSteps(t, tl, l, []step{
			{0, 2, Result{true, 1, 0, time.Second, false, false}},              // t0: the window [t0, t0+1s) opens
			{900 * ms, 1, Result{true, 0, 0, 100 * ms, false, false}},          // full; the window ends in 100ms
			{950 * ms, 1, Result{false, 0, 50 * ms, 50 * ms, false, false}},    // wait until it ends, not a second
			{999 * ms, 0, Result{true, 0, 0, 1 * ms, false, false}},            // n = 0 reads: still full
			{1000 * ms, 3, Result{true, 0, 0, time.Second, false, false}},      // new window: 6 permits in 100ms
			{1500 * ms, 1, Result{false, 0, 500 * ms, 500 * ms, false, false}}, // full again until t0+2s
			{3200 * ms, 1, Result{true, 2, 0, 800 * ms, false, false}},         // idle windows leave nothing
		})

		l = tl.limiter("fw-minute", PerMinute(2), WithAlgorithm(FixedWindow))
		tl.at(0)
		runSteps(t, tl, l, []step{
			{0, 2, Result{true, 0, 0, 55 * time.Second, false, false}},                                // the minute ends at 03:05:00
			{10 * time.Second, 1, Result{false, 0, 45 * time.Second, 45 * time.Second, false, false}}, // not 60s after t0
			{55 * time.Second, 2, Result{true, 0, 0, time.Minute, false, false}},                      // the next minute has both
		})
	})
}

// With several limits each counts in its own aligned windows; a request must fit all
// of them, and the wait is the end of the window that has no room.
func TestFixedWindowSeveralLimits(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("fw-multi", Limit{Rate: 2, Period: 200 * ms}, WithAlgorithm(FixedWindow),
			WithLimits(PerSecond(3)))
		runSteps(t, tl, l, []step{
			{0, 2, Result{true, 0, 0, time.Second, false, false}},             // 200ms window full, 1 left this second
			{100 * ms, 1, Result{false, 0, 100 * ms, 900 * ms, false, false}}, // the 200ms window ends at t0+200ms
			{200 * ms, 1, Result{true, 0, 0, 800 * ms, false, false}},         // next 200ms window; the second is full
			{400 * ms, 1, Result{false, 0, 600 * ms, 600 * ms, false, false}}, // 200ms window has room, the second not
			{1000 * ms, 2, Result{true, 0, 0, time.Second, false, false}},     // both windows new
		})
	})
}

// ---- one algorithm per key

// Two algorithms on one key: the second gets an *AlgorithmError (ErrAlgorithmMismatch)
// for every call, grants nothing and leaves the state as it was, whichever comes first,
// on every backend, for a task's booking, Inspect and Override too (the one state key's
// meta names the algorithm, read by every request);
// deleting the first's state (what `jobthrottle reset` does) moves the key to the other
// algorithm, which the first then refuses. (Two algorithms each keeping their own state
// on one key would each admit up to the limit: twice the limit.)
func TestOneAlgorithmPerKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, first := range allAlgorithms {
			for _, second := range allAlgorithms {
				if first == second {
					continue
				}
				key := "one-" + first.String() + "-" + second.String()
				a, err := New(b.Client, key, PerMinute(10), WithAlgorithm(first), WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				z, err := New(b.Client, key, PerMinute(10), WithAlgorithm(second), WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				// the whole limit taken and a booking ahead: every form of its state's numbers
				if r, err := a.AllowN(ctx, 10); err != nil || !r.Allowed {
					t.Fatalf("%v first: %+v %v", first, r, err)
				}
				if r, err := a.Reserve(ctx, 1, time.Hour); err != nil || !r.OK() || r.Delay() <= 0 {
					t.Fatalf("%v first, a booking ahead: %v %v", first, r, err)
				}
				before := ctlSnapshot(t, b.Client, a.stateKey())
				_, err = z.Allow(ctx)
				var ae *AlgorithmError
				if !errors.Is(err, ErrAlgorithmMismatch) || !errors.As(err, &ae) || ae.Found != first || ae.Want != second || ae.Key != key {
					t.Fatalf("%v after %v: %v (%+v), want an AlgorithmError found %v want %v", second, first, err, ae, first, second)
				}
				if _, err := z.Reserve(ctx, 1, 0); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Reserve after %v: %v", second, first, err)
				}
				if _, err := z.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Minute); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Reserve for a task after %v: %v", second, first, err)
				}
				if _, err := z.Inspect(ctx); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Inspect after %v: %v", second, first, err)
				}
				if err := z.Override(ctx, time.Minute, PerMinute(20)); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Override after %v: %v", second, first, err)
				}
				ctlSameAs(t, fmt.Sprintf("%v's refused calls after %v", second, first), before, ctlSnapshot(t, b.Client, a.stateKey()), a.stateKey())
				if n := b.Client.Exists(ctx, a.bookingKey("task-1")).Val(); n != 0 {
					t.Fatalf("%v after %v: the refused task's call wrote its booking", second, first)
				}
				if r, err := a.Allow(ctx); err != nil || r.Allowed {
					t.Fatalf("%v goes on: %+v %v, want denied (its limit taken)", first, r, err)
				}
				if err := b.Client.Del(ctx, a.stateKey()).Err(); err != nil {
					t.Fatal(err)
				}
				if r, err := z.Allow(ctx); err != nil || !r.Allowed || r.Remaining != 9 {
					t.Fatalf("%v after %v's state was deleted: %+v %v", second, first, r, err)
				}
				if _, err := a.Allow(ctx); !errors.As(err, &ae) || ae.Found != second || ae.Want != first {
					t.Fatalf("%v after %v took over: %v", first, second, err)
				}
			}
		}
	})
}
