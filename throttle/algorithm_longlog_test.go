package throttle

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Logs much longer than the part a script reads in one go (lua/log.lua reads the
// head, base and 4 entries, and the last entry, and searches the rest with LRANGE):
// many small grants, bookings far ahead and expiring entries, answered like the
// reference model, reads included.
func TestLongLogMatchesReferenceModel(t *testing.T) {
	noteMissingServers(t, "the property was checked on miniredis only", redistest.Standalone, redistest.Cluster)
	type tc struct {
		alg     Algorithm
		limits  []Limit
		buckets int
	}
	cases := []tc{
		{SlidingWindow, []Limit{{Rate: 40, Period: 400 * ms}}, 0},
		{SlidingWindow, []Limit{{Rate: 25, Period: 300 * ms}, {Rate: 60, Period: time.Second}}, 0},
		{SlidingCounter, []Limit{{Rate: 40, Period: 400 * ms}}, 40},
		{SlidingCounter, []Limit{{Rate: 30, Period: 250 * ms}, {Rate: 70, Period: time.Second}}, 25},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		steps := 400
		if b.Kind != redistest.Standalone { // as eachModelCase
			steps = 150
		}
		ctx := context.Background()
		for ci, c := range cases {
			rng := rand.New(rand.NewSource(int64(100 + ci)))
			tl := newTimeline(t, b)
			opts := []Option{WithAlgorithm(c.alg), WithLimits(c.limits[1:]...)}
			buckets := defaultBuckets
			if c.buckets > 0 {
				opts = append(opts, WithBuckets(c.buckets))
				buckets = c.buckets
			}
			l := tl.limiter(fmt.Sprintf("long%d", ci), c.limits[0], opts...)
			m := newModel(c.alg, c.limits, buckets)
			most := 0
			var at time.Duration
			for i := 0; i < steps; i++ {
				at += time.Duration(rng.Intn(12_000)) * time.Microsecond
				tl.at(at)
				now := tl.now.UnixMicro()
				n := 1 + rng.Intn(3)
				switch r := rng.Intn(10); {
				case r < 2: // a read
					want, _ := m.allow(now, 0, 0)
					got, err := l.AllowN(ctx, 0)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Fatalf("%v %v step %d (t0+%v, n=0): got %+v, want %+v", c.alg, c.limits, i, at, got, want)
					}
				case r < 5: // take now or not at all
					want, _ := m.allow(now, n, 0)
					got, err := l.AllowN(ctx, n)
					if err != nil {
						t.Fatal(err)
					}
					if got != want {
						t.Fatalf("%v %v step %d (t0+%v, n=%d): got %+v, want %+v", c.alg, c.limits, i, at, n, got, want)
					}
				default: // book up to a second ahead
					maxWait := time.Duration(rng.Intn(1_000_000)) * time.Microsecond
					want, wantAt := m.allow(now, n, int64(maxWait/time.Microsecond))
					res, err := l.Reserve(ctx, n, maxWait)
					if err != nil {
						t.Fatal(err)
					}
					wantDelay := want.RetryAfter
					if want.Allowed {
						wantDelay = time.Duration(wantAt-now) * time.Microsecond
					}
					if res.OK() != want.Allowed || res.Delay() != wantDelay {
						t.Fatalf("%v %v step %d (t0+%v, n=%d, maxWait %v): got OK %v delay %v, want OK %v delay %v",
							c.alg, c.limits, i, at, n, maxWait, res.OK(), res.Delay(), want.Allowed, wantDelay)
					}
				}
				most = max(most, int(b.Client.LLen(ctx, l.stateKey()).Val()))
			}
			if most < 40 { // 20 entries: well past the head a script reads at once
				t.Fatalf("%v %v: the log held at most %d list elements; the test wants logs longer than what a script reads at once", c.alg, c.limits, most)
			}
			t.Logf("%v %v: %d steps match the model; the log held up to %d list elements", c.alg, c.limits, steps, most)
		}
	})
}
