package main

import (
	"context"
	"fmt"
	"slices"
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
// cancel of the earliest booking, which renumbers every entry after it). The logs are
// filled from fillers goroutines, each with a Redis client of its own, so that every
// fill call is a script call of its own at its own server time and makes an entry of
// its own (calls a client makes at once share a script call, and the grants of one
// script call share an entry); each measured call is made alone, one script run.
func runBigKeys(ctx context.Context, rdb *redis.Client, entries int) ([]bigResult, error) {
	var out []bigResult
	var clients []*redis.Client
	for range fillers {
		c := redis.NewClient(rdb.Options())
		defer c.Close()
		clients = append(clients, c)
	}
	// fill calls f n times in all, from one goroutine per client, each on the client's
	// own limiter of key (made by mk)
	fill := func(n int, mk func(c *redis.Client) (*throttle.Limiter, error), f func(l *throttle.Limiter) error) error {
		var fs []func() error
		for _, c := range clients {
			l, err := mk(c)
			if err != nil {
				return err
			}
			fs = append(fs, func() error { return f(l) })
		}
		return parallel(n, fs)
	}
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
	granted := func(c *redis.Client) (*throttle.Limiter, error) {
		return throttle.New(c, key, throttle.PerMinute(entries), throttle.WithKeyPrefix(keyPrefix))
	}
	l, err := granted(rdb)
	if err != nil {
		return nil, err
	}
	state := "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	allow := func(l *throttle.Limiter) error { _, err := l.Allow(ctx); return err }
	if err := fill(entries, granted, allow); err != nil {
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
	expiring := func(c *redis.Client) (*throttle.Limiter, error) {
		return throttle.New(c, key, throttle.Limit{Rate: entries, Period: 2 * time.Second}, throttle.WithKeyPrefix(keyPrefix))
	}
	short, err := expiring(rdb)
	if err != nil {
		return nil, err
	}
	state = "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	t0 := time.Now()
	if err := fill(entries, expiring, allow); err != nil {
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
	booking := func(c *redis.Client) (*throttle.Limiter, error) {
		return throttle.New(c, key, throttle.PerSecond(100), throttle.WithKeyPrefix(keyPrefix))
	}
	booked, err := booking(rdb)
	if err != nil {
		return nil, err
	}
	state = "{" + keyPrefix + key + "}:sw"
	rdb.Del(ctx, state)
	type dueReservation struct {
		r   *waiter.Reservation
		due time.Time
	}
	var (
		mu       sync.Mutex
		bookings []dueReservation
	)
	horizon := time.Duration(entries+200) * 10 * time.Millisecond
	if err := fill(entries, booking, func(l *throttle.Limiter) error {
		r, err := l.Reserve(ctx, 1, horizon)
		if err != nil {
			return err
		}
		if !r.OK() {
			return fmt.Errorf("reservation not booked (delay %v)", r.Delay())
		}
		mu.Lock()
		bookings = append(bookings, dueReservation{r, time.Now().Add(r.Delay())})
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
	var early *dueReservation
	soon := time.Now().Add(2 * time.Second)
	for i, r := range bookings {
		if r.due.After(soon) && (early == nil || r.due.Before(early.due)) {
			early = &bookings[i]
		}
	}
	if early == nil {
		return nil, fmt.Errorf("no booking due after %v", soon)
	}
	if err := add("Cancel an early booking (renumbers the entries after it)", state, func() error { return early.r.Cancel(ctx) }); err != nil {
		return nil, err
	}
	// the same with the queue of the contention runs: 64 bookings after the cancelled one
	key = "big-booked-64"
	small, err := throttle.New(rdb, key, throttle.PerSecond(100), throttle.WithKeyPrefix(keyPrefix))
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

// fillers is how many goroutines fill a big log, each with a client of its own.
const fillers = 8

// parallel makes n calls in all, goroutine i calling fs[i], one goroutine per f.
func parallel(n int, fs []func() error) error {
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		next  int
		first error
	)
	for _, f := range fs {
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
	acquire := func() error { _, _, _, err := rl.TryAcquire(ctx, 1); return err }
	if err := parallel(entries, slices.Repeat([]func() error{acquire}, fillers)); err != nil {
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
