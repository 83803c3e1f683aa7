package asynqmw_test

import (
	"context"
	"errors"
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
	"github.com/jobthrottle/jobthrottle/waiter"
)

// Many MaxRetry(0) and MaxRetry(3) tasks through Throttle at a low rate, on two
// servers: each runs exactly once, none is archived or failed, throttling moves no
// retry count, a last attempt is handed back only as a copy (which is then handed
// back as any task), and the limit holds in every window of server grant times.
func TestThrottleRunsEachTaskOnce(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		const (
			rate   = 10
			period = 500 * time.Millisecond
			n      = 40 // tasks: 2 s of the limit
			inline = 600 * time.Millisecond
		)
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		lim := f.limiter("tasks", throttle.Limit{Rate: rate, Period: period})
		c := newCounters()
		// Other traffic has taken the next second when the first task arrives, so
		// that tasks are handed back however slowly the servers dequeue.
		pick := bookingFirst(t, lim, 2)
		for range 2 {
			jt := asynqmw.New(b.Client, asynqmw.InlineWait(inline), asynqmw.WithHooks(c.hooks()))
			f.run(jt, 10, f.handler(nil), jt.ThrottleFunc(pick))
		}
		final, retrying := ids("final", n/2), ids("retrying", n/2)
		for i := range final {
			f.enqueue(final[i], asynq.MaxRetry(0))
			f.enqueue(retrying[i], asynq.MaxRetry(3))
		}
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= n })

		f.ranOnce(qi, append(final, retrying...)...)
		if got := f.runs.total(); got != n {
			t.Errorf("runs: got %d, want %d", got, n)
		}
		if got := grants.MaxInWindow(period); got > rate {
			t.Errorf("most grants in any %v window: got %d, want <= %d", period, got, rate)
		}
		// One permit per task, and the other traffic's; a task that came back after its
		// slot (a loaded host) ran on a new one, and the passed one went unused.
		if got := grants.Total(); got < n+2*rate {
			t.Errorf("permits granted (net of cancels): got %d, want at least %d, one per task and the other traffic's", got, n+2*rate)
		}
		if c.sum(c.throttled) == 0 {
			t.Errorf("no task was handed back: the test did not exercise asynq's retry path")
		}
		c.lastAttemptsAsCopies(t, final...)
		t.Logf("%d tasks in %v: %d hand-backs, %d inline waits, most grants in any %v: %d",
			n, func() time.Duration { a, z := grants.Span(); return z.Sub(a) }(), c.sum(c.throttled), len(c.waited), period, grants.MaxInWindow(period))
	})
}

// book takes k×rate permits of lim ahead, as other traffic would: the next permit
// comes k periods from now.
func book(t *testing.T, lim *throttle.Limiter, k int) {
	t.Helper()
	for range k {
		r, err := lim.Reserve(context.Background(), lim.Limits()[0].Rate, time.Minute)
		if err != nil || !r.OK() {
			t.Fatalf("booking ahead: ok %v, err %v", r != nil && r.OK(), err)
		}
	}
}

// bookingFirst returns a pick for ThrottleFunc that gives lim, taking k periods of it
// ahead (see book) on its first call: the first task that reaches the middleware finds
// the limit booked k periods ahead whenever the server dequeued it.
func bookingFirst(t *testing.T, lim *throttle.Limiter, k int) func(context.Context, *asynq.Task) (*throttle.Limiter, error) {
	var once sync.Once
	return func(context.Context, *asynq.Task) (*throttle.Limiter, error) {
		once.Do(func() { book(t, lim, k) })
		return lim, nil
	}
}

// On a server whose Config did not go through the Setup's Config, nothing is handed
// back: asynq would count each hand-back as a failure and bring the task back at
// once, again and again. Every task sleeps in its worker until its permit and runs
// once, and the middleware says so once, at error level, through the Setup's logger.
func TestUnconfiguredServerNeverHandsBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tasks", throttle.PerSecond(10))
		c := newCounters()
		log := &logRecorder{testLogger: testLogger{t}}
		jt := asynqmw.New(b.Client, asynqmw.WithHooks(c.hooks()))
		jt.Config(asynq.Config{Logger: log}) // another server's
		cfg := f.serverConfig(4)
		cfg.Logger = log
		f.start(cfg, f.handler(nil), jt.ThrottleFunc(bookingFirst(t, lim, 2))) // the next permit 2 s away
		f.enqueue("final", asynq.MaxRetry(0))
		f.enqueue("retrying", asynq.MaxRetry(3))
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 2 })

		f.ranOnce(qi, "final", "retrying")
		if got := c.sum(c.throttled); got != 0 {
			t.Errorf("hand-backs: %d, want 0", got)
		}
		for _, id := range []string{"final", "retrying"} {
			if got := get(c, c.waited, id); got < 1500*time.Millisecond {
				t.Errorf("task %s slept %v in the middleware, want about 2s", id, got)
			}
		}
		if got := log.count("error", "did not go through Setup.Config"); got != 1 {
			t.Errorf("errors logged that the Config was not the Setup's: %d, want 1 (%q)", got, log.all())
		}
	})
}

