package throttle

import (
	"context"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"golang.org/x/time/rate"
)

// The seed's token bucket: capacity 10, 10 per minute; take 5, take 5, ask 5.
func TestTokenBucketSeedExample(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("seed", Limit{Rate: 10, Period: time.Minute, Burst: 10}, WithAlgorithm(TokenBucket))
		runSteps(t, tl, l, []step{
			{0, 5, Result{true, 5, 0, 30 * time.Second, false, false}},
			{0, 5, Result{true, 0, 0, 60 * time.Second, false, false}},
			{0, 5, Result{false, 0, 30 * time.Second, 60 * time.Second, false, false}}, // 5 tokens take 30s to come
			{30 * time.Second, 5, Result{true, 0, 0, 60 * time.Second, false, false}},
		})
	})
}

// Decisions and waits match golang.org/x/time/rate with the same rate and burst,
// request for request, on random timelines.
func TestTokenBucketMatchesXTimeRate(t *testing.T) {
	noteMissingServers(t, "the property was checked on miniredis only", redistest.Standalone, redistest.Cluster)
	cases := []Limit{
		{Rate: 10, Period: time.Second, Burst: 1},
		{Rate: 3, Period: time.Second, Burst: 5}, // 333333.3µs per token
		{Rate: 7, Period: 100 * time.Millisecond, Burst: 20},
		{Rate: 100, Period: time.Minute, Burst: 100},
		{Rate: 9999, Period: time.Second, Burst: 50},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rng := rand.New(rand.NewSource(1))
		for ci, lim := range cases {
			tl := newTimeline(t, b)
			l := tl.limiter("oracle"+string(rune('a'+ci)), lim, WithAlgorithm(TokenBucket))
			perSec := float64(lim.Rate) / lim.Period.Seconds()
			oracle := rate.NewLimiter(rate.Limit(perSec), lim.Burst)
			interval := lim.Period / time.Duration(lim.Rate)
			var at time.Duration
			steps := 150
			if b.Kind == redistest.Cluster {
				steps = 60
			}
			ties := 0
			for i := 0; i < steps; i++ {
				at += time.Duration(rng.Int63n(int64(2*interval)/1000+1)) * time.Microsecond
				n := 1 + rng.Intn(lim.Burst)
				tl.at(at)
				now := redistest.Epoch.Add(at)
				tokens := oracle.TokensAt(now)
				if math.Abs(tokens-float64(n)) < 1e-6 {
					ties++ // exactly on the boundary: float rounding may decide either way
				}
				want := oracle.AllowN(now, n)
				got, err := l.AllowN(context.Background(), n)
				if err != nil {
					t.Fatal(err)
				}
				if got.Allowed != want {
					t.Fatalf("%v step %d (t0+%v, n=%d, x/time/rate tokens %.9f): allowed %v, want %v",
						lim, i, at, n, tokens, got.Allowed, want)
				}
				if !want {
					wantWait := time.Duration(math.Ceil((float64(n)-tokens)/perSec*1e6)) * time.Microsecond
					if d := got.RetryAfter - wantWait; d < -time.Microsecond || d > time.Microsecond {
						t.Fatalf("%v step %d: RetryAfter %v, want %v", lim, i, got.RetryAfter, wantWait)
					}
				} else if wantRem := int(math.Floor(oracle.TokensAt(now) + 1e-9)); got.Remaining != wantRem {
					t.Fatalf("%v step %d: Remaining %d, want %d", lim, i, got.Remaining, wantRem)
				}
			}
			t.Logf("%v: %d steps match x/time/rate (%d on an exact boundary)", lim, steps, ties)
		}
	})
}

// Several token-bucket limits on one key decide like x/time/rate limiters checked
// together: granted only if every bucket has n tokens, and then taken from all.
func TestTokenBucketLimitsMatchXTimeRate(t *testing.T) {
	noteMissingServers(t, "the property was checked on miniredis only", redistest.Standalone, redistest.Cluster)
	limits := []Limit{
		{Rate: 5, Period: time.Second, Burst: 3},
		{Rate: 12, Period: 10 * time.Second, Burst: 8},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		rng := rand.New(rand.NewSource(7))
		tl := newTimeline(t, b)
		l := tl.limiter("multi", limits[0], WithAlgorithm(TokenBucket), WithLimits(limits[1:]...))
		var oracles []*rate.Limiter
		for _, lim := range limits {
			oracles = append(oracles, rate.NewLimiter(rate.Limit(float64(lim.Rate)/lim.Period.Seconds()), lim.Burst))
		}
		var at time.Duration
		granted := 0
		for i := 0; i < 150; i++ {
			at += time.Duration(rng.Intn(400_000)) * time.Microsecond
			n := 1 + rng.Intn(3)
			now := redistest.Epoch.Add(at)
			want := true
			var wantWait time.Duration
			for _, o := range oracles {
				if tokens := o.TokensAt(now); tokens < float64(n) {
					want = false
					wantWait = max(wantWait, time.Duration(math.Ceil((float64(n)-tokens)/float64(o.Limit())*1e6))*time.Microsecond)
				}
			}
			if want {
				for _, o := range oracles {
					o.AllowN(now, n)
				}
				granted++
			}
			tl.at(at)
			got, err := l.AllowN(context.Background(), n)
			if err != nil {
				t.Fatal(err)
			}
			if got.Allowed != want {
				t.Fatalf("step %d (t0+%v, n=%d): allowed %v, want %v", i, at, n, got.Allowed, want)
			}
			if !want {
				if d := got.RetryAfter - wantWait; d < -time.Microsecond || d > time.Microsecond {
					t.Fatalf("step %d: RetryAfter %v, want %v (the longest wait)", i, got.RetryAfter, wantWait)
				}
			}
		}
		t.Logf("150 steps, %d granted, all as two x/time/rate limiters checked together", granted)
	})
}
