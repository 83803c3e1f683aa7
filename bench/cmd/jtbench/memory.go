package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Memory: each limiter takes rate permits spread evenly over one window of a second,
// then MEMORY USAGE is read for every key it wrote.

// memResult is one limiter's memory after one full window at rate permits per second.
type memResult struct {
	name    string
	rate    int
	granted int
	keys    []keyMem
	total   int64
	entries int64 // entries of the log (list pairs, zset members), when the state is one
}

type keyMem struct {
	key   string
	bytes int64
}

// perPermit is the memory per permit in the window.
func (m memResult) perPermit() float64 { return float64(m.total) / float64(max(1, m.granted)) }

// memSubjects returns the limiters measured, each with a limit of rate per second.
func memSubjects(ctx context.Context, rdb *redis.Client, rate int) ([]subject, error) {
	// one user key for all, so that every key name has the same length: what differs
	// is what each stores ("{jtbench:mem100}:tb", "rate:jtbench:mem100", ...)
	key := fmt.Sprintf("mem%d", rate)
	subs := []subject{redisRateSubject(rdb, key, redis_rate.PerSecond(rate))}
	rs, _, err := redissonSubject(ctx, rdb, key, rate, time.Second)
	if err != nil {
		return nil, err
	}
	subs = append(subs, rs)
	for _, a := range algorithms {
		s, _, err := jobthrottleSubject(rdb, a, key, throttle.Limit{Rate: rate, Period: time.Second})
		if err != nil {
			return nil, err
		}
		subs = append(subs, s)
	}
	return subs, nil
}

// fillWindow takes rate permits from s at evenly spaced times over one second, from
// workers goroutines, and returns how many were granted.
func fillWindow(ctx context.Context, s subject, rate, workers int) (int, error) {
	step := time.Second / time.Duration(rate)
	start := time.Now()
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		granted int
		first   error
	)
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok := 0
			var err error
			for i := w; i < rate; i += workers {
				time.Sleep(time.Until(start.Add(time.Duration(i) * step)))
				var allowed bool
				if allowed, err = s.allow(ctx); err != nil {
					break
				}
				if allowed {
					ok++
				}
			}
			mu.Lock()
			granted += ok
			if err != nil && first == nil {
				first = err
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	return granted, first
}

// measureMemory fills one window of s at rate and reads the memory of its keys.
func measureMemory(ctx context.Context, rdb *redis.Client, s subject, rate int) (memResult, error) {
	if err := rdb.Del(ctx, s.keys...).Err(); err != nil {
		return memResult{}, err
	}
	if s.setup != nil {
		if err := s.setup(ctx); err != nil {
			return memResult{}, err
		}
	}
	granted, err := fillWindow(ctx, s, rate, min(16, max(1, rate/100)))
	if err != nil {
		return memResult{}, fmt.Errorf("%s: %w", s.name, err)
	}
	keys, err := existing(ctx, rdb, s.keys)
	if err != nil {
		return memResult{}, err
	}
	m := memResult{name: s.name, rate: rate, granted: granted}
	for _, k := range keys {
		b, err := rdb.MemoryUsage(ctx, k, 0).Result()
		if err != nil {
			return memResult{}, fmt.Errorf("MEMORY USAGE %s: %w", k, err)
		}
		m.keys = append(m.keys, keyMem{k, b})
		m.total += b
		switch rdb.Type(ctx, k).Val() {
		case "list": // jobthrottle's log: [base, T1, S1, ...]
			m.entries += (rdb.LLen(ctx, k).Val() - 1) / 2
		case "zset":
			m.entries += rdb.ZCard(ctx, k).Val()
		}
	}
	return m, rdb.Del(ctx, s.keys...).Err()
}
