//go:build !race

package throttle

// raceEnabled reports whether the tests run with the race detector, which makes
// allocation counts meaningless (sync.Pool drops what it is given at random).
const raceEnabled = false