// Real failures are still failures: a task that always fails is retried and then
// archived as asynq normally does; one that failed once is, on its last attempt,
// throttled, and handed back as a copy (with no retries left) instead of being
// archived.
func TestRealFailuresStillCount(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tasks", throttle.PerSecond(10))
		c := newCounters()
		fail := func(ctx context.Context, id string, retried int) error {
			switch {
			case id == "always":
				return errBoom
			case id == "once" && len(f.runs.get(id)) == 1:
				book(t, lim, 3) // the retry finds the limit booked 3 s ahead
				return errBoom
			}
			return nil
		}
		jt := asynqmw.New(b.Client, asynqmw.InlineWait(300*time.Millisecond), asynqmw.WithHooks(c.hooks()))
		pick := func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
			if string(task.Payload()) == "once" {
				return lim, nil
			}
			return nil, nil
		}
		f.run(jt, 4, f.handler(fail), jt.ThrottleFunc(pick))
		f.enqueue("always", asynq.MaxRetry(1))
		f.enqueue("once", asynq.MaxRetry(1))
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 4 })

		if got := f.runs.get("always"); len(got) != 2 || got[0] != 0 || got[1] != 1 {
			t.Errorf("always-failing task: retry counts of its runs %v, want [0 1]", got)
		}
		if got := f.runs.get("once"); len(got) != 2 || got[0] != 0 || got[1] != 0 {
			t.Errorf("failed-once task: retry counts of its runs %v, want [0 0] (the second its copy's)", got)
		}
		arch, err := f.insp.ListArchivedTasks(f.queue)
		if err != nil {
			t.Fatal(err)
		}
		if len(arch) != 1 || string(arch[0].Payload) != "always" || arch[0].LastErr != errBoom.Error() {
			for _, a := range arch {
				t.Logf("archived %s (%s): %s", a.Payload, a.ID, a.LastErr)
			}
			t.Errorf("archived: got %d tasks, want only the always-failing one, with its error", len(arch))
		}
		// 3 failures: "always" twice (retry, then archive), "once" once.
		if qi.FailedTotal != 3 {
			t.Errorf("failed total: got %d, want 3", qi.FailedTotal)
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		if c.throttled["once"] != 1 || c.requeued["once"] != 1 {
			t.Errorf("failed-once task on its last attempt: handed back %d times, %d as a copy; want 1 and 1",
				c.throttled["once"], c.requeued["once"])
		}
	})
}

var errBoom = errors.New("boom")

// handlerCalls is a next handler that counts its calls.
type handlerCalls struct{ n int }

func (h *handlerCalls) ProcessTask(context.Context, *asynq.Task) error { h.n++; return nil }

