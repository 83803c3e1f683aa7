package rivermw_test

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/x/river/rivermw"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// backlog is a throttled backlog inserted ahead of unthrottled work in the same queue,
// worked by clients set up the one way (rivermw.New, Setup.Config).
type backlog struct {
	clients, workers int // workers: each client's MaxWorkers
	rate             int // throttled jobs per second
	throttled        int
	free             int // unthrottled jobs, freeWork each
	freeWork         time.Duration
}

// backlogResult is what a run measured.
type backlogResult struct {
	freeLatency   time.Duration // first unthrottled inserted → last one done
	freeMost      int           // most unthrottled workers running at once, of one client
	snoozes       float64       // per throttled job, as River counted them (metadata)
	finished      time.Duration // first throttled inserted → last one started
	ideal         time.Duration // the limit's own pace for the backlog
	maxStarts     int           // most throttled worker starts in any window of a second, read by the worker, fleet-wide
	maxStartsTol  int           // the same in any window of a second less startJitter
	maxCounted    int           // most starts one client's middleware counted (Hooks.Started) in any second
	maxGrants     int           // most permits taking effect in any window of a second (Redis)
	peakSleeping  int           // most jobs asleep in one client's middleware
	sleepBound    int
	kept, bounced int64
	lateStarts    int           // snoozed jobs whose worker started over 50ms (a quarter of the permits' spacing) after their last booked slot
	maxLate       time.Duration // the latest of them
	comeBackEarly time.Duration // the most a client made its jobs due before their slots at the end
	callsPerJob   float64       // limiter script calls per throttled job
	riverLogged   []string
}

// The goals of a backlog run, reported as figures: the unthrottled jobs all done
// within 1.5 s of the first one's insert, the backlog done within 2 s of the limit's
// own pace, at most 1.1 snoozes per throttled job.
const (
	goalSnoozes = 1.1
	goalFree    = 1500 * time.Millisecond
	goalBacklog = 2 * time.Second
)

// TestBacklogDoesNotHoldWorkers runs 150 throttled jobs (5 a second) inserted ahead of
// 200 unthrottled ones of 20ms, on two clients of 10 workers sharing the limit, with
// the limiter on every Redis backend in turn, and reports the goals above as figures.
// It asserts what must hold whatever the load: every job completed once, on its first
// attempt, with no error (none lost, failed, discarded or run twice, no attempt spent);
// Redis never lets more than the limit take effect in a window; no client's middleware
// counts more worker starts than the limit in any window of its period (Hooks.Started,
// the pacer's bound); no client runs more unthrottled workers at once than its
// MaxWorkers; no more jobs sleep in the middleware than its bound; River logs no
// warning.
func TestBacklogDoesNotHoldWorkers(t *testing.T) {
	sc := backlog{clients: 2, workers: 10, rate: 5, throttled: 150, free: 200, freeWork: 20 * time.Millisecond}
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		r := runBacklog(t, b, sc)
		redistest.Figure(t, "%s, %d clients x %d workers, %d throttled at %d/s + %d unthrottled of %v: "+
			"unthrottled done after %v (goal <= %v; at most %d ran at once on a client); snoozes per throttled job %.2f (goal <= %.1f; snoozed jobs started over 50ms after their slot %d, the latest by %v; kept %d, bounced %d; made due %v before the slot at the end); "+
			"backlog done after %v (ideal %v, +%v, goal <= +%v); most worker starts in any 1s %d (in any 1s-%v %d; counted by one client's middleware %d; Redis grants %d; limit %d); "+
			"peak asleep in middleware %d (bound %d); limiter script calls per job %.2f; lost/twice/failed/discarded/attempts spent 0/0/0/0/0",
			b.Kind, sc.clients, sc.workers, sc.throttled, sc.rate, sc.free, sc.freeWork,
			r.freeLatency.Round(time.Millisecond), goalFree, r.freeMost, r.snoozes, goalSnoozes, r.lateStarts, r.maxLate.Round(time.Millisecond),
			r.kept, r.bounced, r.comeBackEarly.Round(time.Millisecond),
			r.finished.Round(time.Millisecond), r.ideal, (r.finished - r.ideal).Round(time.Millisecond), goalBacklog,
			r.maxStarts, startJitter, r.maxStartsTol, r.maxCounted, r.maxGrants, sc.rate,
			r.peakSleeping, r.sleepBound, r.callsPerJob)
		if len(r.riverLogged) != 0 {
			t.Errorf("River logged %d warnings or errors, want none: %q", len(r.riverLogged), r.riverLogged)
		}
	})
}

// startJitter is the lateness of a worker start after its permit that the second
// figure of starts per window forgives: a job sleeps for the wait the script returned,
// counted from when the reply arrived, so a slow reply starts a whole batch that much
// late, and the sliding window books each period's permits in one burst.
const startJitter = 100 * time.Millisecond

