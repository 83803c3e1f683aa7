package lua

import (
	"fmt"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// step is one request at a time of a test's timeline (µs after Epoch) and the reply it
// must get: want's fields are compared where set (want6 marks which); a token or an
// absolute time is written as an offset after Epoch (tok).
type step struct {
	at    int64
	r     req
	want  [6]int64
	check [6]bool
	extra []int64 // Inspect's extra, pttl (index 3) not compared on real servers
	err   string
	note  string
}

// w builds a step's expected reply: nil for a field not compared.
func w(at int64, r req, note string, fields ...any) step {
	s := step{at: at, r: r, note: note}
	for i, f := range fields {
		switch v := f.(type) {
		case nil:
		case int:
			s.want[i], s.check[i] = int64(v), true
		case int64:
			s.want[i], s.check[i] = v, true
		case []int64:
			s.extra = v
		case string:
			s.err = v
		}
	}
	return s
}

// tok is Epoch + us, a token.
func tok(us int64) int64 { return redistest.Epoch.UnixMicro() + us }

func runSteps(t *testing.T, b *redistest.Backend, c limiterCall, name string, steps []step) {
	t.Helper()
	tag := tagOf(b, name)
	clk := newClock(t, b, tag)
	for i, s := range steps {
		clk.set(t, redistest.Epoch.Add(time.Duration(s.at)*time.Microsecond))
		got := c.one(t, b, tag, s.r)
		where := fmt.Sprintf("%s step %d (%s) at +%dµs, %+v", name, i, s.note, s.at, s.r)
		if s.err != "" {
			if len(got.err) < len(s.err) || got.err[:len(s.err)] != s.err {
				t.Fatalf("%s: %v, want error %q", where, got, s.err)
			}
			continue
		}
		if got.err != "" {
			t.Fatalf("%s: %v", where, got)
		}
		for j := range got.v {
			if s.check[j] && got.v[j] != s.want[j] {
				t.Fatalf("%s: %v, want %v (field %d)", where, got.v, s.want, j+1)
			}
		}
		if s.extra != nil {
			e := append([]int64(nil), got.extra...)
			if b.Real() && len(e) > 3 {
				e[3] = s.extra[3] // the fake clock stretches TTLs
			}
			if fmt.Sprint(e) != fmt.Sprint(s.extra) {
				t.Fatalf("%s: extra %v, want %v", where, got.extra, s.extra)
			}
		}
	}
}

func acquire(n, maxWait int64) req { return req{op: opAcquire, n: n, x: maxWait} }
func cancel(n, token int64) req    { return req{op: opCancel, n: n, x: token} }
func inspect() req                 { return req{op: opInspect, n: 1} }
func pauseFor(us int64) req        { return req{op: opPause, x: us} }

// Every limiter op on the permit log (SlidingWindow): grants now, denials with the exact
// wait, bookings ahead in order, a cancel of exactly its booking, n = 0, Inspect.
func TestSlidingWindowOps(t *testing.T) {
	c := limiterCall{a: slidingWindow, limits: []limit{{5, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "sw", []step{
			w(0, inspect(), "empty", 1, 5, 0, 0, nil, nil, []int64{0, 0, 0, -2, 0, 5, 5, 5}),
			w(0, acquire(3, 0), "grant now", 1, 2, 0, sec, tok(0), 0),
			w(0, acquire(3, 0), "permit 1 must leave", 0, 2, sec, sec, 0, 0),
			w(0, acquire(0, 0), "n = 0 takes nothing", 1, 2, 0, sec, 0, 0),
			w(100*ms, acquire(3, sec), "booked ahead", 1, 0, 900*ms, 1900*ms, tok(sec), 0),
			w(200*ms, acquire(1, 0), "after the booking (FIFO)", 0, 0, 800*ms, 1800*ms, 0, 0),
			w(200*ms, inspect(), "a booking waits", 1, 0, 800*ms, 1800*ms, nil, nil,
				[]int64{3, 800 * ms, 0, 1800, 0, 5, 5, -1}),
			w(200*ms, cancel(3, tok(sec)), "its permits go back", 1, 0, 0, 800*ms, 0, 0),
			w(200*ms, cancel(3, tok(sec)), "once", 0, 0, 0, 800*ms, 0, 0),
			w(300*ms, cancel(1, tok(0)), "a grant past stays", 0, 0, 0, 700*ms, 0, 0),
			w(300*ms, acquire(2, 0), "room again", 1, 0, 0, sec, tok(300*ms), 0),
			w(1100*ms, acquire(3, 0), "the first grant left", 1, 0, 0, sec, tok(1100*ms), 0),
			w(5*sec, inspect(), "all left", 1, 5, 0, 0, nil, nil, []int64{0, 0, 0, -2, 0, 5, 5, 5}),
		})
	})
}

// Two limits: the longest wait of the two; remaining the least.
func TestSlidingWindowTwoLimits(t *testing.T) {
	c := limiterCall{a: slidingWindow, limits: []limit{{2, 100 * ms, 0}, {3, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "sw2", []step{
			w(0, acquire(2, 0), "", 1, 0, 0, sec, tok(0), 0),
			w(10*ms, acquire(1, 0), "the short limit waits 90ms", 0, 0, 90*ms, 990*ms, 0, 0),
			w(100*ms, acquire(1, 0), "", 1, 0, 0, sec, tok(100*ms), 0),
			w(200*ms, acquire(1, 0), "the long limit waits until 1s", 0, 0, 800*ms, 900*ms, 0, 0),
			w(200*ms, acquire(1, sec), "", 1, 0, 800*ms, 1800*ms, tok(sec), 0),
		})
	})
}

// The sliding counter records a grant at the end of its sub-bucket (100ms here): grants
// in one sub-bucket share an entry, a permit leaves one period after its sub-bucket ends,
// and a cancel finds its booking by its sub-bucket.
func TestSlidingCounterOps(t *testing.T) {
	c := limiterCall{a: algo{"log", "sc", []any{100 * ms}, false}, limits: []limit{{2, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "sc", []step{
			w(10*ms, acquire(1, 0), "", 1, 1, 0, 1090*ms, tok(10*ms), 0),
			w(20*ms, acquire(1, 0), "same sub-bucket", 1, 0, 0, 1080*ms, tok(20*ms), 0),
			w(30*ms, acquire(1, 0), "leaves at 1.1s", 0, 0, 1070*ms, 1070*ms, 0, 0),
			w(30*ms, acquire(1, 2*sec), "booked at 1.1s", 1, 0, 1070*ms, 2170*ms, tok(1100*ms), 0),
			w(40*ms, inspect(), "", 1, 0, 1060*ms, 2160*ms, nil, nil, []int64{1, 1060 * ms, 0, 2160, 0, 2, 2, -1}),
			w(40*ms, cancel(1, tok(1150*ms)), "its sub-bucket", 1, 0, 0, 1060*ms, 0, 0),
			w(40*ms, acquire(1, 0), "", 0, 0, 1060*ms, 1060*ms, 0, 0),
		})
	})
}

// The fixed window: grants count in the window holding them; bookings go to the latest
// grant's window or a later one; a cancel gives back only in the latest window.
func TestFixedWindowOps(t *testing.T) {
	c := limiterCall{a: fixedWindow, limits: []limit{{2, sec, 0}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "fw", []step{
			w(100*ms, acquire(2, 0), "", 1, 0, 0, 900*ms, tok(100*ms), 0),
			w(200*ms, acquire(1, 0), "the next window", 0, 0, 800*ms, 800*ms, 0, 0),
			w(200*ms, acquire(1, sec), "booked there", 1, 0, 800*ms, 1800*ms, tok(sec), 0),
			w(300*ms, inspect(), "", 1, 0, 700*ms, 1700*ms, nil, nil, []int64{1, 700 * ms, 0, 1700, 0, 2, 2, 0}),
			w(300*ms, cancel(2, tok(100*ms)), "a grant past", 0, 0, 0, 1700*ms, 0, 0),
			w(300*ms, cancel(1, tok(sec)), "the latest window's", 1, 0, 0, 0, 0, 0),
			w(300*ms, acquire(1, sec), "", 1, 0, 700*ms, 1700*ms, tok(sec), 0),
			w(1500*ms, acquire(1, 0), "", 1, 0, 0, 500*ms, tok(1500*ms), 0),
			w(1500*ms, inspect(), "", 1, 0, 500*ms, 500*ms, nil, nil, []int64{0, 0, 0, 500, 0, 2, 2, 0}),
		})
	})
}