// The middleware called directly, outside an asynq server: no retry counters in the
// context, so no attempt is final and long waits come back as *ThrottledError.
func TestThrottleDecisions(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		task := asynq.NewTask("job", nil)
		newLim := func(key string, l throttle.Limit) *throttle.Limiter {
			lim, err := throttle.New(b.Client, key, l, throttle.WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			return lim
		}

		t.Run("runs at once, then hands back a long wait", func(t *testing.T) {
			lim := newLim("long", throttle.Limit{Rate: 1, Period: 10 * time.Second})
			next := &handlerCalls{}
			h := asynqmw.New(b.Client, asynqmw.InlineWait(100*time.Millisecond)).Throttle(lim)(next)
			if err := h.ProcessTask(ctx, task); err != nil || next.n != 1 {
				t.Fatalf("first task: err %v, handler calls %d; want nil, 1", err, next.n)
			}
			err := h.ProcessTask(ctx, task)
			var te *asynqmw.ThrottledError
			if !errors.As(err, &te) {
				t.Fatalf("second task: err %v, want a *ThrottledError", err)
			}
			if te.RetryIn < 9*time.Second || te.RetryIn > 10*time.Second || te.Key != "long" || te.Limit != "1 per 10s" || te.Requeued {
				t.Errorf("got %+v, want RetryIn about 10s, Key long, Limit 1 per 10s, not requeued", te)
			}
			if next.n != 1 {
				t.Errorf("handler calls: got %d, want 1", next.n)
			}
			// Nothing was booked: a caller that takes the permit when it comes is not
			// queued behind the throttled task. Delay counts from each reply's arrival,
			// whose latencies differ by µs; a booking behind the task would be 10s later.
			r, err := lim.Reserve(ctx, 1, time.Minute)
			if err != nil || r.Delay() > te.RetryIn+100*time.Millisecond {
				t.Errorf("after the hand-back a booking is due in %v (err %v), want <= %v (+100ms)", r.Delay(), err, te.RetryIn)
			}
		})

		t.Run("sleeps a short wait", func(t *testing.T) {
			grants := redistest.RecordGrants(b.Client)
			lim := newLim("short", throttle.Limit{Rate: 1, Period: 150 * time.Millisecond})
			next := &handlerCalls{}
			var slept time.Duration
			h := asynqmw.New(b.Client, asynqmw.InlineWait(time.Second), asynqmw.WithHooks(asynqmw.Hooks{
				Waited: func(_ context.Context, _ *asynq.Task, d time.Duration) { slept = d },
			})).Throttle(lim)(next)
			start := time.Now()
			for range 2 {
				if err := h.ProcessTask(ctx, task); err != nil {
					t.Fatal(err)
				}
			}
			// The second permit comes 150ms after the first, by Redis's clock; the task
			// sleeps the wait its reply gave (timers fire late, not early), which is
			// shorter than 150ms by however late the machine sent the second call (70ms
			// at load 17): the sleep is judged against that wait, not against 150ms.
			var mine []redistest.Grant
			for _, g := range grants.List() {
				if strings.Contains(g.Key, b.Prefix+"short}") {
					mine = append(mine, g)
				}
			}
			if len(mine) != 2 {
				t.Fatalf("%d grants, want 2", len(mine))
			}
			if gap := mine[1].At.Sub(mine[0].At); gap < 150*time.Millisecond {
				t.Errorf("the second permit took effect %v after the first, want >= 150ms", gap)
			}
			wait := mine[1].Wait.Truncate(time.Millisecond)
			if el := time.Since(start); next.n != 2 || el < 140*time.Millisecond || slept < wait {
				t.Errorf("handler calls %d after %v, hook saw %v asleep; want 2 after >= 150ms, asleep >= the %v the reply said", next.n, el, slept, wait)
			}
		})

		t.Run("never sleeps into the deadline's second half", func(t *testing.T) {
			next := &handlerCalls{}
			// 2s left: the default leaves half to the handler, 1s < the wait of a
			// limiter of 1 per 10s (as long as this test stalls for less than 9s).
			long := newLim("deadline-10s", throttle.Limit{Rate: 1, Period: 10 * time.Second})
			h := asynqmw.New(b.Client, asynqmw.InlineWait(20*time.Second)).Throttle(long)(next)
			if err := h.ProcessTask(ctx, task); err != nil {
				t.Fatal(err)
			}
			dctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := h.ProcessTask(dctx, task); !asynqmw.IsThrottled(err) {
				t.Errorf("with 2s to the deadline: err %v, want throttled", err)
			}
			// HandlerTime(50ms) lets it sleep up to the last 50ms: enough. A deadline
			// of 2.9s, set after the permit of a limiter of 1 per 1.5s was taken: the
			// default would leave it 1.45s, under the wait (up to 1.5s); the permit is
			// due at least 1.4s before the deadline, which the Reserve call and the
			// sleeper's wake-up may take together. (On miniredis the server clock
			// stands still here, so the wait is a full 1.5s however late this runs:
			// with a 1s deadline and 800ms, then 2s and 1.5s, the deadline won at load
			// 6 and 10; the throttled call above shared the limiter and failed after a
			// 500ms stall, load 10.)
			lim := newLim("deadline", throttle.Limit{Rate: 1, Period: 1500 * time.Millisecond})
			if err := asynqmw.New(b.Client).Throttle(lim)(next).ProcessTask(ctx, task); err != nil {
				t.Fatal(err)
			}
			dctx2, cancel2 := context.WithTimeout(ctx, 2900*time.Millisecond)
			defer cancel2()
			h = asynqmw.New(b.Client, asynqmw.InlineWait(4*time.Second), asynqmw.HandlerTime(50*time.Millisecond)).Throttle(lim)(next)
			if err := h.ProcessTask(dctx2, task); err != nil || next.n != 3 {
				t.Errorf("with HandlerTime(50ms): err %v, handler calls %d; want nil, 3", err, next.n)
			}
		})

		t.Run("an inline wait of 0 never sleeps", func(t *testing.T) {
			// A period of 10s: the second call must find the permit taken however late
			// it runs (with 100ms, a starved machine let the second through: load 6).
			lim := newLim("zero", throttle.Limit{Rate: 1, Period: 10 * time.Second})
			next := &handlerCalls{}
			h := asynqmw.New(b.Client, asynqmw.InlineWait(0)).Throttle(lim)(next)
			_ = h.ProcessTask(ctx, task)
			if err := h.ProcessTask(ctx, task); !asynqmw.IsThrottled(err) || next.n != 1 {
				t.Errorf("err %v, handler calls %d; want throttled, 1", err, next.n)
			}
		})

		t.Run("a done context gives the booking back", func(t *testing.T) {
			// The booking is given back by the sleeper's Cancel, or, when the cancel
			// came while Reserve's reply was on its way (a Redis call slower than 50ms
			// on a starved machine), by the late reply's give-back, which may run
			// after ProcessTask returned (seen: a booking still held 20s ahead, load
			// 20). Either calls the Cancelled hook: the test waits for it.
			gaveBack := make(chan struct{}, 1)
			lim, err := throttle.New(b.Client, "cancel", throttle.Limit{Rate: 1, Period: 10 * time.Second},
				throttle.WithKeyPrefix(b.Prefix), throttle.WithHooks(throttle.Hooks{Cancelled: func(string, int) {
					select {
					case gaveBack <- struct{}{}:
					default:
					}
				}}))
			if err != nil {
				t.Fatal(err)
			}
			next := &handlerCalls{}
			h := asynqmw.New(b.Client, asynqmw.InlineWait(time.Minute)).Throttle(lim)(next)
			_ = h.ProcessTask(ctx, task)
			// The deadline leaves 1s to sleep, under the ~10s wait: throttled, nothing
			// booked. (A 50ms deadline failed when the Reserve call itself took longer,
			// at load 8: ErrUnavailable. This tolerates a 2s call.)
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			if err := h.ProcessTask(cctx, task); !asynqmw.IsThrottled(err) {
				t.Fatalf("err %v, want throttled", err)
			}
			cctx, cancel = context.WithCancel(ctx)
			go func() { time.Sleep(50 * time.Millisecond); cancel() }()
			if err := h.ProcessTask(cctx, task); !errors.Is(err, context.Canceled) || next.n != 1 {
				t.Fatalf("cancelled while asleep: err %v, handler calls %d; want context.Canceled, 1", err, next.n)
			}
			select {
			case <-gaveBack:
			case <-time.After(10 * time.Second):
				t.Fatal("the cancelled booking was not given back within 10s")
			}
			// The cancelled booking was given back: the next one is due when the first
			// permit leaves the window, not a period after that.
			r, err := lim.Reserve(ctx, 1, time.Minute)
			if err != nil || r.Delay() > 10*time.Second {
				t.Errorf("next booking due in %v (err %v), want <= 10s", r.Delay(), err)
			}
		})
	})
}

