package asynqmw_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// Every worker process that runs this shares the vendor's 600 calls a minute for one
// task type: one go-redis client for asynq and the limiter, and one asynqmw.Setup
// that supplies the middleware and fills in the server's Config. Other task types
// of the mux are not limited. The server runs at most 20 handlers at once; tasks
// asleep for their permits hold a worker each, at most 10 of them
// (MaxSleepingWorkers' default, half the Concurrency).
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	lim, err := throttle.New(rdb, "vendor-api", throttle.PerMinute(600))
	if err != nil {
		log.Fatal(err)
	}
	jt := asynqmw.New(rdb)
	srv := asynq.NewServerFromRedisClient(rdb, jt.Config(asynq.Config{
		Concurrency: 20,
		ErrorHandler: asynq.ErrorHandlerFunc(func(ctx context.Context, t *asynq.Task, err error) {
			log.Printf("task %s failed: %v", t.Type(), err) // throttling is not reported here
		}),
	}))
	mux := asynq.NewServeMux()
	mux.Handle("vendor:call", jt.Throttle(lim)(asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		return nil // call the vendor: the permit is taken
	})))
	mux.HandleFunc("report:build", func(ctx context.Context, t *asynq.Task) error {
		return nil // not limited
	})
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}

// A limit per tenant: 10 mails a second each, the tenant read from the payload.
func ExampleSetup_ThrottleFunc() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	pick := func(ctx context.Context, t *asynq.Task) (*throttle.Limiter, error) {
		var p struct{ Tenant string }
		if err := json.Unmarshal(t.Payload(), &p); err != nil {
			return nil, fmt.Errorf("reading the tenant: %w", err) // a failure: asynq retries the task
		}
		return throttle.New(rdb, "mail:"+p.Tenant, throttle.PerSecond(10))
	}
	jt := asynqmw.New(rdb)
	srv := asynq.NewServerFromRedisClient(rdb, jt.Config(asynq.Config{Concurrency: 10}))
	mux := asynq.NewServeMux()
	mux.Use(jt.ThrottleFunc(pick))
	_, _ = srv, mux
}

// What a Throttled hook, or a middleware outside the Setup's, sees of a task handed
// back.
func ExampleThrottledError() {
	err := fmt.Errorf("handler: %w", &asynqmw.ThrottledError{RetryIn: 7300 * time.Millisecond, Key: "vendor-api", Limit: "20 per 1s"})
	var te *asynqmw.ThrottledError
	if errors.As(err, &te) {
		fmt.Println(te.RetryIn, te.Key)
	}
	fmt.Println(err)
	fmt.Println("throttled:", asynqmw.IsThrottled(err))
	// Output:
	// 7.3s vendor-api
	// handler: asynqmw: throttled by "vendor-api" (20 per 1s): retry in 7.3s
	// throttled: true
}
