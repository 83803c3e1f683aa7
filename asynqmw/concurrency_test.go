package asynqmw_test

import (
	"context"
	"errors"
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

func newSem(t *testing.T, b *redistest.Backend, key string, max int, opts ...throttle.SemaphoreOption) *throttle.Semaphore {
	t.Helper()
	sem, err := throttle.NewSemaphore(b.Client, key, max, append([]throttle.SemaphoreOption{throttle.WithKeyPrefix(b.Prefix)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	return sem
}

// free reports how many leases sem grants now (and releases them again).
func free(t *testing.T, sem *throttle.Semaphore) int {
	t.Helper()
	var leases []*throttle.Lease
	for range sem.Max() {
		l, _, err := sem.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if l == nil {
			break
		}
		leases = append(leases, l)
	}
	for _, l := range leases {
		_ = l.Release(context.Background())
	}
	return len(leases)
}

// Tasks through Concurrency on two servers: never more than max in their handlers at
// once, each runs exactly once, none archived or failed, every lease released. The
// first max tasks hold their slots for 600ms, so that tasks dequeued meanwhile are
// handed back, whatever the pace of the dequeues.
func TestConcurrencyAcrossServers(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		const (
			max = 3
			n   = 24
		)
		f := newFleet(t, b)
		sem := newSem(t, b, "inflight", max)
		c := newCounters()
		var inside, most atomic.Int64
		work := func(ctx context.Context, id string, retried int) error {
			k := inside.Add(1)
			for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
			}
			if strings.HasPrefix(id, "hog") {
				time.Sleep(600 * time.Millisecond)
			} else {
				time.Sleep(80 * time.Millisecond) // the task's work
			}
			inside.Add(-1)
			return nil
		}
		for range 2 {
			jt := asynqmw.New(b.Client, asynqmw.InlineWait(150*time.Millisecond), asynqmw.WithHooks(c.hooks()))
			f.run(jt, 6, f.handler(work), jt.Concurrency(sem))
		}
		hogs := ids("hog", max)
		for _, id := range hogs {
			f.enqueue(id)
		}
		final, retrying := ids("final", n/2), ids("retrying", n/2)
		for i := range final {
			f.enqueue(final[i], asynq.MaxRetry(0))
			f.enqueue(retrying[i], asynq.MaxRetry(3))
		}
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= n+max })

		if got := most.Load(); got > max {
			t.Errorf("most tasks in their handlers at once: got %d, want <= %d", got, max)
		}
		f.ranOnce(qi, append(append(hogs, final...), retrying...)...)
		// (The inline path, a slot within the inline wait, is TestConcurrencyLease's: here
		// a loaded host may free none in time.)
		if c.sum(c.throttled) == 0 {
			t.Errorf("no hand-back: the test did not exercise the hand-back path")
		}
		c.lastAttemptsAsCopies(t, final...)
		if got := free(t, sem); got != max {
			t.Errorf("after the run %d of %d slots are free, want all", got, max)
		}
		t.Logf("most in flight %d (max %d); %d hand-backs, %d inline waits", most.Load(), max, c.sum(c.throttled), len(c.waited))
	})
}

