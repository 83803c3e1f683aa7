package throttle_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/jobthrottle/jobthrottle/throttle"
)

// An operator's tool reads which algorithm and limits a key's processes use from the
// key's record, which they write along with their calls.
func ExampleReadRecord() {
	rdb, done := frozenRedis()
	defer done()
	ctx := context.Background()

	// a process of the fleet
	lim, err := throttle.New(rdb, "vendor-api", throttle.Limit{Rate: 20, Period: 1100 * time.Millisecond},
		throttle.WithLimits(throttle.PerHour(5000)))
	if err != nil {
		log.Fatal(err)
	}
	if _, err := lim.Allow(ctx); err != nil {
		log.Fatal(err)
	}

	// the tool, elsewhere
	rec, err := throttle.ReadRecord(ctx, rdb, "vendor-api")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(rec.Algorithm, rec.Limits)
	// Output: SlidingWindow [20 per 1.1s 5000 per 1h0m0s]
}
