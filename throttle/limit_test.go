package throttle

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
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

// Prefix and key together are at most keys.MaxLen (512) bytes: one byte more is
// ErrInvalidKey from New, NewSemaphore and ReadRecord, counted in bytes (not runes),
// and nothing is sent to Redis; at the bound every call works, on every backend.
func TestKeyLengthBound(t *testing.T) {
	if keys.MaxLen != 512 {
		t.Fatalf("keys.MaxLen = %d; the documented bound is 512", keys.MaxLen)
	}
	mini := redistest.NewMini(t)
	before := mini.Mini.CommandCount()
	for _, c := range []struct {
		prefix, key string
	}{
		{keys.DefaultPrefix, strings.Repeat("k", keys.MaxLen-len(keys.DefaultPrefix)+1)},
		{"", strings.Repeat("k", keys.MaxLen+1)},
		{strings.Repeat("p", 500), strings.Repeat("k", 13)},
		{"p:", strings.Repeat("é", 256)}, // 512 bytes of key, 256 runes
	} {
		what := fmt.Sprintf("prefix of %d bytes, key of %d", len(c.prefix), len(c.key))
		if l, err := New(mini.Client, c.key, PerSecond(1), WithKeyPrefix(c.prefix)); !errors.Is(err, ErrInvalidKey) || l != nil {
			t.Errorf("New, %s: %v, %v; want ErrInvalidKey", what, l, err)
		}
		if s, err := NewSemaphore(mini.Client, c.key, 1, WithKeyPrefix(c.prefix)); !errors.Is(err, ErrInvalidKey) || s != nil {
			t.Errorf("NewSemaphore, %s: %v, %v; want ErrInvalidKey", what, s, err)
		}
		if _, err := ReadRecord(context.Background(), mini.Client, c.key, WithKeyPrefix(c.prefix)); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ReadRecord, %s: %v; want ErrInvalidKey", what, err)
		}
	}
	if n := mini.Mini.CommandCount() - before; n != 0 {
		t.Fatalf("keys over the bound sent %d commands to Redis", n)
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		key := strings.Repeat("k", keys.MaxLen-len(b.Prefix))
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			l := tl.limiter(key, PerSecond(1), WithAlgorithm(alg))
			if r, err := l.Allow(ctx); err != nil || !r.Allowed {
				t.Fatalf("%v, a key at the bound: Allow %+v %v", alg, r, err)
			}
			if _, err := l.Inspect(ctx); err != nil {
				t.Fatalf("%v, a key at the bound: Inspect %v", alg, err)
			}
			if err := b.Client.Del(ctx, l.t.keys...).Err(); err != nil {
				t.Fatal(err)
			}
		}
		s := newTimeline(t, b).semaphore(key, 1)
		lease := mustTry(t, s)
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("a semaphore's key at the bound: Release %v", err)
		}
	})
}

// A limit of the longest period, 2^45µs, works on every algorithm, and so does the token
// bucket's longest life (burst × period = 2^50µs, 32 periods to refill): Allow is
// granted, the next denied for about the period (the bucket's burst of 32 grants 32),
// the state has a TTL within its reset, and its record reads back as given.
func TestLongestPeriodLimit(t *testing.T) {
	longest := maxPeriodUS * time.Microsecond
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		limits := []Limit{{Rate: 1, Period: longest}}
		if alg == TokenBucket {
			limits = append(limits, Limit{Rate: 1, Period: longest, Burst: 32})
		}
		for i, limit := range limits {
			key := fmt.Sprint("longest", i)
			l := tl.limiter(key, limit, WithAlgorithm(alg), WithBuckets(10))
			res, err := l.AllowN(ctx, limit.burst())
			if err != nil || !res.Allowed {
				t.Fatalf("%v: AllowN(%d): got %+v, %v; want allowed", limit, limit.burst(), res, err)
			}
			if r, err := l.Allow(ctx); err != nil || r.Allowed || r.RetryAfter < longest/2 {
				t.Fatalf("%v: Allow again: got %+v, %v; want denied for about the period", limit, r, err)
			}
			rec, err := ReadRecord(ctx, b.Client, key, WithKeyPrefix(b.Prefix))
			if err != nil || rec.Algorithm != alg || len(rec.Limits) != 1 || rec.Limits[0].Rate != 1 ||
				rec.Limits[0].Period != longest || rec.Limits[0].burst() != limit.burst() {
				t.Fatalf("%v: ReadRecord: got %+v, %v; want %v %v", limit, rec, err, alg, limit)
			}
			if rec.TTL <= 0 || rec.TTL > res.ResetAfter+time.Millisecond && b.Kind == redistest.Mini {
				t.Fatalf("%v: the state's TTL %v, want in (0, %v]", limit, rec.TTL, res.ResetAfter)
			}
		}
	})
}
