package throttle

import "github.com/jobthrottle/jobthrottle/lua"

// slidingCounter runs lua/slidingcounter.lua: ARGV m, bucket_us (the shortest period
// split into the configured number of buckets, rounded up), then rate and period_us per
// limit.
var slidingCounter = algo{
	suffix: "sc",
	script: lua.SlidingCounter.Script(),
	args: func(limits []Limit, c *config) []any {
		shortest := limits[0].periodMicros()
		for _, l := range limits[1:] {
			shortest = min(shortest, l.periodMicros())
		}
		bucket := (shortest + int64(c.buckets) - 1) / int64(c.buckets)
		tail := rateArgs(limits)
		return append([]any{tail[0], bucket}, tail[1:]...)
	},
	maxN: maxRateN,
}
