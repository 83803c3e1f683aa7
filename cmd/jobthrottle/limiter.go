package main

import (
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// The command builds throttle's Limiters and Semaphores here only: what it reads of
// the keys themselves goes through internal/keys.

// algorithm is the algorithm whose state key has suffix s (one of keys.States()).
func algorithm(s string) throttle.Algorithm {
	switch s {
	case keys.SlidingCounter:
		return throttle.SlidingCounter
	case keys.TokenBucket:
		return throttle.TokenBucket
	case keys.FixedWindow:
		return throttle.FixedWindow
	}
	return throttle.SlidingWindow
}

// limitsOf is a record's limits as throttle takes them.
func limitsOf(r keys.Record) []throttle.Limit {
	l := make([]throttle.Limit, len(r.Limits))
	for i, k := range r.Limits {
		l[i] = throttle.Limit{Rate: k.Rate, Period: k.Period, Burst: k.Burst}
	}
	return l
}

// limiter is a Limiter on key with the algorithm of state suffix s, limits and
// buckets (0: throttle's default), as the key's processes build it.
func (t *tool) limiter(key, s string, limits []throttle.Limit, buckets int) (*throttle.Limiter, error) {
	opts := []throttle.Option{throttle.WithKeyPrefix(t.o.prefix), throttle.WithAlgorithm(algorithm(s)),
		throttle.WithLimits(limits[1:]...)}
	if buckets > 0 {
		opts = append(opts, throttle.WithBuckets(buckets))
	}
	return throttle.New(t.rdb, key, limits[0], opts...)
}

// controller is a Limiter for the control key's operations (pause, resume, unset),
// which depend neither on the algorithm nor on the limits.
func (t *tool) controller(key string) (*throttle.Limiter, error) {
	return t.limiter(key, keys.SlidingWindow, []throttle.Limit{throttle.PerSecond(1)}, 0)
}

// semaphore is a Semaphore on key: max is -max, or, when not given, a number so
// large the figures Inspect reports do not depend on it.
func (t *tool) semaphore(key string) (*throttle.Semaphore, error) {
	max := t.o.max
	if max == 0 {
		max = 1_000_000_000
	}
	return throttle.NewSemaphore(t.rdb, key, max, throttle.WithKeyPrefix(t.o.prefix))
}