// The lease is released whatever the handler does, kept while it runs past the lease
// TTL, and a full semaphore hands the task back.
func TestConcurrencyLease(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		task := asynq.NewTask("job", nil)
		sem := newSem(t, b, "lease", 1, throttle.WithLeaseTTL(time.Second))
		run := func(h asynq.HandlerFunc) error {
			return asynqmw.New(b.Client, asynqmw.InlineWait(0)).Concurrency(sem)(h).ProcessTask(ctx, task)
		}

		if err := run(func(context.Context, *asynq.Task) error { return errBoom }); !errors.Is(err, errBoom) || free(t, sem) != 1 {
			t.Errorf("failing handler: err %v, free slots %d; want boom, 1", err, free(t, sem))
		}
		func() {
			defer func() {
				if p := recover(); p != "oops" {
					t.Errorf("panic: recovered %v, want the handler's own value oops", p)
				}
			}()
			_ = run(func(context.Context, *asynq.Task) error { panic("oops") })
		}()
		if got := free(t, sem); got != 1 {
			t.Errorf("after a panicking handler: free slots %d, want 1", got)
		}

		// A handler still running after its lease's TTL keeps its slot (the lease was
		// extended); others are handed back.
		//
		// The lease is extended every TTL/3 and is lost when no extension lands within
		// a TTL: this tolerates 2/3 of the TTL (667ms) without the keep-alive running.
		// A longer starvation loses the lease (seen on redis-server, load 13: the second
		// task got the slot); the product then cancels the handler's context with a
		// cause wrapping ErrLeaseLost, and that is what the test then checks: a second
		// task never shares the slot with a handler that was not told to stop.
		var (
			during error
			lost   error
		)
		err := run(func(hctx context.Context, _ *asynq.Task) error {
			time.Sleep(1400 * time.Millisecond)
			during = run(func(context.Context, *asynq.Task) error { return nil })
			if during == nil {
				select {
				case <-hctx.Done():
				case <-time.After(10 * time.Second):
				}
				lost = context.Cause(hctx)
			}
			return nil
		})
		var te *asynqmw.ThrottledError
		switch {
		case err != nil:
			t.Fatalf("long handler: err %v, want nil", err)
		case during == nil && errors.Is(lost, throttle.ErrLeaseLost):
			t.Logf("long handler: the lease was lost (the machine starved its keep-alive): %v; the second task ran", lost)
		case !errors.As(during, &te):
			t.Fatalf("long handler: a second task meanwhile got %v (the handler's context: %v), want a *ThrottledError", during, lost)
		case te.Key != "lease" || te.Limit != "1 in flight" || te.RetryIn <= 0 || te.RetryIn > time.Second:
			t.Errorf("got %+v, want Key lease, Limit 1 in flight, 0 < RetryIn <= 1s", te)
		}
		if got := free(t, sem); got != 1 {
			t.Errorf("after the long handler: free slots %d, want 1", got)
		}

		// Waiting inline: a slot released within MaxInlineWait is taken, and the
		// handler runs only after the release was sent. (Timing it from a start taken
		// after the releasing goroutine was started failed at load 2–13: that goroutine
		// began its 100ms sleep while this one waited to run, and the handler ran 65ms
		// after start.) Tolerance: the release is sent 100ms after the task starts
		// waiting, as the machine allows; MaxInlineWait (10s) is what it may take.
		acquiring := time.Now()
		l, _, err := sem.TryAcquire(ctx)
		if err != nil || l == nil {
			t.Fatalf("TryAcquire: %v, %v; want the free slot", l, err)
		}
		releasing := make(chan time.Time, 1)
		go func() {
			time.Sleep(100 * time.Millisecond)
			releasing <- time.Now()
			_ = l.Release(ctx)
		}()
		var ran time.Time
		err = asynqmw.New(b.Client, asynqmw.InlineWait(10*time.Second)).Concurrency(sem)(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
			ran = time.Now()
			return nil
		})).ProcessTask(ctx, task)
		var sent time.Time
		select {
		case sent = <-releasing:
		default:
		}
		// The slot may also free by the lease's expiry (1s TTL) if the releasing
		// goroutine is starved that long.
		expired := !ran.IsZero() && ran.Sub(acquiring) >= time.Second
		if err != nil || ran.IsZero() || (!expired && (sent.IsZero() || ran.Before(sent))) {
			t.Errorf("inline wait: err %v, handler ran %v after the slot was taken, release sent %v after; want nil, the handler run after the release (or the lease's 1s TTL)",
				err, ran.Sub(acquiring), sent.Sub(acquiring))
		}
	})
}

