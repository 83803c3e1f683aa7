package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/bench/redisson"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Big keys: the script's execution time (INFO commandstats) on a sliding-window log
// holding entries live entries, for the operations whose cost could grow with the log.

// bigResult is one operation's execution time on a big log.
type bigResult struct {
	what    string
	entries int64         // live entries in the log when it ran
	calls   int64         // script calls measured
	exec    time.Duration // mean execution time per call
	failed  string        // the error the script returned, if it failed
	peer    bool          // not jobthrottle: shown for comparison, not a goal
}

// execTime runs f and returns the script calls it made and their mean execution time.
func execTime(ctx context.Context, rdb *redis.Client, f func() error) (int64, time.Duration, error) {
	s0, err := snapServer(ctx, rdb)
	if err != nil {
		return 0, 0, err
	}
	if err := f(); err != nil {
		return 0, 0, err
	}
	s1, err := snapServer(ctx, rdb)
	if err != nil {
		return 0, 0, err
	}
	calls := s1.evalCalls - s0.evalCalls
	if calls == 0 {
		return 0, 0, fmt.Errorf("no script call measured")
	}
	return calls, time.Duration(s1.evalUsec-s0.evalUsec) * time.Microsecond / time.Duration(calls), nil
}

func logEntries(ctx context.Context, rdb *redis.Client, key string) int64 {
	return max(0, (rdb.LLen(ctx, key).Val()-1)/2)
}

// runBigKeys measures the sliding window with entries live entries: granted ones
// (Allow at a rate that never denies, then denied and read calls on the full log), and
// booked ones (entries reservations queued ahead, then a booking at the tail and the
// cancel of the earliest booking, which renumbers every entry after it). Its limiters
// do not coalesce: each fill call makes an entry of its own, and each measured call is
// one script run.
func runBigKeys(ctx context.Context, rdb *redis.Client, entries int) ([]bigResult, error) {
	var out []bigResult
	add := func(what, key string, f func() error) error {
		n := logEntries(ctx, rdb, key)
		calls, d, err := execTime(ctx, rdb, f)
		if err != nil {
			return fmt.Errorf("%s: %w", what, err)
		}
		out = append(out, bigResult{what: what, entries: n, calls: calls, exec: d})
		return nil
	}
	repeat := func(n int, f func() error) func() error {
		return func() error {
			for i := 0; i < n; i++ {
				if err := f(); err != nil {
					return err
				}
			}
			return nil
		}
	}

	// granted entries: rate entries per minute, filled by one Allow each
	key := "big-granted"
	l, err := throttle.New(rdb, key, throttle.PerMinute(entries), throttle.WithKeyPrefix(keyPrefix), throttle.WithCoalescing(false))
	if err != nil {
		return nil, err
	}
	state := "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	if err := parallel(entries, 8, func() error { _, err := l.Allow(ctx); return err }); err != nil {
		return nil, err
	}
	steps := []struct {
		what string
		f    func() error
	}{
		{"Allow, denied (log full)", func() error { _, err := l.Allow(ctx); return err }},
		{"AllowN(n = rate/2), denied: finds the middle entry", func() error { _, err := l.AllowN(ctx, entries/2); return err }},
		{"AllowN(0): reads remaining", func() error { _, err := l.AllowN(ctx, 0); return err }},
	}
	for _, s := range steps {
		if err := add(s.what, state, repeat(100, s.f)); err != nil {
			return nil, err
		}
	}

	// the whole log expires at once: a limit with a short period, filled, then left
	key = "big-expiring"
	short, err := throttle.New(rdb, key, throttle.Limit{Rate: entries, Period: 2 * time.Second}, throttle.WithKeyPrefix(keyPrefix), throttle.WithCoalescing(false))
	if err != nil {
		return nil, err
	}
	state = "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	t0 := time.Now()
	if err := parallel(entries, 8, func() error { _, err := short.Allow(ctx); return err }); err != nil {
		return nil, err
	}
	if time.Since(t0) > 1500*time.Millisecond {
		return nil, fmt.Errorf("filling %d entries took %v, too slow for a 2 s period", entries, time.Since(t0))
	}
	time.Sleep(time.Until(t0.Add(2*time.Second + 100*time.Millisecond)))
	// the key is still there (its TTL runs from the last entry); the next call trims all
	if err := add("Allow after every entry expired: trims the log", state, func() error { _, err := short.Allow(ctx); return err }); err != nil {
		return nil, err
	}

	// booked entries: a queue of reservations, each its own entry
	key = "big-booked"
	booked, err := throttle.New(rdb, key, throttle.PerSecond(100), throttle.WithKeyPrefix(keyPrefix), throttle.WithCoalescing(false))
	if err != nil {
		return nil, err
	}
	state = "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	var (
		mu       sync.Mutex
		bookings []*waiter.Reservation
	)
	horizon := time.Duration(entries+200) * 10 * time.Millisecond
	if err := parallel(entries, 8, func() error {
		r, err := booked.Reserve(ctx, 1, horizon)
		if err != nil {
			return err
		}
		if !r.OK() {
			return fmt.Errorf("reservation not booked (delay %v)", r.Delay())
		}
		mu.Lock()
		bookings = append(bookings, r)
		mu.Unlock()
		return nil
	}); err != nil {
		return nil, err
	}
	if err := add("Reserve at the tail of the queue", state, repeat(100, func() error {
		_, err := booked.Reserve(ctx, 1, horizon)
		return err
	})); err != nil {
		return nil, err
	}
	// the earliest booking still safely in the future: every booking after it moves
	var early *waiter.Reservation
	soon := time.Now().Add(2 * time.Second)
	for _, r := range bookings {
		if r.Due().After(soon) && (early == nil || r.Due().Before(early.Due())) {
			early = r
		}
	}
	if early == nil {
		return nil, fmt.Errorf("no booking due after %v", soon)
	}
	if err := add("Cancel an early booking (renumbers the entries after it)", state, func() error { return early.Cancel(ctx) }); err != nil {
		return nil, err
	}
	// the same with the queue of the contention runs: 64 bookings after the cancelled one
	key = "big-booked-64"
	small, err := throttle.New(rdb, key, throttle.PerSecond(100), throttle.WithKeyPrefix(keyPrefix), throttle.WithCoalescing(false))
	if err != nil {
		return nil, err
	}
	state = "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	var queue []*waiter.Reservation
	for i := 0; i < 100+1+64; i++ { // a full window, then 65 booked ahead
		r, err := small.Reserve(ctx, 1, time.Minute)
		if err != nil {
			return nil, err
		}
		queue = append(queue, r)
	}
	if err := add("Cancel a booking with 64 booked after it", state, func() error { return queue[100].Cancel(ctx) }); err != nil {
		return nil, err
	}
	// the Redisson-style log in the same place: every grant of a full log expires at once
	r, err := redissonExpiry(ctx, rdb, entries)
	if err != nil {
		return nil, err
	}
	out = append(out, r)
	for _, k := range []string{"big-granted", "big-expiring", "big-booked", "big-booked-64"} {
		rdb.Del(ctx, "{"+keyPrefix+k+"}:sw")
	}
	return out, nil
}

