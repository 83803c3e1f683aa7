package throttle

import "github.com/jobthrottle/jobthrottle/lua"

// fixedWindow runs lua/fixedwindow.lua: ARGV m, then rate and period_us per limit.
var fixedWindow = algo{
	suffix: "fw",
	script: lua.FixedWindow.Script(),
	args:   func(limits []Limit, _ *config) []any { return rateArgs(limits) },
	maxN:   maxRateN,
}
