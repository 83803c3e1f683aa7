package throttle

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Bounds are checked without overflow: durations near the largest one and products
// above 2^63 are out of range, not wrapped into range.
func TestBoundsDoNotOverflow(t *testing.T) {
	rdb := redistest.NewMini(t).Client
	for _, c := range []struct {
		name  string
		alg   Algorithm
		limit Limit
	}{
		{"period near the largest Duration", SlidingWindow, Limit{Rate: 1, Period: math.MaxInt64}},
		{"period the largest Duration less 500ns", FixedWindow, Limit{Rate: 1, Period: math.MaxInt64 - 500}},
		{"burst × period above 2^63", TokenBucket, Limit{Rate: 16, Period: 24 * time.Hour, Burst: maxRate}},
		{"burst × period just above 2^50", TokenBucket, Limit{Rate: 1, Period: (maxBucketUS/1000 + 1) * time.Microsecond, Burst: 1000}},
	} {
		if _, err := New(rdb, "k", c.limit, WithAlgorithm(c.alg)); !errors.Is(err, ErrInvalidLimit) {
			t.Errorf("%s: New(%v) = %v, want ErrInvalidLimit", c.name, c.limit, err)
		}
	}
	if _, err := New(rdb, "k", Limit{Rate: 1, Period: maxBucketUS / 1000 * time.Microsecond, Burst: 1000}, WithAlgorithm(TokenBucket)); err != nil {
		t.Errorf("burst × period = 2^50: %v, want no error", err)
	}
	if _, err := NewSemaphore(rdb, "k", 1, WithLeaseTTL(math.MaxInt64)); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("WithLeaseTTL(largest Duration): %v, want ErrInvalidArgument", err)
	}
	l, err := New(rdb, "k", PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Pause(context.Background(), math.MaxInt64); err != nil {
		t.Errorf("Pause(largest Duration): %v, want the pause cut to 2^45µs", err)
	}
	if err := l.Override(context.Background(), math.MaxInt64, PerSecond(2)); err != nil {
		t.Errorf("Override for the largest Duration: %v, want it cut to 2^45µs", err)
	}
}

func TestLimitString(t *testing.T) {
	for l, want := range map[Limit]string{
		PerSecond(10):   "10 per 1s",
		PerMinute(3):    "3 per 1m0s",
		PerHour(500):    "500 per 1h0m0s",
		Every(250 * ms): "1 per 250ms",
		{Rate: 5, Period: time.Second, Burst: 20}: "5 per 1s (burst 20)",
	} {
		if got := l.String(); got != want {
			t.Errorf("%#v.String() = %q, want %q", l, got, want)
		}
	}
}
