package asynqmw

import (
	"testing"
	"time"
)

// A handed-back task is due when asynq makes it due: its retry time truncated to
// whole seconds, and at once if that is in the past.
func TestRetryDueTruncatesToSeconds(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	now := t0.Add(300 * time.Millisecond)
	if got, want := retryDue(now, 2500*time.Millisecond), t0.Add(2*time.Second); !got.Equal(want) {
		t.Errorf("handed back at t0 + 0.3s, due 2.5s later: due %v, want t0 + 2s", got.Sub(t0))
	}
	if got := retryDue(now, 200*time.Millisecond); !got.Equal(now) {
		t.Errorf("handed back at t0 + 0.3s, due 0.2s later: due %v, want at once (t0 + 0.3s)", got.Sub(t0))
	}
}
