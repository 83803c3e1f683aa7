package throttle

import "github.com/jobthrottle/jobthrottle/lua"

// slidingWindow runs lua/slidingwindow.lua: ARGV m, then rate and period_us per limit.
var slidingWindow = algo{
	suffix: "sw",
	script: lua.SlidingWindow.Script(),
	args:   func(limits []Limit, _ *config) []any { return rateArgs(limits) },
	maxN:   maxRateN,
}