// parallel calls f n times from g goroutines.
func parallel(n, g int, f func() error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		next  int
		first error
	)
	for i := 0; i < g; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				mu.Lock()
				if next >= n || first != nil {
					mu.Unlock()
					return
				}
				next++
				mu.Unlock()
				if err := f(); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		}()
	}
	wg.Wait()
	return first
}

// redissonExpiry fills a Redisson-style log with entries grants in under a second,
// lets them all expire and asks once more: its script releases every expired grant in
// one ZREM with unpack, which Lua refuses past ~8000 values.
func redissonExpiry(ctx context.Context, rdb *redis.Client, entries int) (bigResult, error) {
	key := "big-redisson"
	rl := redisson.New(rdb, keyPrefix+key, entries, 2*time.Second)
	rdb.Del(ctx, rl.Keys()...)
	defer rdb.Del(ctx, rl.Keys()...)
	if err := rl.TrySetRate(ctx, rdb); err != nil {
		return bigResult{}, err
	}
	t0 := time.Now()
	if err := parallel(entries, 8, func() error { _, _, _, err := rl.TryAcquire(ctx, 1); return err }); err != nil {
		return bigResult{}, err
	}
	time.Sleep(time.Until(t0.Add(2*time.Second + 100*time.Millisecond)))
	n := rdb.ZCard(ctx, rl.Keys()[2]).Val()
	r := bigResult{what: "Redisson-style log: acquire after every grant expired (releases them all)", entries: n, peer: true}
	var failed error
	calls, d, err := execTime(ctx, rdb, func() error {
		_, _, _, failed = rl.TryAcquire(ctx, 1)
		return nil
	})
	if err != nil {
		return bigResult{}, err
	}
	r.calls, r.exec = calls, d
	if failed != nil {
		r.failed = failed.Error()
	}
	return r, nil
}
