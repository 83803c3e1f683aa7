package throttle

import (
	"context"
	"log/slog"
	"time"
)

// SlogHooks returns hooks that log a Limiter's decisions to logger:
// grants, denials, waits and cancels at Debug; pauses at Info; Redis errors and
// decisions made without Redis at Warn; lost state at Error. Every record carries
// key, and the figures of its event (n, wait, retry_after, waited, d, policy, err).
// Pass them with WithHooks, alone or joined with others by JoinHooks.
func SlogHooks(logger *slog.Logger) Hooks {
	ctx := context.Background()
	log := func(level slog.Level, msg string, attrs ...slog.Attr) {
		if logger.Enabled(ctx, level) {
			logger.LogAttrs(ctx, level, msg, attrs...)
		}
	}
	return Hooks{
		Allowed: func(key string, n int, wait time.Duration) {
			log(slog.LevelDebug, "jobthrottle: granted", slog.String("key", key), slog.Int("n", n), slog.Duration("wait", wait))
		},
		Denied: func(key string, n int, retryAfter time.Duration) {
			log(slog.LevelDebug, "jobthrottle: denied", slog.String("key", key), slog.Int("n", n), slog.Duration("retry_after", retryAfter))
		},
		Waited: func(key string, n int, waited time.Duration) {
			log(slog.LevelDebug, "jobthrottle: waited", slog.String("key", key), slog.Int("n", n), slog.Duration("waited", waited))
		},
		Cancelled: func(key string, n int) {
			log(slog.LevelDebug, "jobthrottle: booking given back", slog.String("key", key), slog.Int("n", n))
		},
		RedisError: func(key string, err error) {
			log(slog.LevelWarn, "jobthrottle: redis call failed", slog.String("key", key), slog.Any("err", err))
		},
		Paused: func(key string, d time.Duration) {
			log(slog.LevelInfo, "jobthrottle: paused", slog.String("key", key), slog.Duration("d", d))
		},
		Degraded: func(key string, p FailurePolicy, err error) {
			log(slog.LevelWarn, "jobthrottle: decided without redis", slog.String("key", key), slog.String("policy", p.String()), slog.Any("err", err))
		},
		StateLost: func(key string) {
			log(slog.LevelError, "jobthrottle: state lost (evicted, deleted or failed over): the limit starts afresh", slog.String("key", key))
		},
	}
}

// SlogSemaphoreHooks returns hooks that log a Semaphore's decisions to logger: leases
// acquired, denied, given up and released at Debug; Redis errors, decisions made
// without Redis and lost leases at Warn. Every record carries key and the figures of
// its event (waited, retry_after, held, policy, err). Pass them with
// WithSemaphoreHooks.
func SlogSemaphoreHooks(logger *slog.Logger) SemaphoreHooks {
	ctx := context.Background()
	log := func(level slog.Level, msg string, attrs ...slog.Attr) {
		if logger.Enabled(ctx, level) {
			logger.LogAttrs(ctx, level, msg, attrs...)
		}
	}
	return SemaphoreHooks{
		Acquired: func(key string, waited time.Duration) {
			log(slog.LevelDebug, "jobthrottle: lease acquired", slog.String("key", key), slog.Duration("waited", waited))
		},
		Denied: func(key string, retryAfter time.Duration) {
			log(slog.LevelDebug, "jobthrottle: lease denied", slog.String("key", key), slog.Duration("retry_after", retryAfter))
		},
		GaveUp: func(key string) {
			log(slog.LevelDebug, "jobthrottle: gave up waiting for a lease", slog.String("key", key))
		},
		Released: func(key string, held time.Duration) {
			log(slog.LevelDebug, "jobthrottle: lease released", slog.String("key", key), slog.Duration("held", held))
		},
		LeaseLost: func(key string) {
			log(slog.LevelWarn, "jobthrottle: lease lost", slog.String("key", key))
		},
		RedisError: func(key string, err error) {
			log(slog.LevelWarn, "jobthrottle: redis call failed", slog.String("key", key), slog.Any("err", err))
		},
		Degraded: func(key string, p FailurePolicy, err error) {
			log(slog.LevelWarn, "jobthrottle: decided without redis", slog.String("key", key), slog.String("policy", p.String()), slog.Any("err", err))
		},
	}
}

// JoinHooks returns hooks that call each of hs's hooks in turn, e.g. metrics and logs:
// WithHooks(JoinHooks(m.Hooks(), SlogHooks(logger))). A hook nil in all of them is
// nil in the result.
func JoinHooks(hs ...Hooks) Hooks {
	var j Hooks
	for _, h := range hs {
		j.Allowed = join3(j.Allowed, h.Allowed)
		j.Denied = join3(j.Denied, h.Denied)
		j.Waited = join3(j.Waited, h.Waited)
		j.Cancelled = join2(j.Cancelled, h.Cancelled)
		j.RedisError = join2(j.RedisError, h.RedisError)
		j.Paused = join2(j.Paused, h.Paused)
		j.Degraded = join3(j.Degraded, h.Degraded)
		j.StateLost = join1(j.StateLost, h.StateLost)
	}
	return j
}

func join1[A any](f, g func(A)) func(A) {
	if f == nil {
		return g
	}
	if g == nil {
		return f
	}
	return func(a A) { f(a); g(a) }
}

func join2[A, B any](f, g func(A, B)) func(A, B) {
	if f == nil {
		return g
	}
	if g == nil {
		return f
	}
	return func(a A, b B) { f(a, b); g(a, b) }
}

func join3[A, B, C any](f, g func(A, B, C)) func(A, B, C) {
	if f == nil {
		return g
	}
	if g == nil {
		return f
	}
	return func(a A, b B, c C) { f(a, b, c); g(a, b, c) }
}
