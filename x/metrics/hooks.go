package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Hooks returns the hooks that count a Limiter's decisions; pass them with
// throttle.WithHooks.
func (c *Collector) Hooks() throttle.Hooks {
	return throttle.Hooks{
		Allowed: func(key string, n int, _ time.Duration) {
			k := c.label(key)
			c.requests.WithLabelValues(k, ResultAcquired).Inc()
			c.permits.WithLabelValues(k, ResultAcquired).Add(float64(n))
		},
		Denied: func(key string, n int, _ throttle.Result) {
			k := c.label(key)
			c.requests.WithLabelValues(k, ResultLimited).Inc()
			c.permits.WithLabelValues(k, ResultLimited).Add(float64(n))
		},
		Cancelled: func(key string, n int) {
			k := c.label(key)
			c.requests.WithLabelValues(k, ResultCanceled).Inc()
			c.permits.WithLabelValues(k, ResultCanceled).Add(float64(n))
		},
		Waited: func(key string, _ int, waited time.Duration) {
			c.wait.WithLabelValues(c.label(key)).Observe(waited.Seconds())
		},
		RedisError: func(key string, _ error) {
			c.redisErrors.WithLabelValues(c.label(key)).Inc()
		},
		Paused: func(key string, _ time.Duration) {
			c.pauses.WithLabelValues(c.label(key)).Inc()
		},
		Degraded: func(key string, p throttle.FailurePolicy, _ error) {
			c.degraded.WithLabelValues(c.label(key), p.String()).Inc()
		},
		StateLost: func(key string) {
			c.stateLost.WithLabelValues(c.label(key)).Inc()
		},
	}
}

// SemaphoreHooks returns the hooks that count a Semaphore's decisions (a lease is one
// permit: acquired, limited when TryAcquire is denied, canceled when Acquire gives up;
// the wait of Acquire in the queue-wait histogram); pass them with
// throttle.WithSemaphoreHooks.
func (c *Collector) SemaphoreHooks() throttle.SemaphoreHooks {
	count := func(key, result string) {
		k := c.label(key)
		c.requests.WithLabelValues(k, result).Inc()
		c.permits.WithLabelValues(k, result).Inc()
	}
	return throttle.SemaphoreHooks{
		Acquired: func(key string, waited time.Duration) {
			count(key, ResultAcquired)
			if waited > 0 {
				c.wait.WithLabelValues(c.label(key)).Observe(waited.Seconds())
			}
		},
		Denied: func(key string, _ time.Duration) { count(key, ResultLimited) },
		GaveUp: func(key string) { count(key, ResultCanceled) },
		LeaseLost: func(key string) {
			c.leasesLost.WithLabelValues(c.label(key)).Inc()
		},
		RedisError: func(key string, _ error) {
			c.redisErrors.WithLabelValues(c.label(key)).Inc()
		},
		Degraded: func(key string, p throttle.FailurePolicy, _ error) {
			c.degraded.WithLabelValues(c.label(key), p.String()).Inc()
		},
	}
}

// TransportHooks returns the hooks that count the HTTP transport's pauses and the
// requests it did not send; pass them with waiter.WithTransportHooks.
func (c *Collector) TransportHooks() waiter.TransportHooks {
	return waiter.TransportHooks{
		Paused: func(req *http.Request, status int, _ time.Duration) {
			c.transportPauses.WithLabelValues(req.URL.Host, strconv.Itoa(status)).Inc()
		},
		NotSent: func(req *http.Request, _ error) {
			c.notSent.WithLabelValues(req.URL.Host).Inc()
		},
	}
}
