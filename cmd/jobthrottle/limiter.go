package main

import (
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// The command builds throttle's Limiters and Semaphores here only: what it reads of
// the keys themselves goes through internal/keys.

// algorithm is the algorithm of head tag a (one of keys.Algorithms()).
func algorithm(a string) throttle.Algorithm {
	switch a {
	case keys.SlidingCounter:
		return throttle.SlidingCounter
	case keys.TokenBucket:
		return throttle.TokenBucket
	case keys.FixedWindow:
		return throttle.FixedWindow
	}
	return throttle.SlidingWindow
}

// limitsOf is a head's limits as throttle takes them.
func limitsOf(h keys.Head) []throttle.Limit {
	l := make([]throttle.Limit, len(h.Limits))
	for i, k := range h.Limits {
		l[i] = throttle.Limit{Rate: k.Rate, Period: k.Period, Burst: k.Burst, Unit: k.Unit}
	}
	return l
}

// limiter is a Limiter on key with the algorithm of head tag a, limits and buckets
// (0: throttle's default), as the key's processes build it.
func (t *tool) limiter(key, a string, limits []throttle.Limit, buckets int) (*throttle.Limiter, error) {
	opts := []throttle.Option{throttle.WithKeyPrefix(t.o.prefix), throttle.WithAlgorithm(algorithm(a)),
		throttle.WithLimits(limits[1:]...)}
	if buckets > 0 {
		opts = append(opts, throttle.WithBuckets(buckets))
	}
	return throttle.New(t.rdb, key, limits[0], opts...)
}

// controller is a Limiter for the operations kept in the key's meta (pause, resume,
// override, clear, a tenant's weight). Each writes the meta with its caller's head, so
// it sends the head the meta holds: another would stand for another process's limits
// (drift) in every process's next call. A key with no meta gets a meta alone with the
// head unknown, which any algorithm's first call replaces with its own.
func (t *tool) controller(ks *keyset) (*throttle.Limiter, error) {
	h, ok := ks.head()
	if !ok {
		h = unknown
	}
	return t.limiter(ks.key, h.Alg, limitsOf(h), h.Buckets)
}

// unknown is the head the command writes on a key with no meta: one permit per the
// longest period a limit may have (2^45µs), which no process passes. A meta alone with
// this head is a key with no record of its limits (keyset.record).
var unknown = keys.Head{Alg: keys.SlidingWindow, Limits: []keys.Limit{{Rate: 1, Period: 1 << 45 * time.Microsecond}}}

// semaphore is a Semaphore on key: max is -max, or, when not given, a number so
// large the figures Inspect reports do not depend on it.
func (t *tool) semaphore(key string) (*throttle.Semaphore, error) {
	max := t.o.max
	if max == 0 {
		max = 1_000_000_000
	}
	return throttle.NewSemaphore(t.rdb, key, max, throttle.WithKeyPrefix(t.o.prefix))
}
