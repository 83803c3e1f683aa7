package rivermw_test

import (
	"context"
	"encoding/json"
	"log"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/river/rivermw"
	"github.com/redis/go-redis/v9"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivertype"
)

type VendorCallArgs struct {
	Customer string `json:"customer"`
}

func (VendorCallArgs) Kind() string { return "vendor_call" }

// A River client whose vendor_call jobs, on every client sharing the limiter's Redis
// key, call the vendor at most 10 times a second; other kinds run unthrottled (the
// README's River section).
func Example() {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	pool, err := pgxpool.New(ctx, "postgres:///app")
	if err != nil {
		log.Fatal(err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, j *river.Job[VendorCallArgs]) error {
		return nil // call the vendor for j.Args.Customer
	}))
	queues := map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 10}}

	// What throttling the kind takes: a limiter, a Setup, its Config around the
	// client's config, and its middleware for the kind.
	lim, err := throttle.New(rdb, "vendor-api", throttle.PerSecond(10))
	if err != nil {
		log.Fatal(err)
	}
	jt := rivermw.New()
	config := jt.Config(&river.Config{Queues: queues, Workers: workers,
		Middleware: []rivertype.Middleware{jt.Throttle(lim, VendorCallArgs{}.Kind())}})

	client, err := river.NewClient(riverpgxv5.New(pool), config)
	if err != nil {
		log.Fatal(err)
	}
	if err := client.Start(ctx); err != nil {
		log.Fatal(err)
	}
}

// A limiter per tenant, chosen from the job's args: ThrottleFunc's pick returns nil
// for jobs that are not limited.
func ExampleSetup_ThrottleFunc() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	limits := map[string]*throttle.Limiter{}
	for _, tenant := range []string{"acme", "globex"} {
		lim, err := throttle.New(rdb, "vendor-api:"+tenant, throttle.PerMinute(600))
		if err != nil {
			log.Fatal(err)
		}
		limits[tenant] = lim
	}
	jt := rivermw.New()
	_ = jt.ThrottleFunc(func(_ context.Context, job *rivertype.JobRow) (*throttle.Limiter, error) {
		if job.Kind != (VendorCallArgs{}).Kind() {
			return nil, nil
		}
		var args VendorCallArgs
		if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
			return nil, err
		}
		return limits[args.Customer], nil
	})
}