// Bad input and failures are failures, named: a nil limiter, pick or client, a bad
// option, pick's errors, and Redis errors.
func TestThrottleErrors(t *testing.T) {
	ctx := context.Background()
	task := asynq.NewTask("job", nil)
	next := &handlerCalls{}
	mb := redistest.NewMini(t)
	jt := asynqmw.New(mb.Client)
	wantPanic(t, "Throttle(nil)", "Throttle(nil)", func() { jt.Throttle(nil) })
	wantPanic(t, "ThrottleFunc(nil)", "ThrottleFunc(nil)", func() { jt.ThrottleFunc(nil) })
	wantPanic(t, "Concurrency(nil)", "Concurrency(nil)", func() { jt.Concurrency(nil) })
	wantPanic(t, "New(nil)", "New(nil)", func() { asynqmw.New(nil) })
	for name, o := range map[string]asynqmw.Option{
		"InlineWait(-1s)":       asynqmw.InlineWait(-time.Second),
		"HandlerTime(-1s)":      asynqmw.HandlerTime(-time.Second),
		"MaxSleepingWorkers(0)": asynqmw.MaxSleepingWorkers(0),
	} {
		wantPanic(t, "New with "+name, "invalid option", func() { asynqmw.New(mb.Client, o) })
	}
	pickErr := errors.New("no such tenant")
	err := jt.ThrottleFunc(func(context.Context, *asynq.Task) (*throttle.Limiter, error) { return nil, pickErr })(next).ProcessTask(ctx, task)
	if !errors.Is(err, pickErr) || asynqmw.IsThrottled(err) {
		t.Errorf("pick error: err %v, want a failure wrapping it", err)
	}
	err = jt.ThrottleFunc(func(context.Context, *asynq.Task) (*throttle.Limiter, error) { return nil, nil })(next).ProcessTask(ctx, task)
	if err != nil {
		t.Errorf("pick returning no limiter: err %v, want nil (not limited)", err)
	}
	if next.n != 1 {
		t.Errorf("handler calls: got %d, want 1 (only the unlimited task)", next.n)
	}

	b := redistest.NewMini(t)
	lim, err := throttle.New(b.Client, "k", throttle.PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	// Redis unavailable (FailClosed): a throttle, tried again within the inline wait.
	b.SetError("LOADING Redis is loading the dataset in memory")
	start := time.Now()
	err = asynqmw.New(b.Client, asynqmw.InlineWait(300*time.Millisecond)).Throttle(lim)(next).ProcessTask(ctx, task)
	took := time.Since(start)
	var te *asynqmw.ThrottledError
	if !errors.As(err, &te) || !errors.Is(err, throttle.ErrUnavailable) || next.n != 1 {
		t.Errorf("Redis unavailable: err %v, handler calls %d; want a *ThrottledError wrapping ErrUnavailable, no call", err, next.n)
	} else if te.RetryIn != time.Second || te.Key != "k" {
		t.Errorf("Redis unavailable: RetryIn %v, Key %q; want 1s, \"k\"", te.RetryIn, te.Key)
	}
	if took < 150*time.Millisecond || took > 2*time.Second {
		t.Errorf("Redis unavailable: gave up after %v; want it tried again for about the inline wait (300ms)", took)
	}
	// A refusal that is not unavailability stays a failure.
	b.SetError("NOPERM this user has no permissions to run the 'evalsha' command")
	err = asynqmw.New(b.Client).Throttle(lim)(next).ProcessTask(ctx, task)
	if err == nil || asynqmw.IsThrottled(err) || next.n != 1 {
		t.Errorf("Redis refusing: err %v, handler calls %d; want a failure, not a throttle, and no call", err, next.n)
	}
}

// A server shut down while its tasks sleep for their permits loses none: asynq puts
// them back in the queue (its ShutdownTimeout passed), the middleware gives their
// bookings back, and another server runs each exactly once.
func TestShutdownWhileWaitingLosesNothing(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) { shutdownWhileWaiting(t, b) })
}

