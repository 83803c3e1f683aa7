package jobmw

import (
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// The pacer lets a process start at most Rate jobs through a limiter in any window
// of its Period (every limit of it), counting the starts it lets go; a token bucket is
// not paced, nor is a wait too long to be a lag.
func TestPacerKeepsStartsWithinTheLimit(t *testing.T) {
	b := redistest.NewMini(t)
	lim, err := throttle.New(b.Client, "pace", throttle.PerSecond(3), throttle.WithLimits(throttle.PerMinute(4)))
	if err != nil {
		t.Fatal(err)
	}
	var p Pacer
	t0 := time.Now()
	at := func(d time.Duration) time.Duration {
		w, counted := p.Wait(InfoOf(lim, 0), func() time.Time { return t0.Add(d) })
		if w == 0 && !counted.Equal(t0.Add(d)) {
			t.Fatalf("start %v in: counted at %v, want %v", d, counted.Sub(t0), d)
		}
		return w
	}
	for i := range 3 {
		if w := at(time.Duration(i) * time.Millisecond); w != 0 {
			t.Fatalf("start %d: wait %v, want 0", i, w)
		}
	}
	if w := at(100 * time.Millisecond); w != 900*time.Millisecond {
		t.Fatalf("4th start 100ms in: wait %v, want 900ms (a second after the first)", w)
	}
	if w := at(time.Second); w != 0 {
		t.Fatalf("4th start a second in: wait %v, want 0", w)
	}
	// the 5th would be the 5th in a minute: a wait of 59s is no lag, it goes at once
	if w := at(1100 * time.Millisecond); w != 0 {
		t.Fatalf("5th start: wait %v, want 0 (past maxPacedDelay)", w)
	}

	tb, err := throttle.New(b.Client, "pace-tb", throttle.PerSecond(1), throttle.WithAlgorithm(throttle.TokenBucket))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		if w, _ := p.Wait(InfoOf(tb, 0), func() time.Time { return t0 }); w != 0 {
			t.Fatalf("token bucket start %d: wait %v, want 0", i, w)
		}
	}
}
