package throttle

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// The token bucket's state is "q1:r1:...:qm:rm:d" in hex (lua/gcra.lua): written, read
// back, for one limit and several; any other text is refused (ErrCorruptState).
func TestTokenBucketStateFormats(t *testing.T) {
	hex1 := regexp.MustCompile(`^[0-9a-f]+:[0-9a-f]+:[0-9a-f]+$`)
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		l := tl.limiter("format", Limit{Rate: 1, Period: time.Second, Burst: 1}, WithAlgorithm(TokenBucket))
		now := tl.now.UnixMicro()
		runSteps(t, tl, l, []step{
			{0, 1, Result{true, 0, 0, time.Second}},               // the state is written in hex
			{time.Second, 1, Result{true, 0, 0, time.Second}},     //
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
		// a decimal "q r L" (no release ever wrote one) is not the token bucket's state
		l3 := tl.limiter("format3", Limit{Rate: 1, Period: time.Second, Burst: 1}, WithAlgorithm(TokenBucket))
		if err := b.Client.Set(ctx, l3.keys[0], fmt.Sprintf("%d 0 %d", now+1_000_000, now), time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := l3.AllowN(ctx, 1); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("decimal state: %v, want ErrCorruptState", err)
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