func shutdownWhileWaiting(t *testing.T, b *redistest.Backend) {
	{
		const n = 12
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		// 4 per 2s: the sleepers are due 2s and 4s ahead, far from the first server's
		// abort (ShutdownTimeout after the 4th run was seen). asynq v0.26 requeues a
		// task at its abort while the handler's goroutine goes on (processor.go picks
		// at random between the abort and a handler that just returned): a sleeper
		// waking then ran twice (runs [0 0], per second: wake-ups 1s ahead, the 4th run
		// seen up to 0.8s late at load 8). This tolerates seeing it up to 1.8s late.
		lim := f.limiter("tasks", throttle.Limit{Rate: 4, Period: 2 * time.Second})
		jt := asynqmw.New(b.Client, asynqmw.InlineWait(10*time.Second))
		mw := jt.Throttle(lim)
		cfg := f.serverConfig(n)
		cfg.ShutdownTimeout = 200 * time.Millisecond
		first := f.start(jt.Config(cfg), f.handler(nil), mw)
		tasks := append(ids("final", n/2), ids("retrying", n/2)...)
		for i, id := range tasks {
			f.enqueue(id, asynq.MaxRetry(3*min(i/(n/2), 1)))
		}
		// 4 run at once; the other 8 sleep, booked 2 s and 4 s ahead.
		deadline := time.Now().Add(10 * time.Second)
		for f.runs.total() < 4 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		first.Shutdown()
		f.servers = f.servers[1:]
		if got := f.runs.total(); got >= n {
			t.Fatalf("runs before the shutdown: got %d, want fewer than %d (some asleep)", got, n)
		}
		f.run(jt, n, f.handler(nil), mw)
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= n })

		f.ranOnce(qi, tasks...)
		// The bookings of the aborted sleepers were given back: one permit per task,
		// and one more for each give-back Redis refused because its booking had
		// already taken effect when the script ran (a sleeper the starved machine
		// woke late: 15 permits for 12 tasks were seen at load 17), and for each
		// booking whose task came back to it only after it had taken effect, so
		// that the task booked anew (a booking made while the first server shut
		// down, whose caller had left, or a task the second server dequeued late:
		// 13 and 14 for 12 were seen at load 6–20). A give-back refused before its
		// booking's time, or never sent, and a booking nobody came back to in time
		// without being booked anew, still fail.
		late := 0
		lateAt := map[string]bool{} // a booking counted as given back too late
		for _, gb := range grants.GiveBacks() {
			// (At zero: refused because the task's copy had taken the booking over,
			// which the copy ran on: counted once)
			if !gb.OK && !gb.At.IsZero() && !gb.Replied.Before(gb.At) {
				late += gb.N
				lateAt[gb.Key+"@"+gb.At.String()] = true
			}
		}
		overtaken := 0
		for _, gr := range grants.Overtaken() {
			if !lateAt[gr.Key+"@"+gr.At.String()] { // counted once
				overtaken += gr.N
			}
		}
		if late > 0 || overtaken > 0 {
			t.Logf("%d give-backs came after their booking took effect; %d bookings were booked anew after they took effect", late, overtaken)
		}
		if got := grants.Total(); got != n+late+overtaken {
			for _, gr := range grants.List() {
				t.Logf("grant %+v", gr)
			}
			for _, gb := range grants.GiveBacks() {
				t.Logf("give-back %+v", gb)
			}
			t.Errorf("permits granted (net of cancels): got %d, want %d (+%d given back too late, +%d booked anew after they took effect)", got, n, late, overtaken)
		}
		if got := grants.MaxInWindow(time.Second); got > 4 {
			t.Errorf("most grants in any second: got %d, want <= 4", got)
		}
	}
}

