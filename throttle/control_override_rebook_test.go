package throttle

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Tasks booked ahead at 10/s, then an override to 4/s: each task that comes back at its
// slot is re-placed (not kept), and the times the tasks finally run hold no window that
// starts at or after the override above what the new rate allows; a retry of the claim
// (a lost reply) finds the new booking and keeps it. Every algorithm, every backend.
func TestOverrideReplacesEarlierBookings(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("rebook", PerSecond(10), WithAlgorithm(alg), WithBuckets(10))
		ctx := context.Background()
		const tasks = 20
		next := make([]time.Duration, tasks) // when each task comes back; -1: it ran
		pending := 0
		for i := range tasks {
			r, kept := reserveFor(t, l, taskID(i), 1)
			if kept {
				t.Fatalf("task %d: kept a booking it never had", i)
			}
			next[i] = r.Delay()
			if next[i] == 0 { // it runs now, before the override
				next[i] = -1
			} else {
				pending++
			}
		}
		if next[tasks-1] < time.Second {
			t.Fatalf("last booking %v ahead, want the tasks booked over more than a second", next[tasks-1])
		}
		over := 100 * ms
		tl.at(over)
		if err := l.Override(ctx, time.Hour, Limit{Rate: 4}); err != nil {
			t.Fatal(err)
		}
		var ran []time.Duration // when each task ran, after the override
		replaced := 0
		for pending > 0 {
			i := -1 // the task due first comes back first (ties: in booking order)
			for j := range tasks {
				if next[j] >= 0 && (i < 0 || next[j] < next[i]) {
					i = j
				}
			}
			at := max(next[i], over)
			tl.at(at)
			r, kept := reserveFor(t, l, taskID(i), 1)
			if r.Delay() == 0 {
				ran = append(ran, at)
				next[i] = -1
				pending--
				continue
			}
			if kept {
				t.Fatalf("task %d back at its slot t0+%v after the override: kept a booking %v ahead", i, at, r.Delay())
			}
			replaced++
			// a retry of the same claim (its reply lost) finds the new booking
			r2, kept2 := reserveFor(t, l, taskID(i), 1)
			if !kept2 || r2.Delay() != r.Delay() {
				t.Fatalf("task %d: retry after re-placing: kept %v delay %v, want the booking %v ahead", i, kept2, r2.Delay(), r.Delay())
			}
			next[i] = at + r.Delay()
		}
		if replaced == 0 {
			t.Fatal("no booking was re-placed")
		}
		// the new limit: 4 per second; the token bucket (burst 4) allows burst + rate - 1
		// in any second, the fixed window counts aligned seconds
		most := 4
		if alg == TokenBucket {
			most = 7
		}
		slices.Sort(ran)
		t.Logf("%d of %d re-placed; ran at %v", replaced, len(ran), ran)
		for a, s := range ran {
			n := 0
			for _, u := range ran[a:] {
				if alg == FixedWindow && u/time.Second != s/time.Second {
					break
				}
				if u-s < time.Second {
					n++
				}
			}
			if n > most {
				t.Fatalf("%d tasks ran in the second from t0+%v after the override to 4/s, want at most %d: %v", n, s, most, ran)
			}
		}
	})
}

func taskID(i int) string { return "task-" + string(rune('a'+i)) }

// A booking made after the override is used as it is; one made before an override
// since cleared keeps its place; one made before a raise keeps its place; one denied
// when re-placed (beyond its maxWait) is gone, its permits given back.
func TestOverrideKeepsOtherBookings(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("keep", PerSecond(4), WithAlgorithm(alg), WithBuckets(10))
		ctx := context.Background()
		set := func(rate int) {
			t.Helper()
			if err := l.Override(ctx, time.Hour, Limit{Rate: rate}); err != nil {
				t.Fatal(err)
			}
		}
		clear := func() {
			t.Helper()
			if err := l.ClearOverride(ctx); err != nil {
				t.Fatal(err)
			}
		}
		ahead := func(id string) time.Duration {
			t.Helper()
			r, _ := reserveFor(t, l, id, 1)
			if r.Delay() <= 0 {
				t.Fatalf("%s: booked %v ahead, want a booking ahead", id, r.Delay())
			}
			return r.Delay()
		}
		back := func(id string, at, want time.Duration) {
			t.Helper()
			tl.at(at)
			r, kept := reserveFor(t, l, id, 1)
			if !kept || r.Delay() != want {
				t.Fatalf("%s back at t0+%v: kept %v delay %v, want its booking %v ahead", id, at, kept, r.Delay(), want)
			}
		}
		for range 4 {
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("Allow: %+v, %v", res, err)
			}
		}
		// made before an override that is cleared: kept
		d := ahead("before-clear")
		tl.at(10 * ms)
		set(2)
		clear()
		back("before-clear", 20*ms, d-20*ms)
		// made before a raise: kept
		d = ahead("before-raise")
		set(8)
		back("before-raise", 30*ms, d-10*ms) // booked at t0+20ms
		// made after a lowering override: kept
		set(2)
		tl.at(40 * ms)
		d = ahead("after-lower")
		back("after-lower", 50*ms, d-10*ms)
		// the meta holds the override's set time, t0+30ms, and its rate
		if o := stateMeta(t, b.Client, l).Override; o == nil || o.Set != redistest.Epoch.Add(30*ms).UnixMicro() ||
			len(o.Rates) != 1 || o.Rates[0].Rate != 2 {
			t.Fatalf("the meta's override %+v, want set at t0+30ms (µs), rate 2", o)
		}
		// made before a lowering override, re-placed beyond its maxWait: denied, the
		// record gone
		clear()
		tl.at(time.Second) // a fresh second for each algorithm
		for range 4 {
			if _, err := l.Allow(ctx); err != nil {
				t.Fatal(err)
			}
		}
		ahead("denied")
		tl.at(time.Second + 10*ms)
		set(1)
		dctx, _ := taskCtx(ctx, "denied", 0)
		r, err := l.Reserve(dctx, 1, 0)
		if err != nil || r.OK() {
			t.Fatalf("re-placed beyond maxWait 0: %v, %v, want not booked", r, err)
		}
		record := l.bookingKey("denied")
		if n, err := b.Client.Exists(ctx, record).Result(); err != nil || n != 0 {
			t.Fatalf("record %s after the denial: %d, %v, want gone", record, n, err)
		}
	})
}
