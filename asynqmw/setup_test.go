package asynqmw_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
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
	if cfg.DelayedTaskCheckInterval != 100*time.Millisecond || cfg.TaskCheckInterval != 100*time.Millisecond {
		t.Errorf("intervals %v, %v; want 100ms each", cfg.DelayedTaskCheckInterval, cfg.TaskCheckInterval)
	}
	if cfg.BaseContext == nil || cfg.BaseContext() == nil {
		t.Errorf("BaseContext: want one that marks the server's tasks")
	}
	if d := cfg.RetryDelayFunc(2, fmt.Errorf("boom"), asynq.NewTask("x", nil)); d < 15*time.Second {
		t.Errorf("RetryDelayFunc for a failure: %v, want asynq's default (15s and more)", d)
	}
	cfg.ErrorHandler.HandleError(context.Background(), asynq.NewTask("x", nil), te)
	cfg.ErrorHandler.HandleError(context.Background(), asynq.NewTask("x", nil), fmt.Errorf("boom"))
	if len(handled) != 1 {
		t.Errorf("error handler saw %v, want only the real failure", handled)
	}
	if cfg.Concurrency != 10 {
		t.Errorf("Concurrency %d, want 10: the user's", cfg.Concurrency)
	}
	st := jt.Stats()
	if st.SleepBound != 5 || st.ComeBackEarly != 220*time.Millisecond {
		t.Errorf("stats %+v, want SleepBound 5 (half the workers), ComeBackEarly 220ms (the check intervals and 20ms)", st)
	}
	// an explicit bound stays
	if st := asynqmw.New(b.Client, asynqmw.MaxSleepingWorkers(2)); st != nil {
		st.Config(asynq.Config{Concurrency: 10})
		if got := st.Stats().SleepBound; got != 2 {
			t.Errorf("SleepBound with MaxSleepingWorkers(2): %d", got)
		}
	}
}

// logRecorder is an asynq.Logger that keeps warnings and errors, and passes all to
// the test log.
type logRecorder struct {
	testLogger
	mu   sync.Mutex
	kept []string // "warn: …", "error: …"
}

func (l *logRecorder) Warn(args ...any)  { l.keep("warn", args...) }
func (l *logRecorder) Error(args ...any) { l.keep("error", args...) }

func (l *logRecorder) keep(level string, args ...any) {
	l.mu.Lock()
	l.kept = append(l.kept, level+": "+fmt.Sprint(args...))
	l.mu.Unlock()
	l.testLogger.Info(append([]any{level + ":"}, args...)...)
}

// count returns how many of level's lines say sub.
func (l *logRecorder) count(level, sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, w := range l.kept {
		if strings.HasPrefix(w, level+": ") && strings.Contains(w, sub) {
			n++
		}
	}
	return n
}

func (l *logRecorder) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.kept)
}

// A task asleep for its permit sleeps in its own worker, and no more than
// MaxSleepingWorkers do: on a server of Concurrency 2 with MaxSleepingWorkers(1), one
// throttled task asleep leaves the other worker to the other tasks, which run one at
// a time (never two beside the sleeper: asynq gives the server 2 workers, no more),
// and a second throttled task is handed back rather than sleeping in it.
func TestSleepingTasksLeaveOtherWorkers(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	f := newFleet(t, b)
	lim := f.limiter("gate", throttle.PerMinute(1))
	if r, err := lim.Allow(context.Background()); err != nil || !r.Allowed { // the next permit comes in a minute
		t.Fatalf("Allow: %+v, %v", r, err)
	}
	c := newCounters()
	jt := asynqmw.New(b.Client, asynqmw.MaxSleepingWorkers(1), asynqmw.InlineWait(time.Hour), asynqmw.WithHooks(c.hooks()))
	var (
		mu            sync.Mutex
		running, most int
		freeRuns      int
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
			return lim, nil
		}
		return nil, nil
	}
	mux := asynq.NewServeMux()
	mux.Use(jt.ThrottleFunc(pick))
	mux.Handle("throttled", h)
	mux.Handle("free", h)
	srv := asynq.NewServerFromRedisClient(b.Client, jt.Config(f.serverConfig(2)))
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	f.servers = append(f.servers, srv)
	if _, err := f.client.Enqueue(asynq.NewTask("throttled", []byte("asleep")), asynq.Queue(f.queue), asynq.MaxRetry(3)); err != nil {
		t.Fatal(err)
	}
	for jt.Stats().Sleeping != 1 {
		time.Sleep(time.Millisecond)
	}
	if _, err := f.client.Enqueue(asynq.NewTask("throttled", []byte("handed back")), asynq.Queue(f.queue), asynq.MaxRetry(3)); err != nil {
		t.Fatal(err)
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
		if done && get(c, c.throttled, "handed back") > 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d free tasks ran; the second throttled task was handed back %d times", freeRuns, n, get(c, c.throttled, "handed back"))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if most != 1 {
		t.Errorf("most handlers running at once: %d, want 1 (Concurrency 2, one worker asleep)", most)
	}
	if st := jt.Stats(); st.Sleeping != 1 || st.PeakSleeping != 1 {
		t.Errorf("stats %+v: want the first throttled task still asleep, and never two", st)
	}
}

