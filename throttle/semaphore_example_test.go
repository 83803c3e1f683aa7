package throttle_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// At most two reports run at once across the fleet: a third caller learns how long
// until a slot frees by itself, and Do waits for one, renews it while the work runs
// and releases it after.
func ExampleSemaphore() {
	rdb, done := frozenRedis()
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
