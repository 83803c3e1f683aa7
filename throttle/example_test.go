package throttle_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// frozenRedis is an embedded Redis whose clock stands still, so the examples' output
// does not depend on how fast they run.
func frozenRedis() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	mr.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { rdb.Close(); mr.Close() }
}

func ExampleLimiter_Allow() {
	rdb, done := frozenRedis()
	defer done()
	ctx := context.Background()

	lim, err := throttle.New(rdb, "vendor-api", throttle.PerSecond(2))
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		res, err := lim.Allow(ctx)
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("allowed=%v remaining=%d retry after %v\n", res.Allowed, res.Remaining, res.RetryAfter)
	}
	// Output:
	// allowed=true remaining=1 retry after 0s
	// allowed=true remaining=0 retry after 0s
	// allowed=false remaining=0 retry after 1s
}

// A worker loop: every process running it shares the 100 calls a minute.
func ExampleLimiter_Wait() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	lim, err := throttle.New(rdb, "vendor-api", throttle.PerMinute(100))
	if err != nil {
		log.Fatal(err)
	}
	ctx := context.Background()
	for job := range jobs() {
		if err := lim.Wait(ctx); err != nil {
			log.Printf("not sending job %d: %v", job, err)
			continue
		}
		send(job)
	}
}

func jobs() <-chan int { return nil }
func send(int)         {}

func ExampleLimiter_Reserve() {
	rdb, done := frozenRedis()
	defer done()
	ctx := context.Background()

	lim, err := throttle.New(rdb, "reports", throttle.PerSecond(1))
	if err != nil {
		log.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		// book a slot if one comes within 1.5s
		r, err := lim.Reserve(ctx, 1, 1500*time.Millisecond)
		if err != nil {
			log.Fatal(err)
		}
		// Delay counts from now (as golang.org/x/time/rate's): a few µs have passed
		fmt.Printf("booked=%v in %v\n", r.OK(), r.Delay().Round(time.Millisecond))
	}
	// Output:
	// booked=true in 0s
	// booked=true in 1s
	// booked=false in 2s
}

// Book a slot, decide, then wait for it or give it back. Wait needs no loop: if this
// process pauses the key meanwhile, it books again by itself.
func ExampleLimiter_Reserve_wait() {
	rdb := redis.NewClient(&redis.Options{Addr: "localhost:6379"})
	ctx := context.Background()
	lim, err := throttle.New(rdb, "reports", throttle.PerMinute(30))
	if err != nil {
		log.Fatal(err)
	}
	r, err := lim.Reserve(ctx, 1, time.Minute)
	if err != nil || !r.OK() {
		log.Printf("no slot within a minute: %v", err)
		return
	}
	prepare() // work done meanwhile counts: Delay is what is left
	if r.Delay() > 30*time.Second {
		_ = r.Cancel(ctx) // too late for this report: give the slot back
		return
	}
	if err := r.Wait(ctx); err != nil {
		log.Print(err)
		return
	}
	send(1)
}

func prepare() {}

// "10 per second and 500 per hour" on one key: one atomic call checks both and takes
// from both or from neither.
func ExampleWithLimits() {
	rdb, done := frozenRedis()
	defer done()
	ctx := context.Background()

	lim, err := throttle.New(rdb, "tenant-42:email", throttle.PerSecond(10),
		throttle.WithLimits(throttle.PerHour(12)))
	if err != nil {
		log.Fatal(err)
	}
	res, _ := lim.AllowN(ctx, 10)
	fmt.Println(res.Allowed, res.Remaining)
	res, _ = lim.AllowN(ctx, 3) // the hourly limit has 2 left
	fmt.Println(res.Allowed, res.Remaining, res.RetryAfter)
	// Output:
	// true 0
	// false 0 1h0m0s
}

func ExampleWithAlgorithm() {
	rdb, done := frozenRedis()
	defer done()
	ctx := context.Background()

	// a token bucket: 5 at once, then one every 200ms
	lim, err := throttle.New(rdb, "emails", throttle.Limit{Rate: 5, Period: time.Second, Burst: 5},
		throttle.WithAlgorithm(throttle.TokenBucket))
	if err != nil {
		log.Fatal(err)
	}
	res, _ := lim.AllowN(ctx, 5)
	fmt.Println(res.Allowed, res.ResetAfter)
	res, _ = lim.Allow(ctx)
	fmt.Println(res.Allowed, res.RetryAfter)
	// Output:
	// true 1s
	// false 200ms
}
