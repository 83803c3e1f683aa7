package rivermw_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/river/rivermw"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// inFlight counts the workers running at once, and the most there were.
type inFlight struct{ now, most atomic.Int64 }

func (c *inFlight) enter() {
	n := c.now.Add(1)
	for m := c.most.Load(); n > m && !c.most.CompareAndSwap(m, n); m = c.most.Load() {
	}
}

func (c *inFlight) leave() { c.now.Add(-1) }

// semClient starts a client whose every job runs under a lease of sem, with cfg's
// other fields.
func (f *fleet) semClient(sem *throttle.Semaphore, cfg *river.Config, h rivermw.Hooks, run func(ctx context.Context, j *river.Job[throttledArgs]) error) *rivermw.Setup {
	f.t.Helper()
	w := river.NewWorkers()
	river.AddWorker(w, river.WorkFunc(run))
	jt := rivermw.New(rivermw.WithHooks(h))
	cfg.Workers = w
	cfg.Middleware = []rivertype.Middleware{jt.Concurrency(sem)}
	if cfg.Queues == nil {
		cfg.Queues = map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}}
	}
	f.start(jt.Config(cfg))
	return jt
}

// Two clients of 4 workers each share a semaphore of 2: at most 2 jobs run at once,
// and every job runs once, on its first attempt, whether it waited asleep or snoozed.
func TestConcurrencyNeverAboveN(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		sem := f.semaphore("reports", 2)
		var c inFlight
		runs := newRunLog()
		var setups []*rivermw.Setup
		for range 2 {
			setups = append(setups, f.semClient(sem, &river.Config{}, rivermw.Hooks{}, func(_ context.Context, j *river.Job[throttledArgs]) error {
				c.enter()
				defer c.leave()
				runs.add(j.ID, time.Now())
				time.Sleep(300 * time.Millisecond)
				return nil
			}))
		}
		const n = 12
		params := make([]river.InsertManyParams, n)
		for i := range params {
			params[i] = river.InsertManyParams{Args: throttledArgs{N: i}}
		}
		if _, err := f.client.InsertMany(context.Background(), params); err != nil {
			t.Fatal(err)
		}
		jobs := f.waitDone(n, time.Minute)
		f.stop()
		checkRanOnce(t, jobs)
		runs.checkOnce(t, jobs)
		if m := c.most.Load(); m > 2 {
			t.Errorf("%d jobs ran at once, semaphore of 2", m)
		}
		var snoozed int64
		for _, jt := range setups {
			snoozed += jt.Stats().Snoozed
		}
		redistest.Figure(t, "%s: %d jobs of 300ms, 2 clients x 4 workers, semaphore of 2: most in flight %d, snoozes %d", b.Kind, n, c.most.Load(), snoozed)
	})
}

