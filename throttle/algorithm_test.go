package throttle

import (
	"slices"
	"testing"
	"time"
)

func TestAlgorithmString(t *testing.T) {
	for a, want := range map[Algorithm]string{
		SlidingWindow:  "SlidingWindow",
		TokenBucket:    "TokenBucket",
		FixedWindow:    "FixedWindow",
		SlidingCounter: "SlidingCounter",
		Algorithm(4):   "Algorithm(4)",
		Algorithm(-1):  "Algorithm(-1)",
	} {
		if got := a.String(); got != want {
			t.Errorf("Algorithm(%d).String() = %q, want %q", int(a), got, want)
		}
	}
}

// Each Algorithm runs its own script on its own state key, so two algorithms on one
// key never read each other's state; an unknown one is the default, SlidingWindow.
func TestAlgorithmRunsItsScript(t *testing.T) {
	suffixes := map[Algorithm]string{SlidingWindow: "sw", TokenBucket: "tb", FixedWindow: "fw", SlidingCounter: "sc"}
	scripts := map[string]Algorithm{}
	for _, alg := range allAlgorithms {
		a := alg.algo()
		if a.suffix != suffixes[alg] {
			t.Errorf("%v keeps its state under suffix %q, want %q", alg, a.suffix, suffixes[alg])
		}
		if other, ok := scripts[a.script.Hash()]; ok {
			t.Errorf("%v and %v run the same script", alg, other)
		}
		scripts[a.script.Hash()] = alg
	}
	if got := Algorithm(9).algo().suffix; got != "sw" {
		t.Errorf("Algorithm(9) runs on suffix %q, want the default's, sw", got)
	}
}

// rateArgs is the ARGV tail of the log and window scripts: m, then rate and period_us
// per limit, in order.
func TestRateArgs(t *testing.T) {
	got := rateArgs([]Limit{{Rate: 5, Period: time.Second}, {Rate: 1000, Period: time.Hour}, {Rate: 1, Period: 1500 * time.Nanosecond}})
	want := []any{3, 5, int64(1_000_000), 1000, int64(3_600_000_000), 1, int64(2)}
	if !slices.Equal(got, want) {
		t.Fatalf("rateArgs = %v, want %v", got, want)
	}
}
