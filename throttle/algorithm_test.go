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
			t.Errorf("Algorithm(%d).String(): got %q, want %q", int(a), got, want)
		}
	}
}

// Each Algorithm keeps its state under a key of its own, so two algorithms on one key
// never read each other's state; the log script serves SlidingWindow (sub-bucket 0, an
// exact log) and SlidingCounter (sub-buckets), the others a script each.
func TestAlgorithmRunsItsScript(t *testing.T) {
	want := map[Algorithm]struct {
		suffix string
		script *script
	}{
		SlidingWindow:  {"sw", logScript},
		SlidingCounter: {"sc", logScript},
		TokenBucket:    {"tb", bucketScript},
		FixedWindow:    {"fw", windowScript},
	}
	for _, alg := range allAlgorithms {
		a := alg.algo()
		if a.suffix != want[alg].suffix || a.script != want[alg].script {
			t.Errorf("%v: suffix %q, script %s; want %q, %s", alg, a.suffix, a.script.sha, want[alg].suffix, want[alg].script.sha)
		}
	}
	if logScript.sha == bucketScript.sha || logScript.sha == windowScript.sha || bucketScript.sha == windowScript.sha {
		t.Error("two algorithms' scripts have the same SHA")
	}
	// the others' state keys, which a grant that creates the state checks are absent
	for _, alg := range allAlgorithms {
		got := alg.algo().otherStates("{p:k}")
		if len(got) != 3 || slices.Contains(got, "{p:k}:"+want[alg].suffix) {
			t.Errorf("%v: other states %v, want the three others'", alg, got)
		}
	}
}

// args is the ARGV after the requests: m, then rate and period_us per limit (and the
// burst for the token bucket), in order, then the algorithm's parameters (the log's
// sub-bucket: 0 for the exact sliding window).
func TestLimitArgs(t *testing.T) {
	limits := []Limit{{Rate: 5, Period: time.Second}, {Rate: 1000, Period: time.Hour, Burst: 1200}, {Rate: 1, Period: 1500 * time.Nanosecond}}
	for _, c := range []struct {
		alg  Algorithm
		want []any
	}{
		{SlidingWindow, []any{3, 5, int64(1_000_000), 1000, int64(3_600_000_000), 1, int64(2), 0}},
		{TokenBucket, []any{3, 5, int64(1_000_000), 5, 1000, int64(3_600_000_000), 1200, 1, int64(2), 1}},
		{FixedWindow, []any{3, 5, int64(1_000_000), 1000, int64(3_600_000_000), 1, int64(2)}},
	} {
		if got := c.alg.algo().args(limits, defaultBuckets); !slices.Equal(got, c.want) {
			t.Errorf("%v: args = %v, want %v", c.alg, got, c.want)
		}
	}
}
