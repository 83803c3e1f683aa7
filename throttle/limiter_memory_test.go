package throttle

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// usedMemory returns INFO memory's used_memory.
func usedMemory(ctx context.Context, c *redis.Client) (int64, error) {
	info, err := c.Info(ctx, "memory").Result()
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			return strconv.ParseInt(v, 10, 64)
		}
	}
	return 0, fmt.Errorf("no used_memory in INFO memory")
}

// Memory per key, measured on a real redis-server of the test's own (redis 7, default
// encodings) with keys named as in production ("{jobthrottle:tenant-000001}:l"):
//   - after one grant: MEMORY USAGE of the state key (key, value with its meta, and its
//     overhead), and used_memory's growth per key over 10k keys (adds the keyspace's and
//     the expires table's entries);
//   - at steady state, a key used at its full rate, 10, 100 and 1000 per second, for
//     three periods on a clock the test moves (FakeClockScript);
//   - a semaphore with 10, 100 and 1000 live leases.
//
// The figures are logged for the README; the test fails only if one is absurd (a
// state key over 200 bytes after one grant, the O(1) states over 200 bytes at any
// rate, the sliding counter over what its buckets allow).
func TestMemoryPerKey(t *testing.T) {
	parallel(t)
	_, c := startOwnServer(t)
	ctx := context.Background()
	b := &redistest.Backend{Kind: redistest.Standalone, Client: c}
	const n = 10_000

	usage := func(key string) int64 {
		v, err := c.MemoryUsage(ctx, key, 0).Result()
		if err != nil {
			t.Fatalf("MEMORY USAGE %s: %v", key, err)
		}
		return v
	}
	var rows []string
	for ai, alg := range allAlgorithms {
		if err := c.FlushDB(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		before, err := usedMemory(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		// a long period, so that no state expires while they are counted (the numbers a
		// state holds are as long whatever the period); keys of their own per
		// algorithm, of the same length; granted by 32 callers at once, whose calls
		// share round trips
		lims := make([]*Limiter, n)
		var next atomic.Int64
		errs := make(chan error, 32)
		for range 32 {
			go func() {
				for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
					l, err := New(c, fmt.Sprintf("tenant-%06d", ai*n+i), Limit{Rate: 10, Period: maxPeriodUS * time.Microsecond}, WithAlgorithm(alg))
					if err == nil {
						_, err = l.Allow(ctx)
					}
					if err != nil {
						errs <- err
						return
					}
					lims[i] = l
				}
				errs <- nil
			}()
		}
		for range 32 {
			if err := <-errs; err != nil {
				t.Fatal(err)
			}
		}
		var one int64
		for _, l := range lims[:1000] {
			one += usage(l.stateKey())
		}
		after, err := usedMemory(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		if keys, _ := c.DBSize(ctx).Result(); keys != n { // the state alone
			t.Fatalf("%v: %d keys, want %d", alg, keys, n)
		}
		one /= 1000
		if one > 200 {
			t.Errorf("%v: %d bytes for one grant's state", alg, one)
		}
		row := fmt.Sprintf("%-14v one grant: MEMORY USAGE %4d B, used_memory +%4d B/key", alg, one, (after-before)/n)

		// steady state: rate r per second used to the full for three periods
		for _, r := range []int{10, 100, 1000} {
			tl := &timeline{t: t, b: b, now: redistest.Epoch}
			l := tl.limiter(fmt.Sprintf("steady-%v-%d", alg, r), PerSecond(r), WithAlgorithm(alg))
			step := time.Second / time.Duration(r)
			for i := 0; i < 3*r; i++ {
				tl.at(time.Duration(i) * step)
				res, err := l.Allow(ctx)
				if err != nil {
					t.Fatal(err)
				}
				if !res.Allowed && alg != FixedWindow && alg != SlidingCounter {
					t.Fatalf("%v at %d/s: grant %d denied", alg, r, i)
				}
			}
			u := usage(l.stateKey())
			row += fmt.Sprintf(", %d/s: %6d B", r, u)
			if (alg == TokenBucket || alg == FixedWindow) && u > 200 {
				t.Errorf("%v at %d/s: %d bytes, want O(1)", alg, r, u)
			}
			if alg == SlidingCounter && u > 51*40+200 { // 50 buckets, base: ~51 entries of two numbers
				t.Errorf("%v at %d/s: %d bytes, more than its 50 buckets need", alg, r, u)
			}
		}
		rows = append(rows, row)
	}
	// semaphores: a lease set of m live leases
	row := fmt.Sprintf("%-14s", "Semaphore")
	for _, m := range []int{1, 10, 100, 1000} {
		s, err := NewSemaphore(c, fmt.Sprintf("sem-%d", m), m, WithLeaseTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < m; i++ {
			if l, _, err := s.TryAcquire(ctx); err != nil || l == nil {
				t.Fatalf("TryAcquire: %v %v", l, err)
			}
		}
		row += fmt.Sprintf(" %d leases: %6d B", m, usage(s.t.keys[0]))
	}
	rows = append(rows, row)
	redistest.Figure(t, "memory per key (redis %s, keys like {jobthrottle:tenant-000001}:l, 1 limit):\n%s",
		serverVersion(ctx, c), strings.Join(rows, "\n"))
}

func serverVersion(ctx context.Context, c *redis.Client) string {
	info, _ := c.Info(ctx, "server").Result()
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "redis_version:"); ok {
			return v
		}
	}
	return "?"
}