// A semaphore whose Redis is unavailable (FailClosed) throttles the task, tried again
// within the inline wait: a *ThrottledError wrapping throttle.ErrUnavailable, no
// call of the handler. When Redis answers again, the task runs.
func TestConcurrencyRedisUnavailable(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	sem := newSem(t, b, "down", 2)
	next := &handlerCalls{}
	mw := asynqmw.New(b.Client, asynqmw.InlineWait(300*time.Millisecond)).Concurrency(sem)(next)
	ctx := context.Background()
	task := asynq.NewTask("job", nil)

	b.SetError("LOADING Redis is loading the dataset in memory")
	start := time.Now()
	err := mw.ProcessTask(ctx, task)
	took := time.Since(start)
	var te *asynqmw.ThrottledError
	if !errors.As(err, &te) || !errors.Is(err, throttle.ErrUnavailable) || next.n != 0 {
		t.Fatalf("Redis unavailable: err %v, handler calls %d; want a *ThrottledError wrapping ErrUnavailable, no call", err, next.n)
	}
	if te.Limit != "2 in flight" || te.RetryIn != time.Second {
		t.Errorf("Redis unavailable: Limit %q, RetryIn %v; want \"2 in flight\", 1s", te.Limit, te.RetryIn)
	}
	if took < 150*time.Millisecond || took > 2*time.Second {
		t.Errorf("handed back after %v; want it tried again for about the inline wait (300ms)", took)
	}

	b.SetError("")
	if err := mw.ProcessTask(ctx, task); err != nil || next.n != 1 {
		t.Fatalf("Redis back: err %v, handler calls %d; want the task run", err, next.n)
	}
	if got := free(t, sem); got != 2 {
		t.Errorf("after the task: %d slots free, want 2 (its lease released)", got)
	}
}

