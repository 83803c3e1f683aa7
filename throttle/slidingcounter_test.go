package throttle

import (
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// SlidingCounter sends m, rate and period_us per limit, then the sub-bucket width, as
// lua/log.lua asks: the shortest period split into the configured number of buckets,
// rounded up (never 0, which would make it the exact sliding window).
func TestSlidingCounterArgs(t *testing.T) {
	for _, c := range []struct {
		limits  []Limit
		buckets int
		want    []any
	}{
		{[]Limit{PerSecond(2)}, 4, []any{1, 2, int64(1_000_000), int64(250_000)}},
		{[]Limit{PerSecond(2)}, 10, []any{1, 2, int64(1_000_000), int64(100_000)}},
		// the shortest period decides, wherever it is in the list; 300ms/7 rounds up
		{[]Limit{PerSecond(5), {Rate: 2, Period: 300 * ms}}, 7,
			[]any{2, 5, int64(1_000_000), 2, int64(300_000), int64(42_858)}},
		// a period shorter than the number of buckets: 1µs buckets, not 0
		{[]Limit{{Rate: 1, Period: 3 * time.Microsecond}}, 10, []any{1, 1, int64(3), int64(1)}},
	} {
		if got := SlidingCounter.algo().args(c.limits, c.buckets); !slices.Equal(got, c.want) {
			t.Errorf("args(%v, %d buckets) = %v, want %v", c.limits, c.buckets, got, c.want)
		}
	}
	if got, want := SlidingCounter.algo().maxN(Limit{Rate: 4, Period: time.Second, Burst: 9}), 4; got != want {
		t.Fatalf("maxN = %d, want %d (the rate)", got, want)
	}
	if SlidingCounter.algo().suffix != "sc" {
		t.Fatalf("SlidingCounter's state key suffix is %q, want sc", SlidingCounter.algo().suffix)
	}
}

// A grant counts from the end of its bucket for one Period: 2 per second in 250ms
// buckets, a grant at t0+100ms holds its place until t0+1250ms. So a denied caller
// waits for that, and no Period ever holds more than Rate grants.
func TestSlidingCounterHoldsAPermitToItsBucketsEnd(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("sc", PerSecond(2), WithAlgorithm(SlidingCounter), WithBuckets(4))
		runSteps(t, tl, l, []step{
			{100 * ms, 1, Result{true, 1, 0, 1150 * ms}},          // counted at t0+250ms, until t0+1250ms
			{300 * ms, 1, Result{true, 0, 0, 1200 * ms}},          // counted at t0+500ms, until t0+1500ms
			{400 * ms, 1, Result{false, 0, 850 * ms, 1100 * ms}},  // the first leaves at t0+1250ms
			{1100 * ms, 1, Result{false, 0, 150 * ms, 400 * ms}},  // a sliding window would grant here
			{1249 * ms, 0, Result{true, 0, 0, 251 * ms}},          // n = 0 reads: still full
			{1250 * ms, 1, Result{true, 0, 0, 1250 * ms}},         // counted at t0+1500ms, until t0+2500ms
			{1400 * ms, 1, Result{false, 0, 100 * ms, 1100 * ms}}, // the second leaves at t0+1500ms
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
			runSteps(t, tl, l, []step{{at, 1, Result{true, 999 - i, 0, end + time.Second - at}}})
		}
		// list [base, B1, S1, B2, S2, B3, S3]
		key := "{" + b.Prefix + "sc-mem}:sc"
		n, err := b.Client.LLen(t.Context(), key).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, int64(1+2*3); got != want {
			t.Fatalf("%s holds %d items after 100 grants in 3 buckets, want %d", key, got, want)
		}
	})
}
