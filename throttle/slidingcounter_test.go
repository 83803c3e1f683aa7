package throttle

import (
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// SlidingCounter's head is "sc", the sub-buckets of the shortest period, then rate and
// period_us per limit, as lua/log.lua asks; the largest n is the smallest rate.
func TestSlidingCounterHead(t *testing.T) {
	limits := []Limit{PerSecond(5), {Rate: 2, Period: 300 * ms}}
	if got, want := SlidingCounter.algo().head(limits, 7).String(), "sc 7 5 1000000 2 300000"; got != want {
		t.Errorf("head = %q, want %q", got, want)
	}
	if got, want := SlidingCounter.algo().maxN(Limit{Rate: 4, Period: time.Second, Burst: 9}), 4; got != want {
		t.Fatalf("maxN = %d, want %d (the rate)", got, want)
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
