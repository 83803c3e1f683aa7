package throttle

import (
	"testing"
	"time"
)

// Every option fits the constructors it configures and no other: one given to the
// wrong constructor does not compile (shown here by its type), never is ignored.
func TestOptionsFitTheirConstructors(t *testing.T) {
	cases := []struct {
		name             string
		opt              any
		limiter, semaphr bool
	}{
		{"WithAlgorithm", WithAlgorithm(TokenBucket), true, false},
		{"WithLimits", WithLimits(PerHour(5)), true, false},
		{"WithBuckets", WithBuckets(10), true, false},
		{"WithHooks", WithHooks(Hooks{}), true, false},
		{"WithLeaseTTL", WithLeaseTTL(time.Second), false, true},
		{"WithSemaphoreHooks", WithSemaphoreHooks(SemaphoreHooks{}), false, true},
		{"WithKeyPrefix", WithKeyPrefix("p:"), true, true},
		{"WithFailurePolicy", WithFailurePolicy(FailOpen), true, true},
		{"WithCallTimeout", WithCallTimeout(time.Second), true, true},
	}
	for _, c := range cases {
		_, lim := c.opt.(Option)
		_, sem := c.opt.(SemaphoreOption)
		if lim != c.limiter || sem != c.semaphr {
			t.Errorf("%s: an Option %v, a SemaphoreOption %v; want %v, %v", c.name, lim, sem, c.limiter, c.semaphr)
		}
	}
}
