package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
)

// What denied a request, the "reason" label of a limited one.
const (
	reasonLimit = "limit" // the limiter's limits, a semaphore's Max, a pause
	reasonCap   = "cap"   // a tenant's own caps (Result.ByCap)
	reasonTurn  = "turn"  // a tenant's fair turn had not come (Result.Turn)
)

// count counts a request of n permits with its outcome and, for a denial, its reason.
func (c *Collector) count(key, result, reason string, n int) {
	k := c.label(key)
	c.requests.WithLabelValues(k, result, reason).Inc()
	c.permits.WithLabelValues(k, result, reason).Add(float64(n))
}

// Hooks returns the hooks that count a Limiter's decisions, a tenant's by what denied
// them, and the limits other processes enforce on its key; pass them with
// throttle.WithHooks.
func (c *Collector) Hooks() throttle.Hooks {
	return throttle.Hooks{
		Allowed: func(key string, n int, _ time.Duration) { c.count(key, ResultAcquired, "", n) },
		Denied: func(key string, n int, r throttle.Result) {
			reason := reasonLimit
			if r.ByCap {
				reason = reasonCap
			} else if r.Turn {
				reason = reasonTurn
			}
			c.count(key, ResultLimited, reason, n)
		},
		Cancelled: func(key string, n int) { c.count(key, ResultCanceled, "", n) },
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
		LimitsDrift: func(key string, _, _ []throttle.Limit) {
			c.drift.WithLabelValues(c.label(key)).Inc()
		},
	}
}

// SemaphoreHooks returns the hooks that count a Semaphore's decisions (a lease is one
// permit: acquired, limited when TryAcquire is denied, canceled when Acquire gives up;
// the wait of Acquire in the queue-wait histogram); pass them with
// throttle.WithSemaphoreHooks.
func (c *Collector) SemaphoreHooks() throttle.SemaphoreHooks {
	return throttle.SemaphoreHooks{
		Acquired: func(key string, waited time.Duration) {
			c.count(key, ResultAcquired, "", 1)
			if waited > 0 {
				c.wait.WithLabelValues(c.label(key)).Observe(waited.Seconds())
			}
		},
		Denied: func(key string, _ time.Duration) { c.count(key, ResultLimited, reasonLimit, 1) },
		GaveUp: func(key string) { c.count(key, ResultCanceled, "", 1) },
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
