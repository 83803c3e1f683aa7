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

// Every worker process that runs this shares the vendor's 600 calls a minute: one
// go-redis client for asynq and the limiter, and one asynqmw.Setup built from it that
// supplies the middleware and fills in the server's Config.
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
	mux.Use(jt.Throttle(lim))
	mux.HandleFunc("vendor:call", func(ctx context.Context, t *asynq.Task) error {
		return nil // call the vendor: the permit is taken
	})
	if err := srv.Run(mux); err != nil {
		log.Fatal(err)
	}
}

// A limit per tenant: 10 mails a second each, the tenant read from the payload.
func ExampleThrottleFunc() {
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

// What asynq sees when a task is throttled for longer than MaxInlineWait.
func ExampleThrottledError() {
	err := fmt.Errorf("handler: %w", &asynqmw.ThrottledError{RetryIn: 7300 * time.Millisecond, Key: "vendor-api", Limit: "20 per 1s"})
	var te *asynqmw.ThrottledError
	if errors.As(err, &te) {
		fmt.Println(te.RetryIn, te.Key)
	}
	fmt.Println(err)
	fmt.Println("failure:", asynqmw.IsFailure(err))
	// Output:
	// 7.3s vendor-api
	// handler: asynqmw: throttled by "vendor-api" (20 per 1s): retry in 7.3s
	// failure: false
}
