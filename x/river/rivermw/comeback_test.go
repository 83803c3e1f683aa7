package rivermw

import (
	"strconv"
	"testing"
	"time"
)

// The come-back margin starts at the poll interval and 20ms, follows the 90th
// percentile of how late this client's snoozed jobs came back after they were due, and
// stays within half a second above where it started. No timing: the returns are given
// their times.
func TestComeBackLearnsLateness(t *testing.T) {
	const interval = 1100 * time.Millisecond
	var cb comeBack
	if got, want := cb.early(interval), 1120*time.Millisecond; got != want {
		t.Fatalf("margin before any return: %v, want %v", got, want)
	}
	t0 := time.Unix(1_000_000, 0)
	back := func(id string, late time.Duration) {
		t.Helper()
		// snoozed at t0 for 2.5s, its slot 3.62s ahead
		cb.snoozed(id, "k", t0, 2500*time.Millisecond, 3620*time.Millisecond)
		cb.returned(id, t0.Add(2500*time.Millisecond+late))
	}
	// the slot of a snoozed job is remembered until it returns, for its key only
	cb.snoozed("x", "k", t0, 2*time.Second, 2500*time.Millisecond)
	if wait, ok := cb.slotIn("x", "k", t0.Add(time.Second)); !ok || wait != 1500*time.Millisecond {
		t.Fatalf("slot 1s after the snooze: %v, %v; want 1.5s, true", wait, ok)
	}
	if _, ok := cb.slotIn("x", "other", t0); ok {
		t.Fatal("slot known for another limiter's key")
	}
	cb.returned("x", t0.Add(2*time.Second))
	if _, ok := cb.slotIn("x", "k", t0); ok {
		t.Fatal("slot still known after the job returned")
	}
	cb = comeBack{} // that return was a sample: start again
	for i := range comeBackMinSamples - 1 {
		back("a"+strconv.Itoa(i), 1900*time.Millisecond)
	}
	if got, want := cb.early(interval), 1120*time.Millisecond; got != want {
		t.Fatalf("margin after %d returns: %v, want %v (too few to learn from)", comeBackMinSamples-1, got, want)
	}
	cb.returned("never-snoozed", t0.Add(time.Hour)) // not this client's: ignored
	for i := range 40 {
		back("b"+strconv.Itoa(i), 500*time.Millisecond) // within the poll interval
	}
	if got, want := cb.early(interval), 1120*time.Millisecond; got != want {
		t.Fatalf("margin with 40 of 44 returns 500ms late: %v, want %v (never below the least)", got, want)
	}
	for i := range comeBackSamples {
		late := 1300 * time.Millisecond
		if i%16 == 0 { // 2 of 32
			late = 5 * time.Second // a stall now and then
		}
		back("c"+strconv.Itoa(i), late)
	}
	if got, want := cb.early(interval), 1320*time.Millisecond; got != want {
		t.Fatalf("margin with 90%% of returns 1.3s late: %v, want %v", got, want)
	}
	for i := range comeBackSamples {
		back("d"+strconv.Itoa(i), 5*time.Second)
	}
	if got, want := cb.early(interval), 1620*time.Millisecond; got != want {
		t.Fatalf("margin with every return 5s late: %v, want %v (the bound)", got, want)
	}
}
