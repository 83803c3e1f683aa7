package throttle

import (
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

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
