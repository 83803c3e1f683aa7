package lua

import (
	"context"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// A state needed for a millisecond or less is written with PEXPIRE 1, which Redis 7.0
// can count as over at once (about once in 10^4 calls on a loaded machine; the clock it
// takes for PEXPIRE can lag the script's by a millisecond or two): the key is gone the
// moment its TTL is set. The permit log sets its TTL last, after every read, so such a
// grant still gets its answer; it used to read its own entry back, find nothing and
// fail with JTSTATE. 10k grants of one permit per µs, back to back, per log script, on
// the real server's clock.
func TestStateOfAMillisecondOnRealRedis(t *testing.T) {
	b := redistest.NewStandalone(t)
	ctx := context.Background()
	for _, sc := range []struct {
		name string
		run  func(keys []string) error
	}{
		{"slidingwindow", func(keys []string) error {
			return SlidingWindow.Script().Run(ctx, b.Client, keys, 0, 1, 0, 1, 1, 1).Err()
		}},
		{"slidingcounter", func(keys []string) error {
			return SlidingCounter.Script().Run(ctx, b.Client, keys, 0, 1, 0, 1, 1, 1, 1).Err()
		}},
	} {
		tag := "{" + b.Prefix + sc.name + "}"
		keys := []string{tag + ":state", tag + ":pause"}
		for i := 0; i < 10_000; i++ {
			if err := sc.run(keys); err != nil {
				t.Fatalf("%s, grant %d: %v", sc.name, i, err)
			}
		}
	}
}
