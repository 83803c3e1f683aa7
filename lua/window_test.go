package lua

import (
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// The fixed window: grants count in the window holding them; bookings go to the latest
// grant's window or a later one; a cancel gives back only in the latest window.
func TestFixedWindowOps(t *testing.T) {
	c := call{a: fixedWindow, limits: []limit{{2, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "fw", []step{
			w(100*ms, acquire(2, 0), "", 1, 0, 0, 900*ms, tok(100*ms), 0, 0),
			w(200*ms, acquire(1, 0), "the next window", 0, 0, 800*ms, 800*ms, 0, 0, group),
			w(200*ms, acquire(1, sec), "booked there", 1, 0, 800*ms, 1800*ms, tok(sec), 0, 0),
			w(300*ms, inspect(), "", 1, 0, 700*ms, 1700*ms, nil, nil, 0, []int64{1, 700 * ms, 0, 1700, 0, 0, 2, 2, 0}),
			w(300*ms, cancel(2, tok(100*ms)), "a grant past", 0, 0, 0, 1700*ms, 0, 0, 0),
			w(300*ms, cancel(1, tok(sec)), "the latest window's", 1, 0, 0, 0, 0, 0, 0),
			w(300*ms, acquire(1, sec), "", 1, 0, 700*ms, 1700*ms, tok(sec), 0, 0),
			w(1500*ms, acquire(1, 0), "", 1, 0, 0, 500*ms, tok(1500*ms), 0, 0),
			w(1500*ms, inspect(), "", 1, 0, 500*ms, 500*ms, nil, nil, 0, []int64{0, 0, 0, 500, 0, 0, 2, 2, 0}),
		})
	})
}

// Two limits of the window: a booking waits for the window of every limit with room.
func TestFixedWindowTwoLimits(t *testing.T) {
	c := call{a: fixedWindow, limits: []limit{{2, 100 * ms, 0}, {3, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "fw2", []step{
			w(0, acquire(2, 0), "", 1, 0, 0, sec, tok(0), 0, 0),
			w(10*ms, acquire(1, 0), "the short window is full", 0, 0, 90*ms, 990*ms, 0, 0, group),
			w(100*ms, acquire(1, 0), "the next short window", 1, 0, 0, 900*ms, tok(100*ms), 0, 0),
			w(200*ms, acquire(1, 0), "the long window is full", 0, 0, 800*ms, 800*ms, 0, 0, group),
			w(200*ms, acquire(2, sec), "both have room at 1s", 1, 0, 800*ms, 1800*ms, tok(sec), 0, 0),
		})
	})
}
