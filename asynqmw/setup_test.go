package asynqmw_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// Config fills in what the middleware needs and keeps the user's own settings.
func TestSetupConfig(t *testing.T) {
	b := redistest.NewMini(t)
	jt := asynqmw.New(b.Client)
	var handled []error
	own := func(err error) bool { return !strings.Contains(err.Error(), "benign") }
	cfg := jt.Config(asynq.Config{
		Concurrency: 10,
		IsFailure:   own,
		ErrorHandler: asynq.ErrorHandlerFunc(func(_ context.Context, _ *asynq.Task, err error) {
			handled = append(handled, err)
		}),
	})
	te := &asynqmw.ThrottledError{RetryIn: 3 * time.Second, Booked: true}
	if cfg.IsFailure(te) || cfg.IsFailure(fmt.Errorf("benign")) || !cfg.IsFailure(fmt.Errorf("boom")) {
		t.Errorf("IsFailure: throttled %v, benign %v, boom %v; want false, false, true",
			cfg.IsFailure(te), cfg.IsFailure(fmt.Errorf("benign")), cfg.IsFailure(fmt.Errorf("boom")))
	}
	if cfg.DelayedTaskCheckInterval != asynqmw.DefaultCheckInterval || cfg.TaskCheckInterval != asynqmw.DefaultCheckInterval {
		t.Errorf("intervals %v, %v; want %v each", cfg.DelayedTaskCheckInterval, cfg.TaskCheckInterval, asynqmw.DefaultCheckInterval)
	}
	cfg.ErrorHandler.HandleError(context.Background(), asynq.NewTask("x", nil), te)
	cfg.ErrorHandler.HandleError(context.Background(), asynq.NewTask("x", nil), fmt.Errorf("boom"))
	if len(handled) != 1 {
		t.Errorf("error handler saw %v, want only the real failure", handled)
	}
	st := jt.Stats()
	if st.SleepBound != 5 || st.CheckInterval != 2*asynqmw.DefaultCheckInterval {
		t.Errorf("stats %+v, want SleepBound 5 (half of 10 workers), CheckInterval 200ms", st)
	}
	// an explicit bound stays
	if st := asynqmw.New(b.Client, asynqmw.MaxSleepingWorkers(2)); st != nil {
		st.Config(asynq.Config{Concurrency: 10})
		if got := st.Stats().SleepBound; got != 2 {
			t.Errorf("SleepBound with MaxSleepingWorkers(2): %d", got)
		}
	}
}

// logRecorder is an asynq.Logger that keeps warnings.
type logRecorder struct {
	testLogger
	mu    sync.Mutex
	warns []string
}

func (l *logRecorder) Warn(args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.warns = append(l.warns, fmt.Sprint(args...))
}

func (l *logRecorder) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.warns {
		if strings.Contains(w, sub) {
			n++
		}
	}
	return n
}

// A Setup whose Config the server did not get says so, once, through the logger; so
// does a middleware whose hand-backs come back counted as retries.
func TestHalfAppliedSetupIsReported(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	f := newFleet(t, b)
	lim := f.limiter("half", throttle.PerSecond(10))
	log := &logRecorder{testLogger: testLogger{t}}
	jt := asynqmw.New(b.Client, asynqmw.WithLogger(log), asynqmw.MaxInlineWait(0))
	cfg := f.serverConfig(4)
	cfg.IsFailure, cfg.RetryDelayFunc = nil, func(int, error, *asynq.Task) time.Duration { return 0 }
	cfg.Logger = log
	f.start(cfg, f.handler(nil), jt.ThrottleFunc(bookingFirst(t, lim, 1)))
	for _, id := range ids("half", 3) {
		f.enqueue(id, asynq.MaxRetry(5))
	}
	f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 3 })
	if got := log.count("Setup.Config was not applied"); got != 1 {
		t.Errorf("warnings that Setup.Config was not applied: %d, want 1 (%q)", got, log.warns)
	}
	if got := log.count("came back counted as a retry"); got != 1 {
		t.Errorf("warnings that a hand-back counted as a retry: %d, want 1 (%q)", got, log.warns)
	}
	if st := jt.Stats(); st.CountedAsRetry == 0 {
		t.Errorf("stats %+v: no hand-back counted as a retry", st)
	}
}
