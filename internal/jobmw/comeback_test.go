package jobmw

import (
	"strconv"
	"testing"
	"time"
)

// The come-back margin starts at the queue's interval and 20ms, follows the 90th
// percentile of how late this process's handed-back jobs came back after they were
// due, and stays within half a second above where it started. No timing: the returns are given
// their times.
func TestComeBackLearnsLateness(t *testing.T) {
	const interval = 1100 * time.Millisecond
	var cb ComeBack
	if got, want := cb.Early(interval), 1120*time.Millisecond; got != want {
		t.Fatalf("margin before any return: %v, want %v", got, want)
	}
	t0 := time.Unix(1_000_000, 0)
	back := func(id string, late time.Duration) {
		t.Helper()
		// handed back at t0, due 2.5s later, its slot 3.62s ahead
		cb.HandedBack(id, "k", t0.Add(3620*time.Millisecond), t0.Add(2500*time.Millisecond))
		cb.Returned(id, t0.Add(2500*time.Millisecond+late))
	}
	// the slot of a handed-back job is remembered until it returns, for its key only
	cb.HandedBack("x", "k", t0.Add(2500*time.Millisecond), t0.Add(2*time.Second))
	if wait, ok := cb.SlotIn("x", "k", t0.Add(time.Second)); !ok || wait != 1500*time.Millisecond {
		t.Fatalf("slot 1s after the hand-back: %v, %v; want 1.5s, true", wait, ok)
	}
	if _, ok := cb.SlotIn("x", "other", t0); ok {
		t.Fatal("slot known for another limiter's key")
	}
	cb.Returned("x", t0.Add(2*time.Second))
	if _, ok := cb.SlotIn("x", "k", t0); ok {
		t.Fatal("slot still known after the job returned")
	}
	cb = ComeBack{} // that return was a sample: start again
	for i := range comeBackMinSamples - 1 {
		back("a"+strconv.Itoa(i), 1900*time.Millisecond)
	}
	if got, want := cb.Early(interval), 1120*time.Millisecond; got != want {
		t.Fatalf("margin after %d returns: %v, want %v (too few to learn from)", comeBackMinSamples-1, got, want)
	}
	cb.Returned("never-handed-back", t0.Add(time.Hour)) // not this process's: ignored
	for i := range 40 {
		back("b"+strconv.Itoa(i), 500*time.Millisecond) // within the interval
	}
	if got, want := cb.Early(interval), 1120*time.Millisecond; got != want {
		t.Fatalf("margin with 40 of 44 returns 500ms late: %v, want %v (never below the least)", got, want)
	}
	for i := range comeBackSamples {
		late := 1300 * time.Millisecond
		if i%16 == 0 { // 2 of 32
			late = 5 * time.Second // a stall now and then
		}
		back("c"+strconv.Itoa(i), late)
	}
	if got, want := cb.Early(interval), 1320*time.Millisecond; got != want {
		t.Fatalf("margin with 90%% of returns 1.3s late: %v, want %v", got, want)
	}
	for i := range comeBackSamples {
		back("d"+strconv.Itoa(i), 5*time.Second)
	}
	if got, want := cb.Early(interval), 1620*time.Millisecond; got != want {
		t.Fatalf("margin with every return 5s late: %v, want %v (the bound)", got, want)
	}
}