// wantPanic checks that f panics with an error that says sub.
func wantPanic(t *testing.T, what, sub string, f func()) {
	t.Helper()
	defer func() {
		t.Helper()
		r := recover()
		if err, ok := r.(error); !ok || !strings.Contains(err.Error(), sub) {
			t.Errorf("%s: panic %v, want an error saying %q", what, r, sub)
		}
	}()
	f()
}

// A task that comes back before its slot while MaxSleepingWorkers tasks sleep is
// handed back again, booked, without a script call: the middleware handed it back, so
// it knows the slot. The returns served so are the script calls saved: on the task's
// limiter, the calls are the first booking and one per return that asked Redis, so
// fewer than one per return. The task's slot is 4 s ahead, so it is handed back and
// comes back before it (asynq keeps whole seconds); meanwhile another task fills the
// bound of 1, asleep for a semaphore slot the test holds until the first bounce, and
// then frees: the task's next return sleeps for its slot and runs.
func TestBounceWithoutAScriptCall(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	grants := redistest.RecordGrants(b.Client)
	f := newFleet(t, b)
	lim := f.limiter("bounce", throttle.Limit{Rate: 1, Period: 4 * time.Second})
	sem := newSem(t, b, "bound", 1)
	ctx := context.Background()
	if r, err := lim.Allow(ctx); err != nil || !r.Allowed { // the next permit in 4s
		t.Fatalf("Allow: %+v, %v", r, err)
	}
	held, _, err := sem.TryAcquire(ctx)
	if err != nil || held == nil {
		t.Fatalf("TryAcquire: %v, %v", held, err)
	}
	c := newCounters()
	jt := asynqmw.New(b.Client, asynqmw.WithHooks(c.hooks()), asynqmw.InlineWait(time.Hour), asynqmw.MaxSleepingWorkers(1))
	throttled := jt.Throttle(lim)
	bound := jt.Concurrency(sem)
	route := asynq.MiddlewareFunc(func(next asynq.Handler) asynq.Handler {
		return asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			if string(task.Payload()) == "sleeper" {
				return bound(next).ProcessTask(ctx, task)
			}
			return throttled(next).ProcessTask(ctx, task)
		})
	})
	f.run(jt, 3, f.handler(nil), route)
	f.enqueue("sleeper")
	for jt.Stats().Sleeping != 1 {
		time.Sleep(time.Millisecond)
	}
	f.enqueue("bounced")
	for deadline := time.Now().Add(idleLimit); jt.Stats().Bounced == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the task was not handed back again without a script call within %v (came back %d times)", idleLimit, get(c, c.throttled, "bounced"))
		}
	}
	if err := held.Release(ctx); err != nil { // the sleeper runs: the bound frees
		t.Fatal(err)
	}
	qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 2 })
	f.ranOnce(qi, "sleeper", "bounced")
	returns := get(c, c.throttled, "bounced")
	k := grants.ByKey()["{"+b.Prefix+"bounce}:l"]
	calls := 0
	if k != nil {
		calls = k.Calls() - 1 // the test's Allow
	}
	t.Logf("the task came back %d times (%d without a script call); its limiter saw %d script calls", returns, jt.Stats().Bounced, calls)
	if calls >= 1+returns {
		t.Errorf("script calls on the task's limiter: %d for its booking and %d returns, want fewer: a return while the bound was full asked Redis", calls, returns)
	}
}

