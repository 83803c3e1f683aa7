package lua

import (
	"context"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Every limiter op on the permit log (SlidingWindow): grants now, denials with the exact
// wait, bookings ahead in order, a cancel of exactly its booking, n = 0, Inspect.
func TestSlidingWindowOps(t *testing.T) {
	c := call{a: slidingWindow, limits: []limit{{5, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "sw", []step{
			w(0, inspect(), "empty", 1, 5, 0, 0, nil, nil, 0, []int64{0, 0, 0, -2, 0, 0, 5, 5, 5}),
			w(0, acquire(3, 0), "grant now", 1, 2, 0, sec, tok(0), 0, 0),
			w(0, acquire(3, 0), "permit 1 must leave", 0, 2, sec, sec, 0, 0, group),
			w(0, acquire(0, 0), "n = 0 takes nothing", 1, 2, 0, sec, 0, 0, 0),
			w(100*ms, acquire(3, sec), "booked ahead", 1, 0, 900*ms, 1900*ms, tok(sec), 0, 0),
			w(200*ms, acquire(1, 0), "after the booking (FIFO)", 0, 0, 800*ms, 1800*ms, 0, 0, group),
			w(200*ms, inspect(), "a booking waits", 1, 0, 800*ms, 1800*ms, nil, nil, 0,
				[]int64{3, 800 * ms, 0, 1800, 0, 0, 5, 5, -1}),
			w(200*ms, cancel(3, tok(sec)), "its permits go back", 1, 0, 0, 800*ms, 0, 0, 0),
			w(200*ms, cancel(3, tok(sec)), "once", 0, 0, 0, 800*ms, 0, 0, 0),
			w(300*ms, cancel(1, tok(0)), "a grant past stays", 0, 0, 0, 700*ms, 0, 0, 0),
			w(300*ms, acquire(2, 0), "room again", 1, 0, 0, sec, tok(300*ms), 0, 0),
			w(1100*ms, acquire(3, 0), "the first grant left", 1, 0, 0, sec, tok(1100*ms), 0, 0),
			w(5*sec, inspect(), "all left", 1, 5, 0, 0, nil, nil, 0, []int64{0, 0, 0, -2, 0, 0, 5, 5, 5}),
		})
	})
}

// Two limits: the longest wait of the two; remaining the least.
func TestSlidingWindowTwoLimits(t *testing.T) {
	c := call{a: slidingWindow, limits: []limit{{2, 100 * ms, 0}, {3, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "sw2", []step{
			w(0, acquire(2, 0), "", 1, 0, 0, sec, tok(0), 0, 0),
			w(10*ms, acquire(1, 0), "the short limit waits 90ms", 0, 0, 90*ms, 990*ms, 0, 0, group),
			w(100*ms, acquire(1, 0), "", 1, 0, 0, sec, tok(100*ms), 0, 0),
			w(200*ms, acquire(1, 0), "the long limit waits until 1s", 0, 0, 800*ms, 900*ms, 0, 0, group),
			w(200*ms, acquire(1, sec), "", 1, 0, 800*ms, 1800*ms, tok(sec), 0, 0),
		})
	})
}

// The sliding counter records a grant at the end of its sub-bucket (100ms here: 10 of
// the 1s period): grants in one sub-bucket share an entry, a permit leaves one period
// after its sub-bucket ends, and a cancel finds its booking by its sub-bucket.
func TestSlidingCounterOps(t *testing.T) {
	c := call{a: algo{"log", "sc", 10, false}, limits: []limit{{2, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "sc", []step{
			w(10*ms, acquire(1, 0), "", 1, 1, 0, 1090*ms, tok(10*ms), 0, 0),
			w(20*ms, acquire(1, 0), "same sub-bucket", 1, 0, 0, 1080*ms, tok(20*ms), 0, 0),
			w(30*ms, acquire(1, 0), "leaves at 1.1s", 0, 0, 1070*ms, 1070*ms, 0, 0, group),
			w(30*ms, acquire(1, 2*sec), "booked at 1.1s", 1, 0, 1070*ms, 2170*ms, tok(1100*ms), 0, 0),
			w(40*ms, inspect(), "", 1, 0, 1060*ms, 2160*ms, nil, nil, 0, []int64{1, 1060 * ms, 0, 2160, 0, 0, 2, 2, -1}),
			w(40*ms, cancel(1, tok(1150*ms)), "its sub-bucket", 1, 0, 0, 1060*ms, 0, 0, 0),
			w(40*ms, acquire(1, 0), "", 0, 0, 1060*ms, 1060*ms, 0, 0, group),
		})
	})
}

// A log whose entries a call's cancels all give back starts anew (base 0) at that call's
// next grant, as the call after the cancels finds it: a lone cancel leaves the meta alone,
// which reads as an empty log. The bookings lie behind a pause, so that the log holds two
// entries that have left the window (trimmed: its base above 0) and none in it.
func TestLogEmptiedByACancel(t *testing.T) {
	c := call{a: slidingWindow, limits: []limit{{5, 100 * ms, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tagA, tagB := tagOf(b, "emptiedA"), tagOf(b, "emptiedB")
		clk := newClock(t, b, tagA, tagB)
		for _, tag := range []string{tagA, tagB} {
			c.run(t, b, tag, acquire(1, 0))
		}
		clk.add(t, 10*time.Millisecond)
		for _, tag := range []string{tagA, tagB} {
			c.run(t, b, tag, acquire(1, 0), pause(sec), acquire(1, 2*sec))
		}
		clk.add(t, 190*time.Millisecond) // the first two entries have left the window
		for _, tag := range []string{tagA, tagB} {
			c.run(t, b, tag, acquire(1, 2*sec))
		}
		if base := b.Client.LIndex(context.Background(), tagA+":"+keys.State, 1).Val(); base == "0" {
			t.Fatalf("the log's base is 0 before the cancel: the entries were not trimmed")
		}
		clk.add(t, 100*time.Millisecond)
		reqs := []*protocol.Request{cancel(2, tok(1010*ms)), acquire(1, 2*sec), inspect()}
		lone := c.loneThenOne(t, b, tagA, tagB, reqs...)
		if lone[0].v[0] != 1 {
			t.Fatalf("cancel of the two bookings: %v, want freed", lone[0])
		}
		sameUnder(t, b, tagA, tagB, []string{keys.State}, "after "+texts(reqs))
	})
}