// What the design rests on, checked against asynq itself: with IsFailure, a
// *ThrottledError spends no retry and records no failure; but asynq archives a task
// on its last attempt before it asks IsFailure.
func TestAsynqArchivesLastAttemptBeforeIsFailure(t *testing.T) {
	for _, k := range []redistest.Kind{redistest.Mini, redistest.Standalone} {
		t.Run(string(k), func(t *testing.T) {
			t.Parallel()
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
			f.start(asynqmw.New(b.Client).Config(f.serverConfig(2)), f.handler(fail))
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

// No way of installing the middleware runs more handlers at once than the server's
// Concurrency, counting every task type: a throttled backlog (tasks asleep for their
// permits or slots, and handed back) ahead of unthrottled tasks, on a server of
// Concurrency 10, through each form a user may write: the middleware given to
// mux.Use, or wrapping the one handler it limits (the others unwrapped), for a
// limiter and for a semaphore. The forms run side by side, each on its own queue.
func TestHandlersAtOnceWithinConcurrency(t *testing.T) {
	forms := []struct {
		name    string
		wrapped bool // the middleware wraps the "throttled" handler only
		sem     bool // jt.Concurrency(sem) rather than a limiter
	}{
		{"mux.Use(ThrottleFunc)", false, false},
		{"Throttle wrapping one handler", true, false},
		{"mux.Use(Concurrency)", false, true},
		{"Concurrency wrapping one handler", true, true},
	}
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		for _, form := range forms {
			t.Run(form.name, func(t *testing.T) {
				t.Parallel()
				// 3 s of the limit: some run at once, some sleep, the rest are handed
				// back; a semaphore's hand-backs come back after whole seconds, so
				// fewer tasks go through it.
				const workers = 10
				throttled, free := 30, 100
				if form.sem {
					throttled, free = 10, 20
				}
				f := newFleet(t, b)
				lim := f.limiter("at-once", throttle.PerSecond(10))
				sem := newSem(t, b, "at-once", 3)
				var running, most atomic.Int64
				h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
					k := running.Add(1)
					for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
					}
					time.Sleep(20 * time.Millisecond)
					running.Add(-1)
					f.runs.add(string(task.Payload()), 0, "")
					return nil
				})
				jt := asynqmw.New(b.Client)
				mw := jt.ThrottleFunc(func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
					if task.Type() == "throttled" {
						return lim, nil
					}
					return nil, nil // unthrottled
				})
				if form.sem {
					mw = jt.Concurrency(sem)
				}
				mux := asynq.NewServeMux()
				if form.wrapped {
					mux.Handle("throttled", mw(h))
				} else {
					mux.Use(mw)
					mux.Handle("throttled", h)
				}
				mux.Handle("free", h)
				srv := asynq.NewServerFromRedisClient(b.Client, jt.Config(f.serverConfig(workers)))
				if err := srv.Start(mux); err != nil {
					t.Fatal(err)
				}
				f.servers = append(f.servers, srv)
				for i := range throttled {
					if _, err := f.client.Enqueue(asynq.NewTask("throttled", []byte(fmt.Sprint("t", i))), asynq.Queue(f.queue), asynq.MaxRetry(3)); err != nil {
						t.Fatal(err)
					}
				}
				for i := range free {
					if _, err := f.client.Enqueue(asynq.NewTask("free", []byte(fmt.Sprint("f", i))), asynq.Queue(f.queue)); err != nil {
						t.Fatal(err)
					}
				}
				qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= throttled+free })
				f.stop()
				st := jt.Stats()
				redistest.Figure(t, "%s, %s, Concurrency %d: most handlers at once %d; %d throttled and %d unthrottled tasks, peak asleep in the middleware %d, %d hand-backs",
					b.Kind, form.name, workers, most.Load(), throttled, free, st.PeakSleeping, st.HandedBack)
				if got := most.Load(); got > workers {
					t.Errorf("most handlers at once: %d, want <= %d (Concurrency)", got, workers)
				}
				if got := f.runs.total(); got != throttled+free || qi.Archived != 0 || qi.FailedTotal != 0 {
					t.Errorf("runs %d, archived %d, failed %d; want %d, 0, 0", got, qi.Archived, qi.FailedTotal, throttled+free)
				}
				if st.PeakSleeping == 0 {
					t.Errorf("no task slept in the middleware: the test did not exercise the sleeping path")
				}
			})
		}
	})
}