// Handler starts across two servers (two clients, as two processes) sharing a limit of
// 10 a second, their workers kept busy by the throttled handlers (1.8 s each: about
// all the workers the permits need) and by unthrottled tasks: Redis never lets more
// than 10 permits take effect in a second, and each server's middleware counts no
// more than 10 starts in any second (Hooks.Started, the pacer's bound). The starts as
// the handlers read the clock, fleet-wide, in any 950ms window are the figure: a task
// asleep for its permit holds its worker, so it starts when its permit comes, not when
// a worker frees; what is left is how much later one start follows its permit than
// another (a reply's way back, timers).
func TestStartsAcrossServers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		const (
			rate      = 10
			throttled = 60 // 6 s of the limit
			free      = 100
			window    = 950 * time.Millisecond
		)
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		var (
			mu      sync.Mutex
			starts  []time.Time
			counted [2][]time.Time
		)
		h := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			now := time.Now()
			if task.Type() == "free" {
				time.Sleep(50 * time.Millisecond)
			} else {
				mu.Lock()
				starts = append(starts, now)
				mu.Unlock()
				time.Sleep(1800 * time.Millisecond)
			}
			f.runs.add(string(task.Payload()), 0, "")
			return nil
		})
		addrs, cluster := b.Addrs()
		for s := range 2 {
			rdb := b.Client
			if s == 1 {
				rdb = redistest.Dial(addrs, cluster)
				t.Cleanup(func() { rdb.Close() })
				rdb.AddHook(grants)
			}
			lim, err := throttle.New(rdb, "starts", throttle.PerSecond(rate), throttle.WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			jt := asynqmw.New(rdb, asynqmw.WithHooks(asynqmw.Hooks{Started: func(_ context.Context, _ *asynq.Task, at time.Time) {
				mu.Lock()
				counted[s] = append(counted[s], at)
				mu.Unlock()
			}}))
			mux := asynq.NewServeMux()
			mux.Use(jt.ThrottleFunc(func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
				if task.Type() == "throttled" {
					return lim, nil
				}
				return nil, nil
			}))
			mux.Handle("throttled", h)
			mux.Handle("free", h)
			srv := asynq.NewServerFromRedisClient(rdb, jt.Config(f.serverConfig(10)))
			if err := srv.Start(mux); err != nil {
				t.Fatal(err)
			}
			f.servers = append(f.servers, srv)
		}
		for i := range throttled {
			if _, err := f.client.Enqueue(asynq.NewTask("throttled", []byte(fmt.Sprint("t", i))), asynq.Queue(f.queue), asynq.MaxRetry(i%2)); err != nil {
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
		if qi.Archived != 0 || qi.FailedTotal != 0 || f.runs.total() != throttled+free {
			t.Errorf("runs %d, archived %d, failed %d; want %d, 0, 0", f.runs.total(), qi.Archived, qi.FailedTotal, throttled+free)
		}
		mu.Lock()
		defer mu.Unlock()
		slices.SortFunc(starts, time.Time.Compare)
		most := redistest.MaxTimesInWindow(starts, window)
		if got := grants.MaxInWindow(time.Second); got > rate {
			t.Errorf("most permits taking effect in any second: %d, limit %d", got, rate)
		}
		for s := range counted {
			slices.SortFunc(counted[s], time.Time.Compare)
			if got := redistest.MaxTimesInWindow(counted[s], time.Second); got > rate {
				t.Errorf("server %d's middleware counted %d starts in a second, limit %d", s, got, rate)
			}
		}
		redistest.Figure(t, "%s: 2 servers x 10 workers, %d throttled of 1.8s at %d/s and %d unthrottled of 50ms: most handler starts in any %v %d (in any 1s %d); Redis grants in any 1s %d",
			b.Kind, throttled, rate, free, window, most, redistest.MaxTimesInWindow(starts, time.Second), grants.MaxInWindow(time.Second))
	})
}

