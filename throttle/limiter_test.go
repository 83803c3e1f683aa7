package throttle

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestNewRejectsBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never dialled: New does not call Redis
	defer rdb.Close()
	var nilClient *redis.Client
	var nilCluster *redis.ClusterClient
	ok := PerSecond(10)
	cases := []struct {
		name  string
		rdb   redis.UniversalClient
		key   string
		limit Limit
		opts  []Option
		want  error
	}{
		{"nil client", nil, "k", ok, nil, ErrNilClient},
		{"typed nil client", nilClient, "k", ok, nil, ErrNilClient},
		{"typed nil cluster", nilCluster, "k", ok, nil, ErrNilClient},
		{"empty key", rdb, "", ok, nil, ErrInvalidKey},
		{"empty hash tag", rdb, "}x", ok, []Option{WithKeyPrefix("")}, ErrInvalidKey},
		{"zero rate", rdb, "k", Limit{Rate: 0, Period: time.Second}, nil, ErrInvalidLimit},
		{"negative rate", rdb, "k", Limit{Rate: -1, Period: time.Second}, nil, ErrInvalidLimit},
		{"huge rate", rdb, "k", Limit{Rate: 2_000_000_000, Period: time.Second}, nil, ErrInvalidLimit},
		{"zero period", rdb, "k", Limit{Rate: 1}, nil, ErrInvalidLimit},
		{"negative period", rdb, "k", Limit{Rate: 1, Period: -time.Second}, nil, ErrInvalidLimit},
		{"huge period", rdb, "k", Limit{Rate: 1, Period: 500 * 24 * time.Hour}, nil, ErrInvalidLimit},
		{"negative burst", rdb, "k", Limit{Rate: 1, Period: time.Second, Burst: -1}, nil, ErrInvalidLimit},
		{"bucket too deep", rdb, "k", Limit{Rate: 1, Period: 100 * 24 * time.Hour, Burst: 1_000_000}, []Option{WithAlgorithm(TokenBucket)}, ErrInvalidLimit},
		{"bad extra limit", rdb, "k", ok, []Option{WithLimits(Limit{Rate: 0, Period: time.Second})}, ErrInvalidLimit},
		{"unknown algorithm", rdb, "k", ok, []Option{WithAlgorithm(Algorithm(9))}, ErrInvalidArgument},
		{"zero buckets", rdb, "k", ok, []Option{WithBuckets(0)}, ErrInvalidArgument},
		{"17 limits", rdb, "k", ok, []Option{WithLimits(make17()...)}, ErrInvalidArgument},
	}
	for _, alg := range allAlgorithms {
		for _, c := range cases {
			opts := append([]Option{WithAlgorithm(alg)}, c.opts...)
			l, err := New(c.rdb, c.key, c.limit, opts...)
			if !errors.Is(err, c.want) || l != nil {
				t.Errorf("%v, %s: New = %v, %v; want nil, %v", alg, c.name, l, err, c.want)
			}
		}
	}
	// the same bad limits are fine elsewhere: burst matters only to the token bucket
	if _, err := New(rdb, "k", Limit{Rate: 1, Period: 100 * 24 * time.Hour, Burst: 1_000_000}); err != nil {
		t.Errorf("deep burst on the sliding window: %v", err)
	}
}

func make17() []Limit {
	var ls []Limit
	for i := 1; i <= 16; i++ {
		ls = append(ls, Limit{Rate: 10 * i, Period: time.Duration(i) * time.Second})
	}
	return ls
}

