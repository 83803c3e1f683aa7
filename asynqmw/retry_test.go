package asynqmw_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestIsFailure(t *testing.T) {
	te := &asynqmw.ThrottledError{RetryIn: time.Second, Key: "k", Limit: "1 per 1s"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"throttled", te, false},
		{"wrapped throttled", fmt.Errorf("handler: %w", te), false},
		{"requeued", fmt.Errorf("%w (%w)", te, asynq.RevokeTask), false},
		{"other", errBoom, true},
		{"skip retry", asynq.SkipRetry, true},
	} {
		if got := asynqmw.IsFailure(tc.err); got != tc.want {
			t.Errorf("IsFailure(%s): got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	fallback := func(n int, err error, task *asynq.Task) time.Duration { return time.Duration(n) * time.Hour }
	delay := asynqmw.RetryDelay(fallback)
	task := asynq.NewTask("job", nil)
	for _, tc := range []struct {
		retryIn  time.Duration
		min, max time.Duration // [min, max)
	}{
		{0, 1 * time.Second, 2 * time.Second},                       // at least a second
		{300 * time.Millisecond, 1 * time.Second, 2 * time.Second},  // rounded up
		{1 * time.Second, 1 * time.Second, 2 * time.Second},         // whole already
		{1001 * time.Millisecond, 2 * time.Second, 3 * time.Second}, // rounded up
		{7300 * time.Millisecond, 8 * time.Second, 9 * time.Second}, // jitter: a second
		{100 * time.Second, 100 * time.Second, 110 * time.Second},   // jitter: a tenth
		{-5 * time.Second, 1 * time.Second, 2 * time.Second},        // nonsense: a second
	} {
		err := fmt.Errorf("wrapped: %w", &asynqmw.ThrottledError{RetryIn: tc.retryIn})
		seen := map[time.Duration]bool{}
		for range 200 {
			d := delay(3, err, task)
			if d < tc.min || d >= tc.max {
				t.Fatalf("RetryDelay for RetryIn %v: got %v, want in [%v, %v)", tc.retryIn, d, tc.min, tc.max)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Errorf("RetryDelay for RetryIn %v: %d distinct delays in 200 calls, want jitter", tc.retryIn, len(seen))
		}
	}
	if got, want := delay(3, errBoom, task), 3*time.Hour; got != want {
		t.Errorf("RetryDelay for another error: got %v, want the fallback's %v", got, want)
	}
	if got := asynqmw.RetryDelay(nil)(0, errBoom, task); got < 15*time.Second || got > 45*time.Second {
		t.Errorf("RetryDelay(nil) for another error: got %v, want asynq.DefaultRetryDelayFunc's 15s..45s", got)
	}
}

func TestSkipThrottled(t *testing.T) {
	var got []error
	h := asynqmw.SkipThrottled(asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		got = append(got, err)
	}))
	te := &asynqmw.ThrottledError{RetryIn: time.Second}
	task := asynq.NewTask("job", nil)
	for _, err := range []error{te, fmt.Errorf("x: %w", te), errBoom, asynq.SkipRetry} {
		h.HandleError(context.Background(), task, err)
	}
	if len(got) != 2 || !errors.Is(got[0], errBoom) || !errors.Is(got[1], asynq.SkipRetry) {
		t.Errorf("handled %v, want [boom, skip retry]", got)
	}
	if h := asynqmw.SkipThrottled(nil); h != nil {
		t.Errorf("SkipThrottled(nil) = %v, want nil", h)
	}
}

// What the design rests on, checked against asynq itself: with IsFailure, a
// *ThrottledError spends no retry and records no failure; but asynq archives a task
// on its last attempt before it asks IsFailure.
func TestAsynqArchivesLastAttemptBeforeIsFailure(t *testing.T) {
	for _, k := range []redistest.Kind{redistest.Mini, redistest.Standalone} {
		t.Run(string(k), func(t *testing.T) {
			b := redistest.NewMiniRealTime(t)
			if k != redistest.Mini {
				b = redistest.New(t, k)
			}
			f := newFleet(t, b)
			throttled := &asynqmw.ThrottledError{RetryIn: 0, Key: "k", Limit: "1 per 1s"}
			fail := func(_ context.Context, id string, _ int) error {
				if id == "last" || len(f.runs.get(id)) <= 2 {
					return throttled
				}
				return nil
			}
			f.start(f.serverConfig(2), f.handler(fail))
			f.enqueue("retries", asynq.MaxRetry(1))
			f.enqueue("last", asynq.MaxRetry(0))
			qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 4 })

			// Handed back twice with MaxRetry(1), and its retry count never moved.
			if got := f.runs.get("retries"); len(got) != 3 || got[0]+got[1]+got[2] != 0 {
				t.Errorf("task with a retry: retry counts of its runs %v, want [0 0 0]", got)
			}
			arch, err := f.insp.ListArchivedTasks(f.queue)
			if err != nil {
				t.Fatal(err)
			}
			if len(arch) != 1 || string(arch[0].Payload) != "last" || arch[0].LastErr != throttled.Error() {
				t.Fatalf("archived %v, want only the MaxRetry(0) task, archived with the throttle error", arch)
			}
			if qi.FailedTotal != 1 {
				t.Errorf("failed total: got %d, want 1 (the archive; no failure for the hand-backs)", qi.FailedTotal)
			}
		})
	}
}
