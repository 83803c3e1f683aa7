package throttle

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"slices"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
)

var fakeControl = redistest.FakeClockScript(lua.Control.Source())

// With overrides set and cleared at random moments, mid-window, every answer and every
// Inspect matches the reference model enforcing the overridden rates from the change
// on (the log and window algorithms; the model counts every grant against the rates
// in force at each call), and a caller asking for more than an overridden limit can
// grant gets ErrExceedsLimit.
func TestOverrideMatchesReferenceModel(t *testing.T) {
	cases := []modelCase{
		{SlidingWindow, []Limit{PerSecond(6)}},
		{SlidingWindow, []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 10, Period: time.Second}}},
		{SlidingCounter, []Limit{{Rate: 4, Period: 250 * ms}, {Rate: 9, Period: time.Second}}},
		{FixedWindow, []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 8, Period: time.Second}}},
	}
	eachModelCase(t, cases, "override", 2000, 200, 80, func(t *testing.T, tl *timeline, l *Limiter, c modelCase, rng *rand.Rand, steps int) {
		b := tl.b
		ctx := context.Background()
		control := tl.script(lua.Control, fakeControl)
		m := newModel(c.alg, c.limits, 4)
		var over []Limit // the override's limits, nil when none
		var overEnd int64
		effective := func(now int64) []Limit {
			if over == nil || overEnd <= now {
				return c.limits
			}
			return over
		}
		longest := time.Duration(maxPeriodOf(c.limits)) * time.Microsecond
		var at time.Duration
		for i := 0; i < steps; i++ {
			at += time.Duration(rng.Int63n(int64(longest / 4)))
			tl.at(at)
			now := tl.now.UnixMicro()
			m.limits = effective(now)
			what := ""
			switch op := rng.Intn(10); {
			case op < 6: // acquire, maybe booking ahead
				n := rng.Intn(l.maxN + 1)
				var maxWait int64
				if op >= 4 {
					maxWait = rng.Int63n(2 * int64(longest/time.Microsecond))
				}
				what = fmt.Sprintf("acquire(%d, %dµs)", n, maxWait)
				r, err := l.call(ctx, opAcquire, n, maxWait)
				most := maxRate
				for _, lim := range m.limits {
					most = min(most, lim.Rate)
				}
				if n > most {
					if !errors.Is(err, ErrExceedsLimit) {
						t.Fatalf("%v step %d %s above the override %v: %v, want ErrExceedsLimit", c.alg, i, what, m.limits, err)
					}
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				want, _ := m.allow(now, n, maxWait)
				if got := r.result(); got != want {
					t.Fatalf("%v %v step %d %s under %v: got %+v, model %+v", c.alg, c.limits, i, what, m.limits, got, want)
				}
			case op < 8: // override: each limit's rate between a third and twice the code's
				over = nil
				args := []any{0, 0, len(c.limits)}
				for _, lim := range c.limits {
					r := max(1, lim.Rate/3+rng.Intn(2*lim.Rate))
					over = append(over, Limit{Rate: r, Period: lim.Period})
					args = append(args, r, 0)
				}
				d := 1 + rng.Int63n(2*int64(longest/time.Microsecond))
				args[1] = d
				overEnd = now + d
				what = fmt.Sprintf("override %v for %dµs", over, d)
				if err := control.Run(ctx, b.Client, l.keys[1:2], args...).Err(); err != nil {
					t.Fatal(err)
				}
			default:
				what = "clear"
				over = nil
				if err := control.Run(ctx, b.Client, l.keys[1:2], 1, 0, 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			at += time.Duration(rng.Int63n(int64(longest / 3)))
			tl.at(at)
			now = tl.now.UnixMicro()
			m.limits = effective(now)
			want := m.state(now)
			if over != nil && overEnd > now {
				want.Override = micros(overEnd - now)
			}
			wantInspected(t, l, want, "%v %v step %d after %s, at t0+%v", c.alg, c.limits, i, what, at)
		}
	})
}

// The API on the real clock: an override lowers and raises at once, ends by itself
// or with ClearOverride, survives a pause and a resume, and is checked.
func TestOverride(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		l, err := New(b.Client, "vendor", PerMinute(10), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if r, err := l.AllowN(ctx, 5); err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
		if err := l.Override(ctx, 0, PerMinute(3)); err != nil {
			t.Fatal(err)
		}
		if r, err := l.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("5 taken, override 3 per minute: %+v %v, want denied", r, err)
		}
		if _, err := l.AllowN(ctx, 4); !errors.Is(err, ErrExceedsLimit) {
			t.Fatalf("AllowN(4) under an override of 3: %v, want ErrExceedsLimit", err)
		}
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Override < 400*24*time.Hour || st.Limits[0].Limit.Rate != 3 || st.Limits[0].Capacity != 3 || st.Limits[0].Used != 5 {
			t.Fatalf("Inspect under the override: %+v", st)
		}
		// a pause and a resume keep the override
		if err := l.Pause(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := l.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Inspect(ctx); err != nil || st.PausedFor != 0 || st.Override == 0 {
			t.Fatalf("after pause and resume: %+v %v, want no pause and the override", st, err)
		}
		// raising takes effect at once
		if err := l.Override(ctx, 0, PerMinute(20)); err != nil {
			t.Fatal(err)
		}
		if r, err := l.AllowN(ctx, 10); err != nil || !r.Allowed || r.Remaining != 5 {
			t.Fatalf("5 taken, override 20: AllowN(10) = %+v %v, want granted, 5 remaining", r, err)
		}
		if err := l.ClearOverride(ctx); err != nil {
			t.Fatal(err)
		}
		if r, err := l.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("15 taken, override cleared (10 per minute): %+v %v, want denied", r, err)
		}
		if n := b.Client.Exists(ctx, l.keys[1]).Val(); n != 0 {
			t.Fatalf("the control key is left with nothing in it")
		}
		// an override that ends by itself (50ms; checked 100ms later)
		if err := l.Override(ctx, 50*time.Millisecond, PerMinute(100)); err != nil {
			t.Fatal(err)
		}
		if r, err := l.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("under the 50ms override: %+v %v", r, err)
		}
		time.Sleep(100 * time.Millisecond)
		if r, err := l.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("after the override ended: %+v %v, want denied", r, err)
		}
		if st, err := l.Inspect(ctx); err != nil || st.Override != 0 || st.Limits[0].Limit != PerMinute(10) {
			t.Fatalf("after the override ended: %+v %v", st, err)
		}
		// a token bucket's burst lowered: the tokens above it are gone at once
		tb, err := New(b.Client, "tb", Limit{Rate: 10, Period: time.Second, Burst: 10}, WithAlgorithm(TokenBucket), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := tb.Override(ctx, time.Minute, Limit{Rate: 1, Burst: 2}); err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, true, false} {
			if r, err := tb.Allow(ctx); err != nil || r.Allowed != want {
				t.Fatalf("token bucket, burst overridden to 2: Allow %d = %+v %v, want %v", i, r, err, want)
			}
		}
		// checks
		if err := l.Override(ctx, 0, PerSecond(3)); !errors.Is(err, ErrInvalidLimit) {
			t.Fatalf("another period: %v, want ErrInvalidLimit", err)
		}
		if err := l.Override(ctx, 0, PerMinute(1), PerMinute(1)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("two limits for one: %v, want ErrInvalidArgument", err)
		}
		if err := l.Override(ctx, -time.Second, PerMinute(1)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("negative d: %v, want ErrInvalidArgument", err)
		}
		if err := l.Override(ctx, 0, Limit{Rate: 0, Period: time.Minute}); !errors.Is(err, ErrInvalidLimit) {
			t.Fatalf("rate 0: %v, want ErrInvalidLimit", err)
		}
	})
}

