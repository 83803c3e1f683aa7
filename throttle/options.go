package throttle

import (
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
)

// Option configures a Limiter; pass options to New. An option that only fits a
// Semaphore (WithLeaseTTL, WithSemaphoreHooks) is not an Option, so giving it to New
// does not compile.
type Option interface {
	applyLimiter(*config)
}

// SemaphoreOption configures a Semaphore; pass options to NewSemaphore. An option
// that only fits a Limiter (WithAlgorithm, WithLimits, WithBuckets, WithHooks) is not
// a SemaphoreOption, so giving it to NewSemaphore does not compile.
type SemaphoreOption interface {
	applySemaphore(*config)
}

// CommonOption configures a Limiter or a Semaphore alike (WithKeyPrefix,
// WithFailurePolicy, WithCallTimeout): it is an Option and a SemaphoreOption.
type CommonOption interface {
	Option
	SemaphoreOption
}

type limiterOption func(*config)

func (f limiterOption) applyLimiter(c *config) { f(c) }

type semaphoreOption func(*config)

func (f semaphoreOption) applySemaphore(c *config) { f(c) }

type commonOption func(*config)

func (f commonOption) applyLimiter(c *config)   { f(c) }
func (f commonOption) applySemaphore(c *config) { f(c) }

// config is what the options set; defaults live in newConfig.
type config struct {
	algorithm   Algorithm
	extra       []Limit
	caps        []Limit // each tenant's (WithTenantLimits)
	prefix      string
	buckets     int
	hooks       Hooks
	semHooks    SemaphoreHooks
	policy      FailurePolicy
	leaseTTL    time.Duration
	callTimeout time.Duration // 0: one try of the client's (see WithCallTimeout)
	err         error
}

func newConfig() *config {
	return &config{
		algorithm: SlidingWindow,
		prefix:    keys.DefaultPrefix,
		buckets:   defaultBuckets,
		leaseTTL:  30 * time.Second, // the lock watchdog timeout Redisson uses for the same job
	}
}

// check returns ok; when ok is false it records the error format and args describe,
// unless one is recorded already: the constructor returns the first bad option's.
func (c *config) check(ok bool, format string, args ...any) bool {
	if !ok && c.err == nil {
		c.err = fmt.Errorf(format, args...)
	}
	return ok
}

// WithAlgorithm selects the algorithm; the default is SlidingWindow.
func WithAlgorithm(a Algorithm) Option {
	return limiterOption(func(c *config) {
		if c.check(a >= SlidingWindow && a <= SlidingCounter, "%w: unknown algorithm %d", ErrInvalidArgument, int(a)) {
			c.algorithm = a
		}
	})
}

// WithLimits adds limits enforced together with the first in the same atomic call: a
// request is granted only if every limit has room, and takes from all of them or none.
// "10 per second and 500 per hour" is New(rdb, key, PerSecond(10),
// WithLimits(PerHour(500))). Up to 16 limits in all; every algorithm supports them.
// Changing the set of limits of a key keeps the state of the limits in the same
// position (token bucket, fixed window) or the shared log (sliding window and counter).
func WithLimits(more ...Limit) Option {
	return limiterOption(func(c *config) { c.extra = append(c.extra, more...) })
}

// WithKeyPrefix sets the text put before the key in every Redis key; the default is
// "jobthrottle:". Keys are "{<prefix><key>}:<suffix>", so one limiter's keys share a
// Redis Cluster hash slot.
func WithKeyPrefix(prefix string) CommonOption {
	return commonOption(func(c *config) { c.prefix = prefix })
}

const defaultBuckets = 50 // WithBuckets' default

// WithBuckets sets how many sub-buckets SlidingCounter splits the shortest period
// into, 1..10000; the default is 50. A permit holds its place for between Period and
// Period × (1 + 1/buckets), so the counter never admits more than Rate in any Period
// and, saturated, uses at least buckets/(buckets+1) of the rate (98% by default),
// while keeping at most one entry per bucket. Other algorithms do not use it (so one
// list of options can serve limiters of every algorithm).
func WithBuckets(n int) Option {
	return limiterOption(func(c *config) {
		if c.check(n >= 1 && n <= 10000, "%w: buckets %d is not in 1..10000", ErrInvalidArgument, n) {
			c.buckets = n
		}
	})
}

// WithHooks sets callbacks the Limiter calls after its decisions (see Hooks).
func WithHooks(h Hooks) Option {
	return limiterOption(func(c *config) { c.hooks = h })
}

// WithSemaphoreHooks sets callbacks the Semaphore calls after its decisions (see
// SemaphoreHooks).
func WithSemaphoreHooks(h SemaphoreHooks) SemaphoreOption {
	return semaphoreOption(func(c *config) { c.semHooks = h })
}

// WithLeaseTTL sets how long a Semaphore lease lives unless it is extended, and so how
// long the slot of a holder that died stays taken; 1ms up to 2^45µs (about 407 days),
// used in whole microseconds, rounded up. If unset, the TTL is 30 seconds. Holders of
// longer work call Lease.Extend at least once per TTL, or run it with Lease.Hold or
// Semaphore.Do, which extend every TTL/3.
func WithLeaseTTL(d time.Duration) SemaphoreOption {
	return semaphoreOption(func(c *config) {
		if c.check(d >= time.Millisecond && ceilMicros(d) <= maxPeriodUS, "%w: lease TTL %v is not in 1ms..2^45µs", ErrInvalidArgument, d) {
			c.leaseTTL = d
		}
	})
}

// WithCallTimeout bounds each Redis call of a Limiter or Semaphore to d (> 0, else
// ErrInvalidArgument), whatever the client's timeouts and retries: a call with no reply
// by then returns an error wrapping ErrUnavailable (not context.DeadlineExceeded: the
// caller's own deadline has not passed); an earlier context deadline ends it first. A
// later reply is handled as one after a deadline: a booking ahead or a lease it brings
// is given back. Unset, the bound is one try of the client's: DialTimeout +
// WriteTimeout + ReadTimeout, with go-redis's defaults (5s each) for any unset or
// disabled, so 15s by default. Set it to what a caller can afford to wait for a
// decision, above the slowest reply a loaded Redis gives.
func WithCallTimeout(d time.Duration) CommonOption {
	return commonOption(func(c *config) {
		if c.check(d > 0, "%w: call timeout %v, want > 0", ErrInvalidArgument, d) {
			c.callTimeout = d
		}
	})
}