// n < 0 and n above what the limits can ever grant are refused before Redis is
// called: nothing is written, nothing is taken.
func TestAllowNRejectsImpossibleN(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	cases := []struct {
		alg   Algorithm
		limit Limit
		extra []Limit
		max   int
	}{
		{SlidingWindow, PerSecond(5), nil, 5},
		{SlidingWindow, PerSecond(5), []Limit{PerMinute(3)}, 3},
		{TokenBucket, Limit{Rate: 5, Period: time.Second, Burst: 2}, nil, 2},
		{TokenBucket, PerSecond(5), nil, 5}, // Burst 0 means Rate
		{FixedWindow, PerSecond(4), nil, 4},
		{SlidingCounter, PerSecond(4), []Limit{PerHour(2)}, 2},
	}
	for i, c := range cases {
		l, err := New(b.Client, "n"+itoa(i), c.limit, WithAlgorithm(c.alg), WithLimits(c.extra...), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		before := commands(t, b)
		if _, err := l.AllowN(ctx, c.max+1); !errors.Is(err, ErrExceedsLimit) {
			t.Errorf("%v %v: AllowN(%d) = %v, want ErrExceedsLimit", c.alg, c.limit, c.max+1, err)
		}
		if _, err := l.AllowN(ctx, -1); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("%v: AllowN(-1) = %v, want ErrInvalidArgument", c.alg, err)
		}
		if got := commands(t, b); got != before {
			t.Errorf("%v: impossible n sent %d commands to Redis", c.alg, got-before)
		}
		res, err := l.AllowN(ctx, c.max)
		if err != nil || !res.Allowed || res.Remaining != 0 {
			t.Errorf("%v: AllowN(max=%d) = %+v, %v; want allowed, 0 remaining", c.alg, c.max, res, err)
		}
	}
}

func commands(t *testing.T, b *redistest.Backend) int {
	t.Helper()
	return b.Mini.CommandCount()
}

// AllowN(0) reports the state and takes nothing.
func TestAllowZeroReadsOnly(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			l := tl.limiter("zero"+alg.String(), PerSecond(3), WithAlgorithm(alg))
			for i := 0; i < 3; i++ {
				res, err := l.AllowN(context.Background(), 0)
				if err != nil || !res.Allowed || res.Remaining != 3 || res.ResetAfter != 0 {
					t.Fatalf("%v: AllowN(0) on a fresh key = %+v, %v", alg, res, err)
				}
			}
			if n := keysUnder(t, b); n != 0 {
				t.Fatalf("%v: AllowN(0) wrote %d keys", alg, n)
			}
		}
	})
}

// Every key a limiter writes has a TTL no longer than its state needs, and an idle
// limiter leaves nothing behind once it has passed.
func TestKeysExpire(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			l := tl.limiter("ttl"+alg.String(), PerSecond(4), WithAlgorithm(alg), WithLimits(Limit{Rate: 10, Period: 3 * time.Second}))
			for i := 0; i < 6; i++ {
				tl.at(time.Duration(i) * 150 * ms)
				if _, err := l.AllowN(ctx, 1); err != nil {
					t.Fatal(err)
				}
			}
			if _, err := l.Reserve(ctx, 2, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			res, err := l.AllowN(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			for _, k := range scanKeys(t, b) {
				if !strings.HasPrefix(k, l.stateKey()[:len(l.stateKey())-2]) || strings.HasSuffix(k, ":clock") {
					continue // another limiter's key, or the test clock
				}
				ttl, err := b.Client.PTTL(ctx, k).Result()
				if err != nil {
					t.Fatal(err)
				}
				if ttl <= 0 {
					t.Fatalf("%v: key %s has no TTL (%v)", alg, k, ttl)
				}
				// the state is needed until the limiter is full again, no longer (checked
				// on miniredis, whose TTLs follow the test's clock; on real servers the
				// fake-clock scripts stretch TTLs, see redistest.FakeClockScript, and
				// TestKeysExpireOnTheRealClock checks the production scripts)
				if slack := ttl - res.ResetAfter; b.Kind == redistest.Mini && (slack > 2*ms || slack < -2*ms) {
					t.Fatalf("%v: key %s TTL %v, state needed for %v", alg, k, ttl, res.ResetAfter)
				}
			}
			if b.Kind == redistest.Mini { // only miniredis's TTLs follow the test clock
				tl.at(tl.now.Sub(redistest.Epoch) + res.ResetAfter + ms)
				if n := keysUnder(t, b); n != 0 {
					t.Fatalf("%v: %d keys left after the longest TTL", alg, n)
				}
			}
		}
	})
}

