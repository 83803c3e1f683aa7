// Package redisson is a Redisson-style rate limiter (RRateLimiter with RateType.OVERALL)
// for the benchmark: the permit log that jobthrottle's sliding window corrects, measured
// in the same run so that the figures the issue quotes for Redisson are this machine's.
//
// It follows the description of Redisson's script in the project's seed: a hash holding
// the configuration (set once by TrySetRate), a counter of available permits, and a
// sorted set of grants scored by the client's clock in milliseconds, each member a packed
// 16-byte random id and the permit count. A denied caller learns when the oldest grant
// in the window expires, and Acquire sleeps that long plus RetrySlack before it asks
// again, as Redisson's acquire does.
package redisson

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/redis/go-redis/v9"
)

//go:embed rratelimiter.lua
var src string

// Script is the limiter's script; its contract is the header of rratelimiter.lua.
var Script = redis.NewScript(src)

// RetrySlack is added to the time until the oldest grant expires before a denied
// Acquire calls again.
const RetrySlack = 3 * time.Millisecond

// Limiter is one Redisson-style rate limiter: at most Rate permits per Interval.
// It is safe for simultaneous use by multiple goroutines.
type Limiter struct {
	rdb      redis.Scripter
	name     string
	keys     []string
	rate     int
	interval time.Duration
}

// New returns the limiter called name; call TrySetRate before the first Acquire.
func New(rdb redis.Scripter, name string, rate int, interval time.Duration) *Limiter {
	tag := "{" + name + "}"
	return &Limiter{
		rdb:      rdb,
		name:     name,
		keys:     []string{tag, tag + ":value", tag + ":permits"},
		rate:     rate,
		interval: interval,
	}
}

// Keys returns the Redis keys of the limiter: configuration, value, permits.
func (l *Limiter) Keys() []string { return append([]string(nil), l.keys...) }

// TrySetRate stores the configuration unless one is stored already (Redisson's
// trySetRate: a changed rate is ignored until the key is deleted).
func (l *Limiter) TrySetRate(ctx context.Context, rdb redis.Cmdable) error {
	p := rdb.TxPipeline()
	p.HSetNX(ctx, l.keys[0], "rate", l.rate)
	p.HSetNX(ctx, l.keys[0], "interval", l.interval.Milliseconds())
	p.HSetNX(ctx, l.keys[0], "type", 0)
	_, err := p.Exec(ctx)
	return err
}

// TryAcquire takes n permits if they are available now. It returns whether they were
// granted, the client time the grant was recorded at (ms resolution, the score in the
// sorted set), and otherwise the time until the oldest grant in the window expires.
func (l *Limiter) TryAcquire(ctx context.Context, n int) (granted bool, at time.Time, retry time.Duration, err error) {
	var id [16]byte
	for i := 0; i < len(id); i += 8 {
		u := rand.Uint64()
		for j := 0; j < 8; j++ {
			id[i+j] = byte(u >> (8 * j))
		}
	}
	now := time.Now().Truncate(time.Millisecond)
	v, err := Script.Run(ctx, l.rdb, l.keys, n, now.UnixMilli(), id[:]).Result()
	if errors.Is(err, redis.Nil) {
		return true, now, 0, nil
	}
	if err != nil {
		return false, time.Time{}, 0, err
	}
	ms, ok := v.(int64)
	if !ok {
		return false, time.Time{}, 0, fmt.Errorf("redisson: unexpected reply %v", v)
	}
	return false, time.Time{}, time.Duration(ms) * time.Millisecond, nil
}

// Acquire takes n permits, sleeping until the oldest grant in the window expires
// (plus RetrySlack) and asking again for as long as they are denied. It returns the
// time the grant was recorded at.
func (l *Limiter) Acquire(ctx context.Context, n int) (time.Time, error) {
	for {
		ok, at, retry, err := l.TryAcquire(ctx, n)
		if err != nil || ok {
			return at, err
		}
		t := time.NewTimer(retry + RetrySlack)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return time.Time{}, ctx.Err()
		}
	}
}