// A job River rescues (stuck past RescueStuckJobsAfter, its worker still running) and
// retries waits for a slot of the semaphore like any other: the stuck attempt holds
// its lease (renewed while its worker runs), so the retry runs only after it returns,
// and no more than the semaphore's 1 run at once.
func TestConcurrencyHoldsAcrossRescue(t *testing.T) {
	b := redistest.NewStandalone(t)
	f := newFleet(t, b)
	sem := f.semaphore("rescue", 1)
	var c inFlight
	runs := newRunLog()
	release := make(chan struct{})
	var (
		mu      sync.Mutex
		retried bool // the middleware saw the job's second attempt
		first   atomic.Bool
	)
	hooks := rivermw.Hooks{
		Throttled: func(_ context.Context, job *rivertype.JobRow, _ *rivermw.ThrottledError) {
			mu.Lock()
			retried = retried || job.Attempt >= 2
			mu.Unlock()
		},
		Waited: func(_ context.Context, job *rivertype.JobRow, _ time.Duration) {
			mu.Lock()
			retried = retried || job.Attempt >= 2
			mu.Unlock()
		},
	}
	run := func(_ context.Context, j *river.Job[throttledArgs]) error {
		c.enter()
		defer c.leave()
		runs.add(j.ID, time.Now())
		if first.CompareAndSwap(false, true) {
			<-release // stuck: deaf to its context, which its timeout cancels
		}
		return nil
	}
	// the stuck worker's client, and the leader whose rescuer finds it stuck
	f.semClient(sem, &river.Config{LeaderElectionDisabled: true, JobTimeout: 200 * time.Millisecond,
		RescueStuckJobsAfter: time.Second}, hooks, run)
	res, err := f.client.Insert(context.Background(), throttledArgs{N: 0}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id := res.Job.ID
	deadline := time.Now().Add(30 * time.Second)
	for !first.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the job did not start")
		}
		time.Sleep(10 * time.Millisecond)
	}
	time.Sleep(1200 * time.Millisecond) // stuck past RescueStuckJobsAfter
	f.semClient(sem, &river.Config{JobTimeout: 200 * time.Millisecond, RescueStuckJobsAfter: time.Second}, hooks, run)
	deadline = time.Now().Add(time.Minute)
	for {
		mu.Lock()
		seen := retried
		mu.Unlock()
		if seen {
			break
		}
		if time.Now().After(deadline) {
			close(release)
			t.Fatal("the rescued job's retry never reached the middleware")
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond) // the retry waits: the stuck attempt holds the lease
	close(release)
	deadline = time.Now().Add(time.Minute)
	for runs.count(id) < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("the retry did not run after the stuck attempt returned (runs %d)", runs.count(id))
		}
		time.Sleep(20 * time.Millisecond)
	}
	f.stop()
	if m := c.most.Load(); m != 1 {
		t.Errorf("%d attempts ran at once, semaphore of 1", m)
	}
}

// A job that has its lease but waits for a run slot (its queue's MaxWorkers all
// running) keeps the lease renewed meanwhile: a wait longer than the lease TTL neither
// frees its slot of the semaphore to another holder while it is still to run, nor
// has the job cancelled for a lost lease once it runs.
func TestConcurrencyLeaseKeptWhileWaitingForARunSlot(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		const ttl = 2 * time.Second
		var lost atomic.Int64
		sem, err := throttle.NewSemaphore(f.b.Client, "runslot", 2, throttle.WithKeyPrefix(f.b.Prefix), throttle.WithLeaseTTL(ttl),
			throttle.WithSemaphoreHooks(throttle.SemaphoreHooks{LeaseLost: func(string) { lost.Add(1) }}))
		if err != nil {
			t.Fatal(err)
		}
		runs := newRunLog()
		release := make(chan struct{})
		var first atomic.Bool
		var cancelled atomic.Int64
		// one run slot: the first job holds it until released, the second waits for it
		// holding the semaphore's other slot
		f.semClient(sem, &river.Config{Queues: map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 1}}}, rivermw.Hooks{},
			func(ctx context.Context, j *river.Job[throttledArgs]) error {
				runs.add(j.ID, time.Now())
				if first.CompareAndSwap(false, true) {
					<-release
					return nil
				}
				if ctx.Err() != nil {
					cancelled.Add(1)
				}
				return ctx.Err()
			})
		if _, err := f.client.InsertMany(context.Background(), []river.InsertManyParams{{Args: throttledArgs{N: 0}}, {Args: throttledArgs{N: 1}}}); err != nil {
			t.Fatal(err)
		}
		defer func() {
			select {
			case <-release:
			default:
				close(release)
			}
		}()
		held := func() int {
			t.Helper()
			st, err := sem.Inspect(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			return st.Held
		}
		deadline := time.Now().Add(30 * time.Second)
		for !first.Load() || held() < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("the second job did not take its lease (first started %v, held %d)", first.Load(), held())
			}
			time.Sleep(10 * time.Millisecond)
		}
		// past the second job's lease TTL, unrenewed it would have expired
		for end := time.Now().Add(ttl * 3 / 2); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
			if n := held(); n < 2 {
				t.Fatalf("%d lease(s) held while the second job waits for a run slot, want 2: its lease expired before it ran", n)
			}
		}
		close(release)
		jobs := f.waitDone(2, time.Minute)
		f.stop()
		checkRanOnce(t, jobs)
		runs.checkOnce(t, jobs)
		if n := lost.Load(); n != 0 || cancelled.Load() != 0 {
			t.Errorf("%d lease(s) lost, %d job(s) cancelled; want none", n, cancelled.Load())
		}
	})
}
