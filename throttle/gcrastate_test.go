package throttle

import (
	"context"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// The token bucket's state is "q1:r1:...:qm:rm:d" in hex (lua/gcra.lua); a key still
// holding the decimal "q1 r1 ... qm rm L" of earlier versions is read as it was meant.
func TestTokenBucketStateFormats(t *testing.T) {
	hex1 := regexp.MustCompile(`^[0-9a-f]+:[0-9a-f]+:[0-9a-f]+$`)
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("format", Limit{Rate: 1, Period: time.Second, Burst: 1}, WithAlgorithm(TokenBucket))
		now := tl.now.UnixMicro()
		// earlier versions: TAT one second ahead, the latest grant now
		if err := b.Client.Set(ctx, l.keys[0], fmt.Sprintf("%d 0 %d", now+1_000_000, now), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		runSteps(t, tl, l, []step{
			{0, 1, Result{false, 0, time.Second, time.Second}},    // the decimal state is read
			{time.Second, 1, Result{true, 0, 0, time.Second}},     // and rewritten in hex
			{1500 * ms, 1, Result{false, 0, 500 * ms, 500 * ms}},  // which is read back
			{2 * time.Second, 1, Result{true, 0, 0, time.Second}}, //
			{2200 * ms, 0, Result{true, 0, 0, 800 * ms}},          // a read
			{4 * time.Second, 1, Result{true, 0, 0, time.Second}}, // after a full bucket
			{4999 * ms, 1, Result{false, 0, 1 * ms, 1 * ms}},      //
		})
		v := b.Client.Get(ctx, l.keys[0]).Val()
		if !hex1.MatchString(v) {
			t.Fatalf("state %q, want hex q:r:d", v)
		}

		// two limits: the hex state of several limits is read back too
		l2 := tl.limiter("format2", Limit{Rate: 2, Period: time.Second, Burst: 2}, WithAlgorithm(TokenBucket), WithLimits(Limit{Rate: 3, Period: 10 * time.Second, Burst: 3}))
		runSteps(t, tl, l2, []step{
			{5 * time.Second, 2, Result{true, 0, 0, 6666667 * time.Microsecond}},                // TATs +1s and +20/3s
			{5500 * ms, 1, Result{true, 0, 0, 9500 * ms}},                                       // both conform
			{6 * time.Second, 1, Result{false, 0, 2333334 * time.Microsecond, 9 * time.Second}}, // the second limit
		})
	})
}