// A key holding data jobthrottle did not write is reported, not overwritten.
func TestCorruptStateIsReported(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			for _, bad := range []func(key string) error{
				func(key string) error { return b.Client.HSet(ctx, key, "f", "v").Err() },        // wrong type
				func(key string) error { return b.Client.Set(ctx, key, "not numbers", 0).Err() }, // unreadable string
				func(key string) error { return b.Client.RPush(ctx, key, "x", "1", "y").Err() },  // unreadable list
				func(key string) error { return b.Client.RPush(ctx, key, "0", "1").Err() },       // list of the wrong shape
			} {
				tl := newTimeline(t, b)
				l := tl.limiter("corrupt", PerSecond(3), WithAlgorithm(alg))
				key := l.stateKey()
				b.Client.Del(ctx, key)
				if err := bad(key); err != nil {
					t.Fatal(err)
				}
				dump := b.Client.Dump(ctx, key).Val()
				_, err := l.Allow(ctx)
				if err == nil {
					// a string where a list is expected, or the reverse, must fail; some
					// shapes are only foreign to some algorithms
					typ := b.Client.Type(ctx, key).Val()
					if (typ == "list") == (alg == SlidingWindow || alg == SlidingCounter) {
						t.Fatalf("%v: foreign %s state accepted", alg, typ)
					}
					continue
				}
				if !errors.Is(err, ErrCorruptState) {
					t.Fatalf("%v: %v, want ErrCorruptState", alg, err)
				}
				if got := b.Client.Dump(ctx, key).Val(); got != dump {
					t.Fatalf("%v: the foreign value was changed", alg)
				}
				b.Client.Del(ctx, key)
			}
		}
	})
}

// With Redis unreachable the call fails fast with the network error: not allowed,
// no hang, no panic.
func TestRedisDownIsAnError(t *testing.T) {
	// One dial per call (go-redis dials 5 times, 100ms apart, by default): the time
	// bound below is the library's, which asks Redis once and answers.
	rdb := redis.NewClient(&redis.Options{Addr: redistest.RefusedAddr, MaxRetries: -1, DialTimeout: 200 * ms, DialerRetries: 1})
	defer rdb.Close()
	var hookErr error
	l, err := New(rdb, "down", PerSecond(1), WithHooks(Hooks{RedisError: func(_ string, err error) { hookErr = err }}))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	res, err := l.Allow(context.Background())
	if err == nil || res.Allowed {
		t.Fatalf("Allow with Redis down = %+v, %v; want an error, not allowed", res, err)
	}
	if errors.Is(err, ErrCorruptState) || errors.Is(err, ErrInvalidArgument) {
		t.Fatalf("Redis down reported as %v", err)
	}
	if hookErr == nil {
		t.Fatal("RedisError hook not called")
	}
	if err := l.Wait(context.Background()); err == nil {
		t.Fatal("Wait with Redis down returned nil")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("failing took %v", d)
	}
}

// On the real clock, with the production scripts, every key a limiter writes has a
// TTL no longer than its state needs: at most 1ms more (rounded up to milliseconds),
// and no less than that need minus the real time the two calls took.
func TestKeysExpireOnTheRealClock(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			l, err := New(b.Client, "realttl"+alg.String(), PerSecond(4), WithAlgorithm(alg),
				WithLimits(Limit{Rate: 10, Period: 3 * time.Second}), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			l.AllowN(ctx, 3)
			writing := time.Now()
			if _, err := l.Reserve(ctx, 2, 10*time.Second); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			res, err := l.AllowN(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			ttl, err := b.Client.PTTL(ctx, l.stateKey()).Result()
			if err != nil {
				t.Fatal(err)
			}
			took := time.Since(start)
			// Above: two whole milliseconds, since the TTL is set rounded up to a
			// millisecond, and PTTL counts from Redis's clock in whole milliseconds,
			// truncated, so it reads up to a millisecond more than is left by the µs
			// clock that AllowN's ResetAfter counts from; and the time the writing
			// script ran between its TIME and its SET, since Redis counts PX from the
			// SET (a redis-server descheduled there on a busy host sets it later by
			// that much: seen 0.48ms over; harmless, the key lives that much longer).
			// That gap is bounded by the writing calls' duration, measured here.
			if over := res.ResetAfter + 2*ms + start.Sub(writing); ttl <= 0 || ttl > over+took || ttl < res.ResetAfter-took-ms {
				t.Fatalf("%v: TTL %v, state needed for %v (the calls took %v, the writing ones %v)", alg, ttl, res.ResetAfter, took, start.Sub(writing))
			}
		}
	})
}
