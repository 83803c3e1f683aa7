package throttle

import (
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// FixedWindow's head is "fw", then rate and period_us per limit, as lua/window.lua asks;
// the largest n is the smallest rate (a burst means nothing to a window).
func TestFixedWindowHead(t *testing.T) {
	limits := []Limit{PerSecond(3), {Rate: 100, Period: time.Minute}, {Rate: 7, Period: 1500 * time.Microsecond, Burst: 20}}
	if got, want := FixedWindow.algo().head(limits, defaultBuckets).String(), "fw 3 1000000 100 60000000 7 1500"; got != want {
		t.Fatalf("head = %q, want %q", got, want)
	}
	l, err := New(redistest.NewMini(t).Client, "k", limits[0], WithAlgorithm(FixedWindow), WithLimits(limits[1:]...))
	if err != nil {
		t.Fatal(err)
	}
	if l.maxN != 3 {
		t.Fatalf("maxN = %d, want 3 (the smallest rate)", l.maxN)
	}

}

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
