package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/bench/redisson"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// keyPrefix starts every key the benchmark writes ("{jtbench:…", "rate:jtbench:…"), so
// it can clean up after itself on a server it shares.
const keyPrefix = "jtbench:"

// algorithms are jobthrottle's, in the order the tables show them.
var algorithms = []throttle.Algorithm{throttle.SlidingWindow, throttle.TokenBucket, throttle.FixedWindow, throttle.SlidingCounter}

// allowFunc takes one permit now or not at all.
type allowFunc func(ctx context.Context) (bool, error)

// subject is a limiter under test: a name for the tables and how to take a permit now.
type subject struct {
	name  string
	allow allowFunc
	// keys are the Redis keys the subject may write.
	keys []string
	// setup, when not nil, prepares fresh keys (Redisson's trySetRate).
	setup func(ctx context.Context) error
}

// jobthrottleSubject is a jobthrottle limiter of algorithm a with limit on key,
// coalescing concurrent calls (the default).
func jobthrottleSubject(rdb redis.UniversalClient, a throttle.Algorithm, key string, limit throttle.Limit) (subject, *throttle.Limiter, error) {
	return jobthrottleSubjectOpt(rdb, a, key, limit, true)
}

// jobthrottleSubjectOpt is jobthrottleSubject with coalescing on or off (its name
// then says WithCoalescing(false)).
func jobthrottleSubjectOpt(rdb redis.UniversalClient, a throttle.Algorithm, key string, limit throttle.Limit, coalesce bool) (subject, *throttle.Limiter, error) {
	l, err := throttle.New(rdb, key, limit, throttle.WithAlgorithm(a), throttle.WithKeyPrefix(keyPrefix), throttle.WithCoalescing(coalesce))
	if err != nil {
		return subject{}, nil, err
	}
	name := "jobthrottle " + a.String()
	if a == throttle.TokenBucket && limit.Burst != 0 {
		name += fmt.Sprintf(" (burst %d)", limit.Burst)
	}
	if !coalesce {
		name += soloSuffix
	}
	return subject{
		name: name,
		allow: func(ctx context.Context) (bool, error) {
			res, err := l.Allow(ctx)
			return res.Allowed, err
		},
		keys: []string{"{" + keyPrefix + key + "}:" + suffixes[a], "{" + keyPrefix + key + "}:pause"},
	}, l, nil
}

// soloSuffix ends the name of a jobthrottle case without coalescing.
const soloSuffix = ", WithCoalescing(false)"

// manyKeys spreads a subject's calls over k subjects (keys): call i goes to subject
// i mod k, so concurrent calls mostly land on different keys.
func manyKeys(name string, subs []subject) subject {
	var next atomic.Uint64
	var keys []string
	for _, s := range subs {
		keys = append(keys, s.keys...)
	}
	return subject{
		name: fmt.Sprintf("%s over %d keys", name, len(subs)),
		allow: func(ctx context.Context) (bool, error) {
			return subs[next.Add(1)%uint64(len(subs))].allow(ctx)
		},
		keys: keys,
	}
}

// redisRateSubject is go-redis/redis_rate's GCRA limiter with limit on key.
func redisRateSubject(rdb *redis.Client, key string, limit redis_rate.Limit) subject {
	rl := redis_rate.NewLimiter(rdb)
	name := "redis_rate"
	if limit.Burst != limit.Rate {
		name += fmt.Sprintf(" (burst %d)", limit.Burst)
	}
	return subject{
		name: name,
		allow: func(ctx context.Context) (bool, error) {
			res, err := rl.Allow(ctx, keyPrefix+key, limit)
			if err != nil {
				return false, err
			}
			return res.Allowed > 0, nil
		},
		keys: []string{"rate:" + keyPrefix + key},
	}
}

// redissonSubject is the Redisson-style permit log with rate per period on key; its
// rate is set (trySetRate) before it is returned.
func redissonSubject(ctx context.Context, rdb *redis.Client, key string, rate int, period time.Duration) (subject, *redisson.Limiter, error) {
	rl := redisson.New(rdb, keyPrefix+key, rate, period)
	if err := rl.TrySetRate(ctx, rdb); err != nil {
		return subject{}, nil, err
	}
	return subject{
		name: "Redisson-style log",
		allow: func(ctx context.Context) (bool, error) {
			ok, _, _, err := rl.TryAcquire(ctx, 1)
			return ok, err
		},
		keys:  rl.Keys(),
		setup: func(ctx context.Context) error { return rl.TrySetRate(ctx, rdb) },
	}, rl, nil
}

// suffixes are the last part of jobthrottle's state keys, "{<prefix><key>}:<suffix>"
// (see the headers of lua/*.lua).
var suffixes = map[throttle.Algorithm]string{
	throttle.SlidingWindow:  "sw",
	throttle.TokenBucket:    "tb",
	throttle.FixedWindow:    "fw",
	throttle.SlidingCounter: "sc",
}

// existing returns those of keys that exist.
func existing(ctx context.Context, rdb *redis.Client, keys []string) ([]string, error) {
	var out []string
	for _, k := range keys {
		n, err := rdb.Exists(ctx, k).Result()
		if err != nil {
			return nil, err
		}
		if n == 1 {
			out = append(out, k)
		}
	}
	return out, nil
}

// deleteKeys removes every key matching the SCAN patterns.
func deleteKeys(ctx context.Context, rdb *redis.Client, patterns ...string) error {
	keys, err := keysOf(ctx, rdb, patterns...)
	if err != nil || len(keys) == 0 {
		return err
	}
	return rdb.Del(ctx, keys...).Err()
}

// keysOf lists the keys matching the SCAN patterns.
func keysOf(ctx context.Context, rdb *redis.Client, patterns ...string) ([]string, error) {
	var keys []string
	for _, p := range patterns {
		iter := rdb.Scan(ctx, 0, p, 1000).Iterator()
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			return nil, err
		}
	}
	return keys, nil
}
