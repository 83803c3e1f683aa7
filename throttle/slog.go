package throttle

import (
	"context"
	"log/slog"
	"time"
)

// SlogHooks returns hooks that log a Limiter's decisions to logger:
// grants, denials, waits and cancels at Debug; pauses at Info; Redis errors and
// decisions made without Redis and other processes' limits on the key at Warn; lost
// state at Error. Every record carries key, and the figures of its event (n, wait,
// retry_after with by_cap and turn, waited, d, policy, ours and theirs, err). Pass them
// with WithHooks.
func SlogHooks(logger *slog.Logger) Hooks {
	ctx := context.Background() // LogAttrs checks logger.Enabled first
	return Hooks{
		Allowed: func(key string, n int, wait time.Duration) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: granted", slog.String("key", key), slog.Int("n", n), slog.Duration("wait", wait))
		},
		Denied: func(key string, n int, r Result) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: denied", slog.String("key", key), slog.Int("n", n), slog.Duration("retry_after", r.RetryAfter),
				slog.Bool("by_cap", r.ByCap), slog.Bool("turn", r.Turn))
		},
		Waited: func(key string, n int, waited time.Duration) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: waited", slog.String("key", key), slog.Int("n", n), slog.Duration("waited", waited))
		},
		Cancelled: func(key string, n int) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: booking given back", slog.String("key", key), slog.Int("n", n))
		},
		RedisError: func(key string, err error) {
			logger.LogAttrs(ctx, slog.LevelWarn, "jobthrottle: redis call failed", slog.String("key", key), slog.Any("err", err))
		},
		Paused: func(key string, d time.Duration) {
			logger.LogAttrs(ctx, slog.LevelInfo, "jobthrottle: paused", slog.String("key", key), slog.Duration("d", d))
		},
		Degraded: func(key string, p FailurePolicy, err error) {
			logger.LogAttrs(ctx, slog.LevelWarn, "jobthrottle: decided without redis", slog.String("key", key), slog.String("policy", p.String()), slog.Any("err", err))
		},
		StateLost: func(key string) {
			logger.LogAttrs(ctx, slog.LevelError, "jobthrottle: state lost (evicted, deleted or failed over): the limit starts afresh", slog.String("key", key))
		},
		LimitsDrift: func(key string, ours, theirs []Limit) {
			logger.LogAttrs(ctx, slog.LevelWarn, "jobthrottle: another process has other limits on the key", slog.String("key", key),
				slog.Any("ours", ours), slog.Any("theirs", theirs))
		},
	}
}

// SlogSemaphoreHooks returns hooks that log a Semaphore's decisions to logger: leases
// acquired, denied, given up and released at Debug; Redis errors, decisions made
// without Redis and lost leases at Warn. Every record carries key and the figures of
// its event (waited, retry_after, held, policy, err). Pass them with
// WithSemaphoreHooks.
func SlogSemaphoreHooks(logger *slog.Logger) SemaphoreHooks {
	ctx, limiter := context.Background(), SlogHooks(logger)
	return SemaphoreHooks{
		Acquired: func(key string, waited time.Duration) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: lease acquired", slog.String("key", key), slog.Duration("waited", waited))
		},
		Denied: func(key string, retryAfter time.Duration) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: lease denied", slog.String("key", key), slog.Duration("retry_after", retryAfter))
		},
		GaveUp: func(key string) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: gave up waiting for a lease", slog.String("key", key))
		},
		Released: func(key string, held time.Duration) {
			logger.LogAttrs(ctx, slog.LevelDebug, "jobthrottle: lease released", slog.String("key", key), slog.Duration("held", held))
		},
		LeaseLost: func(key string) {
			logger.LogAttrs(ctx, slog.LevelWarn, "jobthrottle: lease lost", slog.String("key", key))
		},
		RedisError: limiter.RedisError, // the same records as a Limiter's
		Degraded:   limiter.Degraded,
	}
}
