package lua

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Bookings by task, on every limiter script: a booking ahead is recorded; the task's next
// acquire finds it (granted 2, a new stamp); a give-back with a stale stamp does nothing,
// with the current one gives the permits back and deletes the record; a record past its
// token is used only within late µs; another n, a pause after the token, or an override
// set since that lowers the limits make the acquire book anew.
func TestBookings(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, a := range allAlgos {
			tag := tagOf(b, "bk"+a.suffix)
			clk := newClock(t, b, tag)
			c := limiterCall{a: a, limits: []limit{{1, sec, 1}}, extras: []any{1, 1}}
			record := func() string {
				v, _ := b.Client.Get(ctx, tag+":bk:task").Result()
				return v
			}
			book := func(n, maxWait, late int64) res {
				return c.one(t, b, tag, req{op: opAcquire, n: n, x: maxWait, y: late, booking: "task"})
			}
			giveBack := func(n, stamp int64) res {
				return c.one(t, b, tag, req{op: opCancel, n: n, x: stamp, booking: "task"})
			}
			fail := func(what string, got any) {
				t.Helper()
				t.Fatalf("%s: %s: %v (record %q)", a.suffix, what, got, record())
			}
			// a grant that takes effect now is not recorded
			if got := book(1, 0, 0); got.v[0] != 1 || got.v[5] != 0 || record() != "" {
				fail("a grant now", got)
			}
			t0 := clk.us()
			// booked ahead: recorded "token n stamp", a second past the token
			got := book(1, 10*sec, 0)
			token, stamp := got.v[4], got.v[5]
			if got.v[0] != 1 || token <= t0 || stamp != t0 || record() != fmt.Sprintf("%d 1 %d", token, t0) {
				fail("a booking ahead", got)
			}
			if ttl := b.Client.PTTL(ctx, tag+":bk:task").Val(); !b.Real() && ttl != time.Duration(token-t0+sec)*time.Microsecond {
				fail("the record's TTL", ttl)
			}
			// found again: kept, with a new stamp
			clk.add(t, time.Millisecond)
			got = book(1, 0, 0)
			if got.v[0] != 2 || got.v[4] != token || got.v[2] != token-clk.us() || got.v[5] != clk.us() {
				fail("the booking found", got)
			}
			newStamp := got.v[5]
			if got := giveBack(1, stamp); got.v != [6]int64{0, 0, 0, got.v[3], 0, 0} || record() == "" {
				fail("a stale give-back", got)
			}
			if got := giveBack(1, newStamp); got.v[0] != 1 || got.v[4] != token || record() != "" {
				fail("the give-back", got)
			}
			// the slot is free again
			if got := book(1, 10*sec, 0); got.v[0] != 1 || got.v[4] != token {
				fail("after the give-back", got)
			}
			// booked ahead, come back late
			got = book(1, 10*sec, 0)
			token = got.v[4]
			clk.set(t, time.UnixMicro(token+100*ms))
			if got := book(1, 10*sec, 50*ms); got.v[0] == 2 {
				fail("100ms late, 50ms allowed", got)
			}
			got = book(1, 10*sec, 0)
			token = got.v[4]
			clk.set(t, time.UnixMicro(token+100*ms))
			if got := book(1, 0, 200*ms); got.v[0] != 2 || got.v[2] != 0 || got.v[4] != token {
				fail("100ms late, 200ms allowed", got)
			}
			// another n books anew
			if a.burst {
				c.limits[0].burst = 2
			} else {
				c.limits[0].rate = 2
			}
			clk.add(t, 10*time.Second)
			c.one(t, b, tag, acquire(2, 10*sec))
			token = book(1, 10*sec, 0).v[4]
			if got := book(2, 10*sec, 0); got.v[0] != 1 || got.v[4] == token {
				fail("another n", got)
			}
			// a pause after the token
			clk.add(t, 10*time.Second)
			c.one(t, b, tag, acquire(2, 10*sec))
			token = book(2, 10*sec, 0).v[4]
			c.one(t, b, tag, pauseFor(token-clk.us()+sec))
			if got := book(2, 20*sec, 0); got.v[0] != 1 || got.v[4] < token+sec {
				fail("a pause overtook the booking", got)
			}
			c.one(t, b, tag, req{op: opResume})
			// an override set since that lowers the limits: given back, booked anew
			clk.add(t, 30*time.Second)
			c.one(t, b, tag, acquire(2, 10*sec))
			got = book(1, 10*sec, 0)
			stamp = got.v[5]
			lower := func() int64 {
				clk.add(t, time.Millisecond)
				c.extras = []any{1, 1} // the bucket: its burst 2 lowered to 1; the others: the rate 2 to 1
				c.one(t, b, tag, req{op: opOverride, n: 1, x: 100 * sec, y: c.extraIndex(1)})
				set := clk.us()
				clk.add(t, time.Millisecond)
				return set
			}
			set := lower()
			got = book(1, 20*sec, 0)
			if got.v[0] != 1 || got.v[5] <= set || got.v[5] <= stamp {
				fail("re-placed under a lower override", got)
			}
			if got := book(1, 20*sec, 0); got.v[0] != 2 {
				fail("the re-placed booking found", got)
			}
			// re-placed and denied: the record goes (its permits were given back)
			lower()
			if got := book(1, 0, 0); got.v[0] != 0 || record() != "" {
				fail("re-placed, denied", got)
			}
			c.one(t, b, tag, req{op: opClear})
		}
	})
}

// Requests of one call on one booking key see each other: the second finds what the
// first booked; a give-back in the same call deletes it.
func TestBookingsInOneCall(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, a := range allAlgos {
			tag := tagOf(b, "bk1"+a.suffix)
			newClock(t, b, tag)
			c := limiterCall{a: a, limits: []limit{{1, sec, 1}}}
			bk := func(op, n, x int64) req { return req{op: op, n: n, x: x, booking: "t"} }
			out := c.run(t, b, tag, acquire(1, 0), bk(opAcquire, 1, 5*sec), bk(opAcquire, 1, 0))
			if out[1].v[0] != 1 || out[2].v[0] != 2 || out[2].v[4] != out[1].v[4] || out[2].v[5] != out[1].v[5]+1 {
				t.Fatalf("%s: %v", a.suffix, out)
			}
			out = c.run(t, b, tag, bk(opCancel, 1, out[2].v[5]), bk(opAcquire, 1, 0))
			if out[0].v[0] != 1 || out[1].v[0] != 0 {
				t.Fatalf("%s: give-back, then a booking with max wait 0: %v", a.suffix, out)
			}
			if n := b.Client.Exists(context.Background(), tag+":bk:t").Val(); n != 0 {
				t.Fatalf("%s: the record is still there", a.suffix)
			}
		}
	})
}
