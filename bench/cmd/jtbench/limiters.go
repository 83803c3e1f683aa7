package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/jobthrottle/jobthrottle/bench/redisson"
	"github.com/jobthrottle/jobthrottle/internal/keys"
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

// jobthrottleSubject is a jobthrottle limiter of algorithm a with limit on key. Every
// call of a process shares round trips with those made at the same time (there is no
// other way since WithCoalescing went).
func jobthrottleSubject(rdb redis.UniversalClient, a throttle.Algorithm, key string, limit throttle.Limit) (subject, *throttle.Limiter, error) {
	l, err := throttle.New(rdb, key, limit, throttle.WithAlgorithm(a), throttle.WithKeyPrefix(keyPrefix))
	if err != nil {
		return subject{}, nil, err
	}
	name := "jobthrottle " + a.String()
	if a == throttle.TokenBucket && limit.Burst != 0 {
		name += fmt.Sprintf(" (burst %d)", limit.Burst)
	}
	tag := "{" + keyPrefix + key + "}"
	return subject{
		name: name,
		allow: func(ctx context.Context) (bool, error) {
			res, err := l.Allow(ctx)
			return res.Allowed, err
		},
		// the one state key (its meta holds the limits, a pause, an override)
		keys: []string{keys.Name(tag, keys.State)},
	}, l, nil
}

// tenantsSubject is a jobthrottle limiter of algorithm a on key whose calls go to k
// tenants of its group in turn (call i to tenant i mod k), each tenant capped at limit
// too: the group, the caller's cap and the fair share in every call.
func tenantsSubject(rdb redis.UniversalClient, a throttle.Algorithm, key string, limit throttle.Limit, k int) (subject, error) {
	l, err := throttle.New(rdb, key, limit, throttle.WithAlgorithm(a), throttle.WithKeyPrefix(keyPrefix), throttle.WithTenantLimits(limit))
	if err != nil {
		return subject{}, err
	}
	tag := "{" + keyPrefix + key + "}"
	ks := []string{keys.Name(tag, keys.State), keys.Name(tag, keys.FairQueue)}
	var ts []*throttle.Limiter
	for i := range k {
		name := fmt.Sprintf("tenant%d", i)
		ts = append(ts, l.Tenant(name))
		ks = append(ks, keys.Name(tag, keys.Tenant+name))
	}
	var next atomic.Uint64
	return subject{
		name: fmt.Sprintf("jobthrottle %s, %d tenants of one group", a, k),
		allow: func(ctx context.Context) (bool, error) {
			res, err := ts[next.Add(1)%uint64(k)].Allow(ctx)
			return res.Allowed, err
		},
		keys: ks,
	}, nil
}

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

// scripts are the names of jobthrottle's scripts (lua.Script) by algorithm.
var scripts = map[throttle.Algorithm]string{
	throttle.SlidingWindow:  "log",
	throttle.TokenBucket:    "bucket",
	throttle.FixedWindow:    "window",
	throttle.SlidingCounter: "log",
}

// allowCall returns the KEYS and ARGV of the script call a lone Allow of a limiter of
// algorithm a with one limit of rate per period on key makes (internal/protocol): its
// state key; its head, no caps, and one acquire of 1 permit that waits for nothing.
func allowCall(a throttle.Algorithm, key string, rate int, period time.Duration) ([]string, []any) {
	tag := "{" + keyPrefix + key + "}"
	h := keys.Head{Alg: heads[a], Limits: []keys.Limit{{Rate: rate, Period: period, Burst: rate}}}
	if a == throttle.SlidingCounter {
		h.Buckets = 50 // the default
	}
	if a != throttle.TokenBucket {
		h.Limits[0].Burst = 0
	}
	return []string{keys.Name(tag, keys.State)}, []any{h.String(), "", "a 1 0"}
}

// heads are the algorithms' head tags.
var heads = map[throttle.Algorithm]string{
	throttle.SlidingWindow:  keys.SlidingWindow,
	throttle.SlidingCounter: keys.SlidingCounter,
	throttle.TokenBucket:    keys.TokenBucket,
	throttle.FixedWindow:    keys.FixedWindow,
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