// The token bucket's replies: remaining and reset, the pause delaying a booking that then
// spends the refill its burst would have cut, Inspect.
func TestTokenBucketOps(t *testing.T) {
	c := limiterCall{a: tokenBucket, limits: []limit{{10, sec, 4}}}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		runSteps(t, b, c, "tb", []step{
			w(0, inspect(), "full", 1, 4, 0, 0, nil, nil, []int64{0, 0, 0, -2, 0, 10, 4, 4}),
			w(0, acquire(3, 0), "", 1, 1, 0, 300*ms, tok(0), 0),
			w(0, acquire(3, 0), "two short", 0, 1, 200*ms, 300*ms, 0, 0),
			w(0, acquire(3, sec), "", 1, 0, 200*ms, 600*ms, tok(200*ms), 0),
			w(100*ms, inspect(), "owes 1", 1, 0, 200*ms, 500*ms, nil, nil, []int64{1, 100 * ms, 0, 500, 0, 10, 4, -1}),
			w(100*ms, cancel(3, tok(200*ms)), "the latest", 1, 0, 0, 200*ms, 0, 0),
			w(100*ms, req{op: opPause, x: 900 * ms}, "", 1, 0, 900*ms, 0, 0, 0),
			w(100*ms, acquire(4, 2*sec), "at the pause's end", 1, 0, 900*ms, sec+400*ms-100*ms, tok(sec), 0),
		})
	})
}
