//go:build race

package asynqmw_test

// raceEnabled reports whether the tests run under the race detector, which slows
// every goroutine several times over: timed goals are reported, not judged, then.
const raceEnabled = true