// A full semaphore parks no more tasks than the Setup's sleeping bound: with a bound
// of 1, a second task that finds the semaphore full while one already waits is handed
// back at once; the waiting one gets the slot when it is released. The middlewares of
// one Setup share the bound, so a throttled task would count against it too.
func TestConcurrencyKeepsTheSleepingBound(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	sem := newSem(t, b, "bound", 1)
	ctx := context.Background()
	held, _, err := sem.TryAcquire(ctx)
	if err != nil || held == nil {
		t.Fatalf("TryAcquire: %v, %v", held, err)
	}
	jt := asynqmw.New(b.Client, asynqmw.MaxSleepingWorkers(1), asynqmw.InlineWait(time.Minute))
	ran := make(chan struct{}, 2)
	h := jt.Concurrency(sem)(asynq.HandlerFunc(func(context.Context, *asynq.Task) error {
		ran <- struct{}{}
		return nil
	}))
	task := asynq.NewTask("job", nil)
	first := make(chan error, 1)
	go func() { first <- h.ProcessTask(ctx, task) }()
	for jt.Stats().Sleeping != 1 { // the first task waits for the slot
		time.Sleep(time.Millisecond)
	}
	err = h.ProcessTask(ctx, task)
	var te *asynqmw.ThrottledError
	if !errors.As(err, &te) || te.Limit != "1 in flight" {
		t.Fatalf("second task while one waits: %v, want a *ThrottledError (1 in flight)", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-first; err != nil {
		t.Fatalf("first task: %v", err)
	}
	if got := len(ran); got != 1 {
		t.Errorf("handler runs: %d, want 1 (the first task)", got)
	}
	if st := jt.Stats(); st.PeakSleeping != 1 || st.Sleeping != 0 || st.HandedBack != 1 {
		t.Errorf("stats %+v, want a peak of 1 asleep, none now, 1 hand-back", st)
	}
}

// Handed-back tasks keep their place in the semaphore's queue: five tasks that find a
// semaphore of 1 full are handed back, one after the other; when the slot frees, they
// run in that order, whichever comes back first, each on the slot the one before
// releases.
func TestConcurrencyHandedBackInOrder(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		sem := newSem(t, b, "order", 1, throttle.WithLeaseTTL(time.Minute))
		holder, _, err := sem.TryAcquire(context.Background())
		if err != nil || holder == nil {
			t.Fatalf("TryAcquire: %v, %v", holder, err)
		}
		c := newCounters()
		var mu sync.Mutex
		var order []string
		work := func(_ context.Context, id string, _ int) error {
			mu.Lock()
			order = append(order, id)
			mu.Unlock()
			time.Sleep(50 * time.Millisecond)
			return nil
		}
		// None may sleep for the slot; each is enqueued once the one before has its
		// place.
		jt := asynqmw.New(b.Client, asynqmw.InlineWait(0), asynqmw.WithHooks(c.hooks()))
		f.run(jt, 1, f.handler(work), jt.Concurrency(sem))
		tasks := ids("t", 5)
		deadline := time.Now().Add(idleLimit)
		for _, id := range tasks {
			f.enqueue(id, asynq.MaxRetry(3))
			for get(c, c.throttled, id) == 0 {
				if time.Now().After(deadline) {
					t.Fatalf("task %s never handed back", id)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		if err := holder.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= len(tasks) })
		f.ranOnce(qi, tasks...)
		mu.Lock()
		defer mu.Unlock()
		if !slices.Equal(order, tasks) {
			t.Errorf("run order %v, want %v (the order they were handed back in)", order, tasks)
		}
		t.Logf("%d hand-backs for %d tasks", c.sum(c.throttled), len(tasks))
	})
}

// Under Concurrency of 1, a handler asynq gave up on but that goes on running (it
// ignores its context) still holds the slot: the task's next attempt must wait for
// it, whether asynq gave up because the task's timeout passed (it retries the task)
// or because its server shut down mid-handler (it requeues the task for another
// server). Handlers at once must be 1 in both cases: each attempt's lease is its own.
func TestConcurrencyAbandonedHandlerKeepsItsSlot(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout bool // asynq gives up on the task at its timeout; else at a shutdown
	}{{"after a task timeout", true}, {"after a server shutdown mid-handler", false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			eachBackend(t, func(t *testing.T, b *redistest.Backend) {
				f := newFleet(t, b)
				sem := newSem(t, b, "abandoned", 1, throttle.WithLeaseTTL(10*time.Second))
				var inside, most atomic.Int64
				started := make(chan struct{}, 4)
				work := func(ctx context.Context, id string, retried int) error {
					k := inside.Add(1)
					for m := most.Load(); k > m && !most.CompareAndSwap(m, k); m = most.Load() {
					}
					started <- struct{}{}
					if len(f.runs.get(id)) == 1 {
						time.Sleep(3 * time.Second) // ignores ctx: goes on after asynq gave up
					}
					inside.Add(-1)
					return nil
				}
				jt := asynqmw.New(b.Client, asynqmw.InlineWait(5*time.Second))
				cfg := f.serverConfig(2)
				cfg.ShutdownTimeout = 200 * time.Millisecond
				first := f.start(jt.Config(cfg), f.handler(work), jt.Concurrency(sem))
				if tc.timeout {
					f.enqueue("task", asynq.MaxRetry(3), asynq.Timeout(time.Second)) // whole seconds: asynq keeps no less
				} else {
					f.enqueue("task", asynq.MaxRetry(3))
				}
				<-started
				if !tc.timeout {
					first.Shutdown() // asynq requeues the task; the handler goes on
					f.servers = f.servers[1:]
					jt2 := asynqmw.New(b.Client, asynqmw.InlineWait(5*time.Second))
					f.start(jt2.Config(f.serverConfig(2)), f.handler(work), jt2.Concurrency(sem))
				}
				f.waitIdle(idleLimit, func() bool { return len(f.runs.get("task")) >= 2 && inside.Load() == 0 })
				if got := most.Load(); got != 1 {
					t.Errorf("handlers at once under Concurrency of 1: %d, want 1 (runs %v)", got, f.runs.get("task"))
				}
			})
		})
	}
}
