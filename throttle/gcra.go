package throttle

import "github.com/jobthrottle/jobthrottle/lua"

// tokenBucket runs lua/gcra.lua: ARGV m, then rate, period_us and burst per limit.
var tokenBucket = algo{
	suffix: "tb",
	script: lua.GCRA.Script(),
	args: func(limits []Limit, _ *config) []any {
		args := make([]any, 0, 1+3*len(limits))
		args = append(args, len(limits))
		for _, l := range limits {
			args = append(args, l.Rate, l.periodMicros(), l.burst())
		}
		return args
	},
	maxN: func(l Limit) int { return l.burst() },
}
