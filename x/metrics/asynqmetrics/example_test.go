package asynqmetrics_test

import (
	"context"
	"log"
	"net/http"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/metrics"
	"github.com/jobthrottle/jobthrottle/x/metrics/asynqmetrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
)

// An asynq worker's metrics: the limiter's decisions and live state from
// metrics.Collector, the middleware's hand-backs and inline sleeps from
// asynqmetrics.Collector, both served on /metrics.
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	m, am := metrics.New(), asynqmetrics.New()
	prometheus.MustRegister(m, am)
	lim, err := throttle.New(rdb, "vendor-api", throttle.PerMinute(600), throttle.WithHooks(m.Hooks()))
	if err != nil {
		log.Fatal(err)
	}
	m.Watch(lim)
	jt := asynqmw.New(rdb, asynqmw.WithHooks(am.Hooks()))
	srv := asynq.NewServerFromRedisClient(rdb, jt.Config(asynq.Config{Concurrency: 20}))
	mux := asynq.NewServeMux()
	mux.Use(jt.Throttle(lim))
	mux.HandleFunc("vendor:call", func(ctx context.Context, t *asynq.Task) error {
		return nil // call the vendor: the permit is taken
	})
	go func() { log.Fatal(http.ListenAndServe(":2112", promhttp.Handler())) }()
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}
