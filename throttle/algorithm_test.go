package throttle

import (
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

// Each Algorithm names itself by its head's tag in the state it keeps (so one that meets
// another's state knows it); the log script serves SlidingWindow (an exact log) and
// SlidingCounter (sub-buckets), the others a script each.
func TestAlgorithmRunsItsScript(t *testing.T) {
	want := map[Algorithm]struct {
		tag    string
		script *script
	}{
		SlidingWindow:  {"sw", logScript},
		SlidingCounter: {"sc", logScript},
		TokenBucket:    {"tb", bucketScript},
		FixedWindow:    {"fw", windowScript},
	}
	for _, alg := range allAlgorithms {
		a := alg.algo()
		if a.tag != want[alg].tag || a.script != want[alg].script {
			t.Errorf("%v: tag %q, script %s; want %q, %s", alg, a.tag, a.script.sha, want[alg].tag, want[alg].script.sha)
		}
	}
	if logScript.sha == bucketScript.sha || logScript.sha == windowScript.sha || bucketScript.sha == windowScript.sha {
		t.Error("two algorithms' scripts have the same SHA")
	}
}

// head is what the limiter sends as ARGV[1]: the tag, the counter's buckets, then rate
// and period_us per limit (and the burst for the token bucket), in order.
func TestLimitHead(t *testing.T) {
	limits := []Limit{{Rate: 5, Period: time.Second}, {Rate: 1000, Period: time.Hour, Burst: 1200}, {Rate: 1, Period: 1500 * time.Nanosecond}}
	for _, c := range []struct {
		alg  Algorithm
		want string
	}{
		{SlidingWindow, "sw 5 1000000 1000 3600000000 1 2"},
		{SlidingCounter, "sc 50 5 1000000 1000 3600000000 1 2"},
		{TokenBucket, "tb 5 1000000 5 1000 3600000000 1200 1 2 1"},
		{FixedWindow, "fw 5 1000000 1000 3600000000 1 2"},
	} {
		if got := c.alg.algo().head(limits, defaultBuckets).String(); got != c.want {
			t.Errorf("%v: head = %q, want %q", c.alg, got, c.want)
		}
	}
}
