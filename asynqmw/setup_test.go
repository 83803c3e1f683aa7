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
	if cfg.Concurrency != 20 {
		t.Errorf("Concurrency %d, want 20: 10 workers and 10 for sleeping tasks", cfg.Concurrency)
	}
	st := jt.Stats()
	if st.SleepBound != 10 || st.CheckInterval != 2*asynqmw.DefaultCheckInterval {
		t.Errorf("stats %+v, want SleepBound 10 (as many as the workers), CheckInterval 200ms", st)
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

// With Setup.Config, a task asleep for its permit does not take one of the server's
// workers: while it sleeps, the other tasks still run two at a time on a server of
// Concurrency 2, and never three (the worker goroutine it sleeps in is the one
// Config adds for MaxSleepingWorkers(1)).
func TestSleepingTasksLeaveTheWorkers(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	f := newFleet(t, b)
	lim := f.limiter("gate", throttle.PerMinute(1))
	if r, err := lim.Allow(context.Background()); err != nil || !r.Allowed { // the next permit comes in a minute
		t.Fatalf("Allow: %+v, %v", r, err)
	}
	jt := asynqmw.New(b.Client, asynqmw.MaxSleepingWorkers(1), asynqmw.MaxInlineWait(time.Hour))
	var (
		mu              sync.Mutex
		running, most   int
		freeRuns        int
		throttledAsleep = make(chan struct{})
	)
	h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
		mu.Lock()
		running++
		most = max(most, running)
		if task.Type() == "free" {
			freeRuns++
		}
		mu.Unlock()
		time.Sleep(50 * time.Millisecond)
		mu.Lock()
		running--
		mu.Unlock()
		return nil
	})
	pick := func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
		if task.Type() == "throttled" {
			close(throttledAsleep)
			return lim, nil
		}
		return nil, nil
	}
	mux := asynq.NewServeMux()
	mux.Use(jt.ThrottleFunc(pick))
	mux.Handle("throttled", h)
	mux.Handle("free", h)
	cfg := f.serverConfig(2)
	cfg.IsFailure, cfg.RetryDelayFunc = nil, nil
	srv := asynq.NewServerFromRedisClient(b.Client, jt.Config(cfg))
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	f.servers = append(f.servers, srv)
	if _, err := f.client.Enqueue(asynq.NewTask("throttled", nil), asynq.Queue(f.queue)); err != nil {
		t.Fatal(err)
	}
	<-throttledAsleep
	for jt.Stats().Sleeping != 1 {
		time.Sleep(time.Millisecond)
	}
	const n = 20
	for range n {
		if _, err := f.client.Enqueue(asynq.NewTask("free", nil), asynq.Queue(f.queue)); err != nil {
			t.Fatal(err)
		}
	}
	for deadline := time.Now().Add(idleLimit); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		done := freeRuns == n && running == 0
		mu.Unlock()
		if done {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d free tasks ran", freeRuns, n)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 2 {
		t.Errorf("most handlers running at once: %d, want 2 (Concurrency), with one task asleep", most)
	}
	if st := jt.Stats(); st.Sleeping != 1 {
		t.Errorf("stats %+v: want the throttled task still asleep", st)
	}
}
