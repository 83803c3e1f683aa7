package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/hibiken/asynq"
)

var errFail = errors.New("boom")

func TestIsFailure(t *testing.T) {
	te := &ThrottledError{RetryIn: time.Second, Key: "k", Limit: "1 per 1s"}
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"throttled", te, false},
		{"wrapped throttled", fmt.Errorf("handler: %w", te), false},
		{"requeued", fmt.Errorf("%w (%w)", te, asynq.RevokeTask), false},
		{"other", errFail, true},
		{"skip retry", asynq.SkipRetry, true},
	} {
		if got := isFailure(tc.err); got != tc.want {
			t.Errorf("IsFailure(%s): got %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestRetryDelay(t *testing.T) {
	fallback := func(n int, err error, task *asynq.Task) time.Duration { return time.Duration(n) * time.Hour }
	delay := retryDelayFunc(fallback)
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
		err := fmt.Errorf("wrapped: %w", &ThrottledError{RetryIn: tc.retryIn})
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
	if got, want := delay(3, errFail, task), 3*time.Hour; got != want {
		t.Errorf("RetryDelay for another error: got %v, want the fallback's %v", got, want)
	}
	if got := retryDelayFunc(nil)(0, errFail, task); got < 15*time.Second || got > 45*time.Second {
		t.Errorf("RetryDelay(nil) for another error: got %v, want asynq.DefaultRetryDelayFunc's 15s..45s", got)
	}
}

func TestSkipThrottled(t *testing.T) {
	var got []error
	h := skipThrottled(asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
		got = append(got, err)
	}))
	te := &ThrottledError{RetryIn: time.Second}
	task := asynq.NewTask("job", nil)
	for _, err := range []error{te, fmt.Errorf("x: %w", te), errFail, asynq.SkipRetry} {
		h.HandleError(context.Background(), task, err)
	}
	if len(got) != 2 || !errors.Is(got[0], errFail) || !errors.Is(got[1], asynq.SkipRetry) {
		t.Errorf("handled %v, want [boom, skip retry]", got)
	}
	if h := skipThrottled(nil); h != nil {
		t.Errorf("SkipThrottled(nil) = %v, want nil", h)
	}
}

// What asynq gets from the Setup's outermost middleware: a requeued last attempt
// ends without an error (asynq deletes it, silently) unless it has a Retention (a
// success would keep it as completed): then asynq.RevokeTask. A copy's own failure
// is archived at once (asynq.SkipRetry), with its message unchanged. Anything else
// passes.
func TestFinish(t *testing.T) {
	var task, cp attempt
	cp.copy = true
	te := &ThrottledError{RetryIn: time.Second, Booked: true}
	if got := finish(task, te); got != te {
		t.Errorf("finish(hand-back) = %v, want the *ThrottledError itself", got)
	}
	if got := finish(cp, te); got != te {
		t.Errorf("finish(a copy's hand-back) = %v, want the *ThrottledError itself", got)
	}
	if got := finish(task, errFail); got != errFail {
		t.Errorf("finish(failure) = %v, want it unchanged", got)
	}
	if got := finish(task, nil); got != nil {
		t.Errorf("finish(nil) = %v, want nil", got)
	}
	if got := finish(cp, nil); got != nil {
		t.Errorf("finish(a copy's nil) = %v, want nil", got)
	}
	if got := finish(task, fmt.Errorf("inner: %w", &ThrottledError{Requeued: true})); got != nil {
		t.Errorf("finish(requeued) = %v, want nil", got)
	}
	got := finish(task, &ThrottledError{Requeued: true, retention: time.Minute})
	if !errors.Is(got, asynq.RevokeTask) || !IsThrottled(got) || isFailure(got) {
		t.Errorf("finish(requeued, retention) = %v, want a throttle wrapping asynq.RevokeTask", got)
	}
	got = finish(cp, errFail)
	if !errors.Is(got, asynq.SkipRetry) || !errors.Is(got, errFail) || got.Error() != errFail.Error() || !isFailure(got) {
		t.Errorf("finish(a copy's failure) = %v, want a failure wrapping it and asynq.SkipRetry, its message unchanged", got)
	}
}