// A task's estimated costs: ThrottleFunc gives a Cost handle (the estimate from the
// task), the task is handed back keeping its booking of the estimate, and its handler
// settles the actual through its context (waiter.Settle): two servers, every task run
// once and settled (the settle's effect on the limits is the lua package's tests').
func TestTaskCostsSettledByTheHandler(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim, err := throttle.New(b.Client, "costs", throttle.PerSecond(20), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithLimits(throttle.Limit{Rate: 1000, Period: time.Second, Unit: "tokens"}))
		if err != nil {
			t.Fatal(err)
		}
		const n = 12 // 500 tokens estimated each: 2 a second, so most are handed back
		pick := func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
			return lim.Cost(map[string]int{"tokens": 500}), nil
		}
		var settled atomic.Int64
		settle := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			if err := waiter.Settle(ctx, map[string]int{"tokens": 100}); err != nil {
				t.Errorf("task %s: Settle: %v", task.Payload(), err)
			} else {
				settled.Add(1)
			}
			return f.handler(nil).ProcessTask(ctx, task)
		})
		for range 2 {
			jt := asynqmw.New(b.Client)
			f.run(jt, 4, settle, jt.ThrottleFunc(pick))
		}
		tasks := ids("cost", n)
		for _, id := range tasks {
			f.enqueue(id, asynq.MaxRetry(3))
		}
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= n })
		f.ranOnce(qi, tasks...)
		if settled.Load() != n { // each a settle Redis applied (nil: applied, or found applied)
			t.Fatalf("%d tasks settled, want %d", settled.Load(), n)
		}
	})
}

// Two tasks of the same ID in two queues (asynq keeps a task ID unique within its
// queue only) are two tasks to the limiter: each books a permit of its own, and their
// handlers start a period apart, not both on the first one's booking.
func TestSameTaskIDInTwoQueues(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		other := f.queue + "-b"
		t.Cleanup(func() { _ = f.insp.DeleteQueue(other, true) })
		lim := f.limiter("same-id", throttle.Limit{Rate: 1, Period: 3 * time.Second})
		var (
			mu     sync.Mutex
			starts []time.Time
		)
		jt := asynqmw.New(b.Client, asynqmw.WithHooks(asynqmw.Hooks{
			Started: func(_ context.Context, _ *asynq.Task, at time.Time) {
				mu.Lock()
				starts = append(starts, at)
				mu.Unlock()
			},
		}))
		// the next permit 3s ahead: each task is handed back, booked
		book(t, lim, 1)
		cfg := f.serverConfig(4)
		cfg.Queues = map[string]int{f.queue: 1, other: 1}
		f.start(jt.Config(cfg), f.handler(nil), jt.Throttle(lim))
		f.enqueue("a", asynq.TaskID("same"))
		f.enqueue("b", asynq.TaskID("same"), asynq.Queue(other))
		deadline := time.Now().Add(idleLimit)
		for {
			mu.Lock()
			n := len(starts)
			mu.Unlock()
			if n == 2 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d of 2 tasks started after %v", n, idleLimit)
			}
			time.Sleep(20 * time.Millisecond)
		}
		f.stop()
		if gap := starts[1].Sub(starts[0]); gap < 3*time.Second {
			t.Errorf("the tasks of ID %q in two queues started %v apart, limit 1 per 3s: both ran on one booking", "same", gap)
		}
	})
}

// Every legal asynq task gets a booking: asynq bounds neither a task ID's length nor a
// queue name's, so a task whose queue and ID together are longer than a booking ID may
// be runs on a booking like any other, without an error, once.
func TestLongTaskID(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("long-id", throttle.PerMinute(10))
		jt := asynqmw.New(b.Client)
		f.run(jt, 2, f.handler(nil), jt.Throttle(lim))
		f.enqueue("near", asynq.TaskID(strings.Repeat("n", 500)), asynq.MaxRetry(0))
		f.enqueue("far", asynq.TaskID(strings.Repeat("f", 4000)), asynq.MaxRetry(0))
		f.ranOnce(f.waitIdle(idleLimit, nil), "near", "far")
	})
	// and a long ID's booking, in two queues, is two bookings
	long := strings.Repeat("i", 600)
	a, b := asynqmw.BookingID("a", long), asynqmw.BookingID("b", long)
	if a == b || len(a) > 512 || len(b) > 512 || a != asynqmw.BookingID("a", long) {
		t.Errorf("booking IDs of one long task ID in two queues: %q and %q, want two of at most 512 bytes", a, b)
	}
}
