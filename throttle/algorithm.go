package throttle

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Algorithm selects how a Limiter counts.
type Algorithm int

const (
	// SlidingWindow is the default: a log of grants (Redisson's RRateLimiter, done
	// right). At most Rate permits take effect in any window of Period, exactly; a
	// denied caller is told the exact time until enough permits have left the window.
	// Memory: one list entry (about 16 bytes) per grant in the longest period.
	SlidingWindow Algorithm = iota

	// TokenBucket is GCRA: Burst permits at once after an idle spell, then Rate per
	// Period, evenly spaced. O(1) state (one short string). Decisions match
	// golang.org/x/time/rate with the same rate and burst.
	TokenBucket

	// FixedWindow counts permits per aligned window (windows start at multiples of
	// Period since the Unix epoch). O(1) state, but up to 2 × Rate can pass around a
	// window boundary.
	FixedWindow

	// SlidingCounter keeps counters per sub-bucket (see WithBuckets): never more than
	// Rate in any Period, memory bounded by the number of buckets, at the price of
	// holding a permit up to one bucket longer than Period.
	SlidingCounter
)

// String returns the algorithm's name, as in "SlidingWindow".
func (a Algorithm) String() string {
	switch a {
	case SlidingWindow:
		return "SlidingWindow"
	case TokenBucket:
		return "TokenBucket"
	case FixedWindow:
		return "FixedWindow"
	case SlidingCounter:
		return "SlidingCounter"
	}
	return fmt.Sprintf("Algorithm(%d)", int(a))
}

// algo is how a Limiter runs one algorithm: its script, the suffix of its state key, the
// ARGV it sends after op, n and waitOrToken, and the largest n it can grant.
type algo struct {
	suffix string
	script *redis.Script
	args   func(limits []Limit, c *config) []any
	maxN   func(l Limit) int
}

func (a Algorithm) algo() algo {
	switch a {
	case TokenBucket:
		return tokenBucket
	case FixedWindow:
		return fixedWindow
	case SlidingCounter:
		return slidingCounter
	}
	return slidingWindow
}

// rateArgs is the ARGV tail shared by the log and window scripts: m, then rate and
// period_us per limit.
func rateArgs(limits []Limit) []any {
	args := make([]any, 0, 1+2*len(limits))
	args = append(args, len(limits))
	for _, l := range limits {
		args = append(args, l.Rate, l.periodMicros())
	}
	return args
}

func maxRateN(l Limit) int { return l.Rate }