// runBacklog runs sc on b and checks what must hold.
func runBacklog(t *testing.T, b *redistest.Backend, sc backlog) backlogResult {
	grants := redistest.RecordGrants(b.Client)
	f := newFleet(t, b)
	key := "backlog"
	lim := f.limiter(key, throttle.PerSecond(sc.rate))
	runs := newRunLog()
	var (
		mu       sync.Mutex
		freeAt   time.Time
		counted  = make([]map[int64]time.Time, sc.clients) // per client: job → the start its middleware counted
		running  = make([]atomic.Int64, sc.clients)
		freeMost atomic.Int64
		setups   []*rivermw.Setup
		late     []time.Duration
		slots    = map[int64]time.Time{} // job → the slot its last snooze booked
	)
	for cl := range sc.clients {
		counted[cl] = map[int64]time.Time{}
		workers := river.NewWorkers()
		river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, j *river.Job[throttledArgs]) error {
			runs.add(j.ID, time.Now())
			return nil
		}))
		river.AddWorker(workers, river.WorkFunc(func(ctx context.Context, j *river.Job[freeArgs]) error {
			runs.add(j.ID, time.Now())
			k := running[cl].Add(1)
			for m := freeMost.Load(); k > m && !freeMost.CompareAndSwap(m, k); m = freeMost.Load() {
			}
			time.Sleep(sc.freeWork)
			running[cl].Add(-1)
			mu.Lock()
			freeAt = time.Now()
			mu.Unlock()
			return nil
		}))
		jt := rivermw.New(rivermw.WithHooks(rivermw.Hooks{
			Throttled: func(_ context.Context, job *rivertype.JobRow, err *rivermw.ThrottledError) {
				if err.Booked {
					mu.Lock()
					slots[job.ID] = time.Now().Add(err.RetryIn)
					mu.Unlock()
				}
			},
			Started: func(_ context.Context, job *rivertype.JobRow, at time.Time) {
				mu.Lock()
				defer mu.Unlock()
				counted[cl][job.ID] = at
				if slot, ok := slots[job.ID]; ok && at.After(slot.Add(time.Second/time.Duration(4*sc.rate))) {
					late = append(late, at.Sub(slot))
				}
			},
		}))
		setups = append(setups, jt)
		f.start(jt.Config(&river.Config{
			Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: sc.workers}},
			Workers:    workers,
			Middleware: []rivertype.Middleware{jt.Throttle(lim, throttledArgs{}.Kind())},
		}))
	}

	ctx := context.Background()
	params := make([]river.InsertManyParams, sc.throttled)
	for i := range params {
		params[i] = river.InsertManyParams{Args: throttledArgs{N: i}}
	}
	t0 := time.Now()
	if _, err := f.client.InsertMany(ctx, params); err != nil {
		t.Fatal(err)
	}
	// The unthrottled jobs come from several producers at once, as from a fleet: what
	// the run measures is the clients, not one producer's round trips.
	const producers = 8
	t1 := time.Now()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < sc.free; i += producers {
				if _, err := f.client.Insert(ctx, freeArgs{N: i}, nil); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	total := sc.throttled + sc.free
	jobs := f.waitDone(total, 2*time.Minute+time.Duration(sc.throttled/sc.rate)*time.Second)
	f.stop()

	checkRanOnce(t, jobs)
	runs.checkOnce(t, jobs)
	var r backlogResult
	r.riverLogged = f.log.logged()
	mu.Lock()
	defer mu.Unlock()
	r.freeLatency = freeAt.Sub(t1)
	r.freeMost = int(freeMost.Load())
	if r.freeMost > sc.workers {
		t.Errorf("a client ran %d unthrottled workers at once, above its MaxWorkers %d", r.freeMost, sc.workers)
	}
	var times []time.Time
	sum := 0
	for id, j := range jobs {
		if j.Kind != (throttledArgs{}).Kind() {
			if n := snoozes(j); n != 0 {
				t.Errorf("unthrottled job %d snoozed %d times", id, n)
			}
			continue
		}
		sum += snoozes(j)
		times = append(times, runs.starts[id])
	}
	slices.SortFunc(times, time.Time.Compare)
	r.snoozes = float64(sum) / float64(sc.throttled)
	r.finished = times[len(times)-1].Sub(t0)
	r.ideal = time.Duration((sc.throttled+sc.rate-1)/sc.rate-1) * time.Second
	r.maxStarts = redistest.MaxTimesInWindow(times, time.Second)
	r.maxStartsTol = redistest.MaxTimesInWindow(times, time.Second-startJitter)
	n := 0
	for cl := range sc.clients {
		var cnt []time.Time
		for _, at := range counted[cl] {
			cnt = append(cnt, at)
		}
		n += len(cnt)
		slices.SortFunc(cnt, time.Time.Compare)
		r.maxCounted = max(r.maxCounted, redistest.MaxTimesInWindow(cnt, time.Second))
	}
	if n != sc.throttled {
		t.Errorf("Hooks.Started reported %d throttled jobs' starts, want %d", n, sc.throttled)
	}
	if r.maxCounted > sc.rate {
		t.Errorf("one client's middleware counted %d worker starts in a second, limit %d", r.maxCounted, sc.rate)
	}
	r.maxGrants = grants.MaxInWindow(time.Second)
	if r.maxGrants > sc.rate {
		t.Errorf("most permits taking effect in any second: %d, limit %d", r.maxGrants, sc.rate)
	}
	r.lateStarts = len(late)
	for _, d := range late {
		r.maxLate = max(r.maxLate, d)
	}
	stateKey := keys.Name("{"+b.Prefix+key+"}", keys.State)
	if k := grants.ByKey()[stateKey]; k != nil {
		r.callsPerJob = float64(k.Calls()) / float64(sc.throttled)
	}
	for _, jt := range setups {
		st := jt.Stats()
		if st.PeakSleeping > st.SleepBound {
			t.Errorf("peak asleep in the middleware %d, above its bound %d", st.PeakSleeping, st.SleepBound)
		}
		r.peakSleeping = max(r.peakSleeping, st.PeakSleeping)
		r.sleepBound = st.SleepBound
		r.kept += st.Kept
		r.bounced += st.Bounced
		r.comeBackEarly = max(r.comeBackEarly, st.ComeBackEarly)
	}
	return r
}