// A fleet (four limiters on one key, as four processes, each looping on Wait) is
// lowered mid-run from 20 to 5 per 300ms by an override set from a fifth: every grant
// admitted after the override returned counts against 5, so no 300ms window holds
// more than 5 of them, and none holds more than 5 grants at all once the bookings
// made before it have taken effect. Grant times are the server's, from the script
// replies, so the machine's load changes how many grants there are, not the check.
func TestFleetOverrideMidRun(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		grants := redistest.RecordGrants(b.Client)
		const period = 300 * time.Millisecond
		limit := Limit{Rate: 20, Period: period}
		ctl, err := New(b.Client, "fleet-override", limit, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		stop := make(chan struct{})
		done := make(chan error, 4)
		for w := 0; w < 4; w++ {
			l, err := New(b.Client, "fleet-override", limit, WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				for {
					select {
					case <-stop:
						done <- nil
						return
					default:
					}
					if err := l.Wait(ctx); err != nil {
						done <- err
						return
					}
				}
			}()
		}
		time.Sleep(2 * period)
		if err := ctl.Override(ctx, 0, Limit{Rate: 5}); err != nil {
			t.Fatal(err)
		}
		changed := time.Now() // calls sent after this were decided under the override
		time.Sleep(4 * period)
		close(stop)
		for w := 0; w < 4; w++ {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
		var after, all []time.Time
		var lastBefore time.Time // when the last grant decided before the change takes effect
		for _, g := range grants.List() {
			all = append(all, g.At)
			if g.Sent.After(changed) {
				after = append(after, g.At)
			} else if g.At.After(lastBefore) {
				lastBefore = g.At
			}
		}
		slices.SortFunc(after, func(a, b time.Time) int { return a.Compare(b) })
		if most := redistest.MaxTimesInWindow(after, period); most > 5 || len(after) == 0 {
			t.Fatalf("%d grants decided under the override, %d in one window of %v: want 1..5", len(after), most, period)
		}
		var settled []time.Time
		for _, at := range all {
			if at.After(lastBefore) {
				settled = append(settled, at)
			}
		}
		slices.SortFunc(settled, func(a, b time.Time) int { return a.Compare(b) })
		most := redistest.MaxTimesInWindow(settled, period)
		if most > 5 {
			t.Fatalf("after the last earlier booking: %d grants in one window of %v, want <= 5", most, period)
		}
		redistest.Figure(t, "fleet override mid-run (%s): %d grants in all, %d decided under the override, at most %d of them in any %v (override 5)",
			b.Kind, len(all), len(after), redistest.MaxTimesInWindow(after, period), period)
	})
}
