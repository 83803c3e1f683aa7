package throttle

import (
	"context"
	"math/rand"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Every log and window algorithm answers like the reference model on random
// timelines (one to three limits, random n), and the grants never exceed a limit in
// any window, checked from the times they take effect.
func TestMatchesReferenceModel(t *testing.T) {
	noteMissingServers(t, "the property was checked on miniredis only", redistest.Standalone, redistest.Cluster)
	cases := []modelCase{
		{SlidingWindow, []Limit{PerSecond(5)}},
		{SlidingWindow, []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 10, Period: time.Second}}},
		{SlidingWindow, []Limit{{Rate: 7, Period: 300 * ms}, {Rate: 12, Period: 700 * ms}, {Rate: 20, Period: 2 * time.Second}}},
		{SlidingCounter, []Limit{PerSecond(5)}},
		{SlidingCounter, []Limit{{Rate: 4, Period: 250 * ms}, {Rate: 9, Period: time.Second}}},
		{FixedWindow, []Limit{PerSecond(5)}},
		{FixedWindow, []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 8, Period: time.Second}}},
	}
	eachModelCase(t, cases, "model", 0, 200, 80, func(t *testing.T, tl *timeline, l *Limiter, c modelCase, rng *rand.Rand, steps int) {
		m := newModel(c.alg, c.limits, 4)
		minRate := l.maxN
		var at time.Duration
		for i := 0; i < steps; i++ {
			at += time.Duration(rng.Intn(120_000)) * time.Microsecond
			n := rng.Intn(minRate + 1)
			tl.at(at)
			want, _ := m.allow(tl.now.UnixMicro(), n, 0)
			got, err := l.AllowN(context.Background(), n)
			if err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Fatalf("%v %v step %d (t0+%v, n=%d): got %+v, want %+v", c.alg, c.limits, i, at, n, got, want)
			}
		}
		for _, lim := range c.limits {
			if c.alg == FixedWindow {
				continue // at most Rate per aligned window is what it promises; checked by the model
			}
			if most := maxInWindow(m.grants, lim.periodMicros()); most > lim.Rate {
				t.Fatalf("%v: %d grants in one window of %v", c.alg, most, lim)
			}
		}
	})
}
