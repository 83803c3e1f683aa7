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

// semaphoreExampleRedis is an embedded Redis whose clock stands still, so the
// example's output does not depend on how fast it runs.
func semaphoreExampleRedis() (*redis.Client, func()) {
	mr, err := miniredis.Run()
	if err != nil {
		log.Fatal(err)
	}
	mr.SetTime(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	return rdb, func() { rdb.Close(); mr.Close() }
}

// At most two reports run at once across the fleet: a third caller learns how long
// until a slot frees by itself, and Do waits for one, renews it while the work runs
// and releases it after.
func ExampleSemaphore() {
	rdb, done := semaphoreExampleRedis()
	defer done()
	ctx := context.Background()

	sem, err := throttle.NewSemaphore(rdb, "reports", 2, throttle.WithLeaseTTL(time.Minute))
	if err != nil {
		log.Fatal(err)
	}
	a, _, _ := sem.TryAcquire(ctx)
	b, _, _ := sem.TryAcquire(ctx)
	lease, wait, err := sem.TryAcquire(ctx)
	fmt.Println("third lease:", lease, "wait:", wait, err)

	_ = a.Release(ctx) // frees a slot at once
	err = sem.Do(ctx, func(ctx context.Context) error {
		fmt.Println("running a report")
		return nil
	})
	fmt.Println("done:", err)
	_ = b.Release(ctx)
	// Output:
	// third lease: <nil> wait: 1m0s <nil>
	// running a report
	// done: <nil>
}
