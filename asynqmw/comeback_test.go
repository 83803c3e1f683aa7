package asynqmw

import (
	"strconv"
	"testing"
	"time"
)

// The come-back margin starts at the check intervals and 20ms, follows the 90th
// percentile of how late this server's handed-back tasks came back after asynq made
// them due, and stays within half a second above where it started. No timing: the
// returns are given their times.
func TestComeBackLearnsLateness(t *testing.T) {
	const interval = 200 * time.Millisecond
	var cb comeBack
	if got, want := cb.early(interval), 220*time.Millisecond; got != want {
		t.Fatalf("margin before any return: %v, want %v", got, want)
	}
	t0 := time.Unix(1_000_000, 0)
	back := func(id string, late time.Duration) {
		t.Helper()
		// handed back at t0 + 0.3s, made due 2.5s later: asynq truncates to t0 + 2s
		cb.handedBack(id, "k", t0.Add(300*time.Millisecond), 2500*time.Millisecond, 2720*time.Millisecond)
		cb.returned(id, t0.Add(2*time.Second+late))
	}
	// the slot of a handed-back task is remembered until it returns, for its key only
	cb.handedBack("x", "k", t0, 2*time.Second, 2500*time.Millisecond)
	if wait, ok := cb.slotIn("x", "k", t0.Add(time.Second)); !ok || wait != 1500*time.Millisecond {
		t.Fatalf("slot 1s after the hand-back: %v, %v; want 1.5s, true", wait, ok)
	}
	if _, ok := cb.slotIn("x", "other", t0); ok {
		t.Fatal("slot known for another limiter's key")
	}
	cb.returned("x", t0.Add(2*time.Second))
	if _, ok := cb.slotIn("x", "k", t0); ok {
		t.Fatal("slot still known after the task returned")
	}
	cb = comeBack{} // that return was a sample: start again
	for i := range comeBackMinSamples - 1 {
		back("a"+strconv.Itoa(i), 900*time.Millisecond)
	}
	if got, want := cb.early(interval), 220*time.Millisecond; got != want {
		t.Fatalf("margin after %d returns: %v, want %v (too few to learn from)", comeBackMinSamples-1, got, want)
	}
	cb.returned("never-handed-back", t0.Add(time.Hour)) // not this server's: ignored
	for i := range 40 {
		// handed back at t0 + 0.3s, due 0.2s later: asynq truncates to t0, in the
		// past, so it is due at once; back 100ms after that
		id := "s" + strconv.Itoa(i)
		cb.handedBack(id, "k", t0.Add(300*time.Millisecond), 200*time.Millisecond, 420*time.Millisecond)
		cb.returned(id, t0.Add(400*time.Millisecond))
	}
	if got, want := cb.early(interval), 220*time.Millisecond; got != want {
		t.Fatalf("margin with 40 of 44 returns 100ms after a hand-back due at once: %v, want %v", got, want)
	}
	for i := range 40 {
		back("b"+strconv.Itoa(i), 100*time.Millisecond) // within the check intervals
	}
	if got, want := cb.early(interval), 220*time.Millisecond; got != want {
		t.Fatalf("margin with 40 of 44 returns 100ms late: %v, want %v (never below the least)", got, want)
	}
	for i := range comeBackSamples {
		late := 400 * time.Millisecond
		if i%16 == 0 { // 2 of 32
			late = 3 * time.Second // a stall now and then
		}
		back("c"+strconv.Itoa(i), late)
	}
	if got, want := cb.early(interval), 420*time.Millisecond; got != want {
		t.Fatalf("margin with 90%% of returns 400ms late: %v, want %v", got, want)
	}
	for i := range comeBackSamples {
		back("d"+strconv.Itoa(i), 5*time.Second)
	}
	if got, want := cb.early(interval), 720*time.Millisecond; got != want {
		t.Fatalf("margin with every return 5s late: %v, want %v (the bound)", got, want)
	}
}
