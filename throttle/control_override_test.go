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
)

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
		ctx := context.Background()
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
				g, err := l.acquire(ctx, n, time.Duration(maxWait)*time.Microsecond, nil, 0, false)
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
				if got := g.result(); got != want {
					t.Fatalf("%v %v step %d %s under %v: got %+v, model %+v", c.alg, c.limits, i, what, m.limits, got, want)
				}
			case op < 8: // override: each limit's rate between a third and twice the code's
				over = nil
				for _, lim := range c.limits {
					r := max(1, lim.Rate/3+rng.Intn(2*lim.Rate))
					over = append(over, Limit{Rate: r, Period: lim.Period})
				}
				d := 1 + rng.Int63n(2*int64(longest/time.Microsecond))
				overEnd = now + d
				what = fmt.Sprintf("override %v for %dµs", over, d)
				if err := l.Override(ctx, time.Duration(d)*time.Microsecond, over...); err != nil {
					t.Fatal(err)
				}
			default:
				what = "clear"
				over = nil
				if err := l.ClearOverride(ctx); err != nil {
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

// The API: an override lowers and raises at once, ends by itself or with
// ClearOverride, survives a pause and a resume, and is checked.
func TestOverride(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("vendor", PerMinute(10))
		if r, err := l.AllowN(ctx, 5); err != nil || !r.Allowed {
			t.Fatal(r, err)
		}
		if err := l.Override(ctx, 0, PerMinute(3)); err != nil {
			t.Fatal(err)
		}
		if r, err := l.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("5 taken, override 3 per minute: got %+v %v, want denied", r, err)
		}
		if _, err := l.AllowN(ctx, 4); !errors.Is(err, ErrExceedsLimit) {
			t.Fatalf("AllowN(4) under an override of 3: got %v, want ErrExceedsLimit", err)
		}
		st, err := l.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if st.Override < 400*24*time.Hour || st.Limits[0].Limit.Rate != 3 || st.Limits[0].Capacity != 3 || st.Limits[0].Used != 5 {
			t.Fatalf("Inspect under the override: got %+v, want rate and capacity 3, 5 used, the override for 2^45µs", st)
		}
		// a pause and a resume keep the override
		if err := l.Pause(ctx, time.Minute); err != nil {
			t.Fatal(err)
		}
		if err := l.Resume(ctx); err != nil {
			t.Fatal(err)
		}
		if st, err := l.Inspect(ctx); err != nil || st.PausedFor != 0 || st.Override == 0 {
			t.Fatalf("after pause and resume: got %+v %v, want no pause and the override", st, err)
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
			t.Fatalf("15 taken, override cleared (10 per minute): got %+v %v, want denied", r, err)
		}
		if m := stateMeta(t, b.Client, l); m.Override != nil || m.PauseEnd != 0 {
			t.Fatalf("the meta after ClearOverride and Resume: %+v, want neither an override nor a pause", m)
		}
		// an override that ends by itself
		tl.at(2 * time.Minute)
		if err := l.Override(ctx, 50*ms, PerMinute(1)); err != nil {
			t.Fatal(err)
		}
		if r, err := l.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("under the 50ms override: got %+v %v, want allowed", r, err)
		}
		if r, err := l.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("under the 50ms override of 1: got %+v %v, want denied", r, err)
		}
		tl.at(2*time.Minute + 50*ms)
		if r, err := l.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("after the override ended: got %+v %v, want allowed (10 per minute)", r, err)
		}
		if st, err := l.Inspect(ctx); err != nil || st.Override != 0 || st.Limits[0].Limit != PerMinute(10) {
			t.Fatalf("after the override ended: got %+v %v, want no override", st, err)
		}
		// a token bucket's burst lowered: the tokens above it are gone at once
		tb := tl.limiter("tb", Limit{Rate: 10, Period: time.Second, Burst: 10}, WithAlgorithm(TokenBucket))
		if err := tb.Override(ctx, time.Minute, Limit{Rate: 1, Burst: 2}); err != nil {
			t.Fatal(err)
		}
		for i, want := range []bool{true, true, false} {
			if r, err := tb.Allow(ctx); err != nil || r.Allowed != want {
				t.Fatalf("token bucket, burst overridden to 2: Allow %d = %+v %v, want %v", i, r, err, want)
			}
		}
		want := LimitState{Limit: Limit{Rate: 1, Period: time.Second, Burst: 2}, Capacity: 2, Used: 2}
		if st, err := tb.Inspect(ctx); err != nil || st.Limits[0] != want || st.Limits[0].Available() != 0 {
			t.Fatalf("token bucket, Inspect under the override: %+v %v, want %+v, nothing available", st, err, want)
		}
		// checks
		if err := l.Override(ctx, 0, PerSecond(3)); !errors.Is(err, ErrInvalidLimit) {
			t.Fatalf("another period: got %v, want ErrInvalidLimit", err)
		}
		if err := l.Override(ctx, 0, PerMinute(1), PerMinute(1)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("two limits for one: got %v, want ErrInvalidArgument", err)
		}
		if err := l.Override(ctx, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("no limits: got %v, want ErrInvalidArgument", err)
		}
		if err := l.Override(ctx, -time.Second, PerMinute(1)); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("negative d: got %v, want ErrInvalidArgument", err)
		}
		if err := l.Override(ctx, 0, Limit{Rate: 0, Period: time.Minute}); !errors.Is(err, ErrInvalidLimit) {
			t.Fatalf("rate 0: got %v, want ErrInvalidLimit", err)
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
	parallel(t)
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
