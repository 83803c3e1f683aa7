// Package asynqmetrics exports the asynq middleware's decisions (package asynqmw) as
// Prometheus metrics.
//
// It is apart from package metrics, which counts the limiters' own decisions, so that
// only a user of the middleware has asynq in the build; such a user registers both
// collectors.
package asynqmetrics

import (
	"context"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/x/metrics/internal/vec"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector of the asynq middleware's hand-backs and inline
// sleeps, counted by its hooks. Attach it to the middleware's Setup and register it
// beside a metrics.Collector, whose hooks count the limiters' decisions:
//
//	m, am := metrics.New(), asynqmetrics.New()
//	prometheus.MustRegister(m, am)
//	lim, err := throttle.New(rdb, "vendor-api", limit, throttle.WithHooks(m.Hooks()))
//	jt := asynqmw.New(rdb, asynqmw.WithHooks(am.Hooks()))
//
// Metrics:
//
//	jobthrottle_asynq_handed_back_total{task_type}    tasks the middleware handed back to asynq
//	jobthrottle_asynq_inline_sleep_seconds{task_type} histogram: sleeps in the handler before a task ran
//
// task_type is bounded by the task types of the asynq server.
//
// A Collector is safe for simultaneous use.
type Collector struct {
	handedBack  *prometheus.CounterVec
	inlineSleep *prometheus.HistogramVec
}

// New returns a Collector; register it with a prometheus.Registerer.
func New() *Collector {
	return &Collector{
		handedBack:  vec.Counter("asynq_handed_back_total", "Tasks the asynq middleware handed back to asynq to run at their slot.", "task_type"),
		inlineSleep: vec.Histogram("asynq_inline_sleep_seconds", "Sleeps of the asynq middleware in the handler before a task ran.", "task_type"),
	}
}

// Hooks returns the hooks that count the middleware's hand-backs and inline sleeps;
// pass them with asynqmw.WithHooks.
func (c *Collector) Hooks() asynqmw.Hooks {
	return asynqmw.Hooks{
		Waited: func(_ context.Context, t *asynq.Task, slept time.Duration) {
			c.inlineSleep.WithLabelValues(t.Type()).Observe(slept.Seconds())
		},
		Throttled: func(_ context.Context, t *asynq.Task, _ *asynqmw.ThrottledError) {
			c.handedBack.WithLabelValues(t.Type()).Inc()
		},
	}
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.handedBack.Describe(ch)
	c.inlineSleep.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.handedBack.Collect(ch)
	c.inlineSleep.Collect(ch)
}
