package rivermw_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/jobthrottle/jobthrottle/x/river/rivermw"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// hookLog records the middleware's decisions, by job.
type hookLog struct {
	mu      sync.Mutex
	snoozes map[int64][]*rivermw.ThrottledError
	slots   map[int64]time.Time // the slot of the job's last booked snooze
	waited  map[int64]int
}

func newHookLog() *hookLog {
	return &hookLog{snoozes: map[int64][]*rivermw.ThrottledError{}, slots: map[int64]time.Time{}, waited: map[int64]int{}}
}

func (h *hookLog) hooks() rivermw.Hooks {
	return rivermw.Hooks{
		Throttled: func(_ context.Context, job *rivertype.JobRow, err *rivermw.ThrottledError) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.snoozes[job.ID] = append(h.snoozes[job.ID], err)
			if err.Booked {
				h.slots[job.ID] = time.Now().Add(err.RetryIn)
			}
		},
		Waited: func(_ context.Context, job *rivertype.JobRow, _ time.Duration) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.waited[job.ID]++
		},
	}
}

// throttledClient starts a client of one queue of workers workers whose throttled
// jobs are limited by lim, and returns its Setup; run is called in each worker.
func (f *fleet) throttledClient(lim *throttle.Limiter, workers int, h *hookLog, run func(ctx context.Context, id int64) error, opts ...rivermw.Option) *rivermw.Setup {
	f.t.Helper()
	w := river.NewWorkers()
	river.AddWorker(w, river.WorkFunc(func(ctx context.Context, j *river.Job[throttledArgs]) error {
		return run(ctx, j.ID)
	}))
	jt := rivermw.New(append(opts, rivermw.WithHooks(h.hooks()))...)
	f.start(jt.Config(&river.Config{
		Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: workers}},
		Workers:    w,
		Middleware: []rivertype.Middleware{jt.Throttle(lim)},
	}))
	return jt
}

// A throttled job books its slot, is snoozed until just before it, comes back, finds
// its booking and runs on it: each job runs once, on its first attempt, never before
// its slot; River counts the snoozes the middleware made; and the limiter grants one
// permit per job plus one for each return that did not find its booking (a return
// after its slot books anew): a job that found its booking took no second permit.
func TestSnoozedJobRunsOnItsBooking(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		const n, rate = 8, 2
		lim := f.limiter("booked", throttle.PerSecond(rate))
		h := newHookLog()
		runs := newRunLog()
		jt := f.throttledClient(lim, 4, h, func(_ context.Context, id int64) error {
			runs.add(id, time.Now())
			return nil
		})
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
		st := jt.Stats()
		h.mu.Lock()
		defer h.mu.Unlock()
		booked := 0
		for id, j := range jobs {
			if got, want := snoozes(j), len(h.snoozes[id]); got != want {
				t.Errorf("job %d: River counted %d snoozes, the middleware made %d", id, got, want)
			}
			if slot, ok := h.slots[id]; ok {
				booked++
				// the slot was read after the reply that booked it: a start may precede it
				// by that reading's lag, never by more than a few ms
				if start := runs.starts[id]; start.Before(slot.Add(-20 * time.Millisecond)) {
					t.Errorf("job %d started %v before its slot", id, slot.Sub(start))
				}
			}
		}
		if booked == 0 {
			t.Errorf("no job was snoozed (%d jobs at %d a second)", n, rate)
		}
		if got, want := grants.Total(), n+int(st.Snoozed-st.Bounced-st.Kept); got != want {
			t.Errorf("permits granted %d, want %d: %d jobs, %d snoozes, %d bounced, %d returns found their booking",
				got, want, n, st.Snoozed, st.Bounced, st.Kept)
		}
		if got := grants.MaxInWindow(time.Second); got > rate {
			t.Errorf("most permits in any second %d, limit %d", got, rate)
		}
		redistest.Figure(t, "%s: %d jobs at %d/s: %d snoozes, %d returns found their booking, %d bounced; %d slept in the middleware",
			b.Kind, n, rate, st.Snoozed, st.Kept, st.Bounced, len(h.waited))
	})
}

// eachBackend runs f on miniredis (real time) and the real redis-server: the tests
// that read Redis keys themselves, which a cluster spreads over its nodes.
func eachBackend(t *testing.T, f func(t *testing.T, b *redistest.Backend)) {
	t.Run(string(redistest.Mini), func(t *testing.T) { f(t, redistest.NewMiniRealTime(t)) })
	t.Run(string(redistest.Standalone), func(t *testing.T) { f(t, redistest.NewStandalone(t)) })
}

// A job cancelled (River's JobCancel) while it sleeps in the middleware for its permit
// gives the booking back, and does not run: River cancels it.
func TestCancelledWhileAsleepGivesBookingBack(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		// a permit every 10s, and a job may sleep 20s for one: the second sleeps
		lim := f.limiter("asleep", throttle.Every(10*time.Second))
		runs := newRunLog()
		jt := f.throttledClient(lim, 2, newHookLog(), func(_ context.Context, id int64) error {
			runs.add(id, time.Now())
			return nil
		}, rivermw.InlineWait(20*time.Second))
		ctx := context.Background()
		var ids []int64
		for i := range 2 {
			res, err := f.client.Insert(ctx, throttledArgs{N: i}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, res.Job.ID)
		}
		deadline := time.Now().Add(30 * time.Second)
		for jt.Stats().Sleeping == 0 || runs.count(ids[0])+runs.count(ids[1]) == 0 {
			if time.Now().After(deadline) {
				t.Fatal("no job ran, or none fell asleep in the middleware")
			}
			time.Sleep(5 * time.Millisecond)
		}
		ran, asleep := ids[0], ids[1]
		if runs.count(ran) == 0 {
			ran, asleep = asleep, ran
		}
		if _, err := f.client.JobCancel(ctx, asleep); err != nil {
			t.Fatal(err)
		}
		jobs := f.waitDone(2, 30*time.Second)
		f.stop()
		if j := jobs[ran]; j.State != rivertype.JobStateCompleted {
			t.Errorf("first job: %s, want completed", j.State)
		}
		if j := jobs[asleep]; j.State != rivertype.JobStateCancelled || runs.runs[asleep] != 0 {
			t.Errorf("cancelled job: %s, ran %d times; want cancelled, never run", j.State, runs.runs[asleep])
		}
		var gave []redistest.GiveBack
		deadline = time.Now().Add(10 * time.Second) // the give-back runs in the background
		for gave = grants.GiveBacks(); len(gave) == 0 && time.Now().Before(deadline); gave = grants.GiveBacks() {
			time.Sleep(5 * time.Millisecond)
		}
		if len(gave) != 1 || !gave[0].OK {
			t.Errorf("give-backs %+v, want one that gave the booking back", gave)
		}
		if got := grants.Total(); got != 1 {
			t.Errorf("permits granted and kept %d, want 1 (the first job's)", got)
		}
	})
}

// A snoozed job deleted (River's JobDelete) or cancelled (JobCancel) never comes back
// for its booking: the booking lapses with its slot, and its record expires a second
// after it; nothing of it is left in Redis. (A job cancelled once back, asleep for its
// slot, gives its booking back: see TestCancelledWhileAsleepGivesBookingBack.)
func TestDeletedOrCancelledWhileSnoozedLapses(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("lapse", throttle.Every(4*time.Second))
		h := newHookLog()
		runs := newRunLog()
		f.throttledClient(lim, 2, h, func(_ context.Context, id int64) error {
			runs.add(id, time.Now())
			return nil
		})
		ctx := context.Background()
		var ids []int64
		for i := range 3 {
			res, err := f.client.Insert(ctx, throttledArgs{N: i}, nil)
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, res.Job.ID)
		}
		// one runs at once; the others book 4s and 8s ahead and are snoozed
		deadline := time.Now().Add(30 * time.Second)
		var snoozed []int64
		for len(snoozed) < 2 {
			if time.Now().After(deadline) {
				t.Fatalf("jobs %v snoozed, want 2", snoozed)
			}
			time.Sleep(10 * time.Millisecond)
			h.mu.Lock()
			snoozed = snoozed[:0]
			for id := range h.slots {
				snoozed = append(snoozed, id)
			}
			h.mu.Unlock()
		}
		ran := ids[0] + ids[1] + ids[2] - snoozed[0] - snoozed[1]
		h.mu.Lock()
		if h.slots[snoozed[0]].Before(h.slots[snoozed[1]]) {
			// the later one is deleted: it cannot be back yet (River refuses to delete a
			// running job); the earlier one is cancelled, which works even when it is back
			snoozed[0], snoozed[1] = snoozed[1], snoozed[0]
		}
		h.mu.Unlock()
		for _, id := range snoozed { // River has recorded the snooze
			for {
				j, err := f.client.JobGet(ctx, id)
				if err != nil {
					t.Fatal(err)
				}
				if snoozes(j) == 1 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("job %d: River recorded no snooze", id)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}
		if _, err := f.client.JobDelete(ctx, snoozed[0]); err != nil {
			t.Fatal(err)
		}
		if _, err := f.client.JobCancel(ctx, snoozed[1]); err != nil {
			t.Fatal(err)
		}
		if n := len(bookingKeys(t, b)); n != 2 {
			t.Fatalf("%d booking records, want the 2 snoozed jobs'", n)
		}
		h.mu.Lock()
		last := later(h.slots[snoozed[0]], h.slots[snoozed[1]])
		h.mu.Unlock()
		deadline = last.Add(time.Second + 30*time.Second) // the record's TTL, and a busy host's slack
		for len(bookingKeys(t, b)) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("booking records %q still there %v after the last slot", bookingKeys(t, b), time.Since(last))
			}
			time.Sleep(50 * time.Millisecond)
		}
		f.stop()
		if len(runs.runs) != 1 || runs.runs[ran] != 1 {
			t.Errorf("runs %v, want job %d's only", runs.runs, ran)
		}
		if j, err := f.client.JobGet(ctx, snoozed[1]); err != nil || j.State != rivertype.JobStateCancelled {
			t.Errorf("cancelled job: %v, %v; want cancelled", j.State, err)
		}
	})
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// bookingKeys returns the booking records under the backend's test prefix.
func bookingKeys(t *testing.T, b *redistest.Backend) []string {
	t.Helper()
	keys, err := b.Client.Keys(context.Background(), "{"+b.Prefix+"*").Result()
	if err != nil {
		t.Fatal(err)
	}
	var bk []string
	for _, k := range keys {
		if strings.Contains(k, ":bk:") {
			bk = append(bk, k)
		}
	}
	return bk
}

// Tenants and costs through ThrottleFunc: each job gets its tenant's handle of the limit,
// with its estimated cost (a Cost handle). Two clients; a noisy tenant's backlog of 30
// jobs at 5 a second is queued first, then 3 jobs of a quiet tenant, which start while
// most of the backlog still waits (first come first served would run them after it);
// every job runs once, and its worker settles its actual cost through its context (or
// learns it is too late to).
func TestTenantsAndCostsThroughThrottleFunc(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim, err := throttle.New(b.Client, "tenants", throttle.PerSecond(5), throttle.WithKeyPrefix(b.Prefix),
			throttle.WithLimits(throttle.Limit{Rate: 1000, Period: time.Second, Unit: "tokens"}))
		if err != nil {
			t.Fatal(err)
		}
		tenantOf := func(n int) string {
			if n >= 100 {
				return "quiet"
			}
			return "noisy"
		}
		pick := func(_ context.Context, job *rivertype.JobRow) (*throttle.Limiter, error) {
			var args throttledArgs
			if err := json.Unmarshal(job.EncodedArgs, &args); err != nil {
				return nil, err
			}
			return lim.Tenant(tenantOf(args.N)).Cost(map[string]int{"tokens": 150}), nil
		}
		runs := newRunLog()
		var settled atomic.Int64
		var mu sync.Mutex
		starts := map[string][]time.Time{}
		for range 2 {
			w := river.NewWorkers()
			river.AddWorker(w, river.WorkFunc(func(ctx context.Context, j *river.Job[throttledArgs]) error {
				now := time.Now()
				runs.add(j.ID, now)
				mu.Lock()
				starts[tenantOf(j.Args.N)] = append(starts[tenantOf(j.Args.N)], now)
				mu.Unlock()
				// a job that starts a whole period after its permit (the pacer held it)
				// settles too late: its booking no longer counts
				if err := waiter.Settle(ctx, map[string]int{"tokens": 40}); err != nil && !errors.Is(err, waiter.ErrSettleTooLate) {
					return err
				}
				settled.Add(1)
				return nil
			}))
			jt := rivermw.New()
			f.start(jt.Config(&river.Config{
				Queues:     map[string]river.QueueConfig{river.QueueDefault: {MaxWorkers: 4}},
				Workers:    w,
				Middleware: []rivertype.Middleware{jt.ThrottleFunc(pick)},
			}))
		}
		var params []river.InsertManyParams
		for i := range 30 {
			params = append(params, river.InsertManyParams{Args: throttledArgs{N: i}})
		}
		if _, err := f.client.InsertMany(context.Background(), params); err != nil {
			t.Fatal(err)
		}
		for f.noisyStarted(&mu, starts) < 2 { // the backlog is under way
			time.Sleep(10 * time.Millisecond)
		}
		quietAt := time.Now()
		params = params[:0]
		for i := range 3 {
			params = append(params, river.InsertManyParams{Args: throttledArgs{N: 100 + i}})
		}
		if _, err := f.client.InsertMany(context.Background(), params); err != nil {
			t.Fatal(err)
		}
		jobs := f.waitDone(33, 2*time.Minute)
		f.stop()
		checkRanOnce(t, jobs)
		runs.checkOnce(t, jobs)
		if settled.Load() != 33 {
			t.Errorf("%d jobs settled their cost, want 33", settled.Load())
		}
		mu.Lock()
		defer mu.Unlock()
		noisy, quiet := starts["noisy"], starts["quiet"]
		slices.SortFunc(noisy, func(a, b time.Time) int { return a.Compare(b) })
		var lastQuiet time.Time
		for _, q := range quiet {
			if q.After(lastQuiet) {
				lastQuiet = q
			}
		}
		behind := 0
		for _, s := range noisy {
			if s.After(lastQuiet) {
				behind++
			}
		}
		redistest.Figure(t, "%s: a quiet tenant's 3 jobs behind a noisy tenant's 30 at 5/s over 2 clients: the last started %v after it was inserted, %d noisy jobs still waiting then",
			b.Kind, lastQuiet.Sub(quietAt).Round(time.Millisecond), behind)
		if behind < 10 {
			t.Errorf("the quiet tenant's last job started with %d of the noisy tenant's backlog left, want it before the last 10 (not behind the backlog)", behind)
		}
	})
}

// noisyStarted returns how many of the noisy tenant's jobs have started.
func (f *fleet) noisyStarted(mu *sync.Mutex, starts map[string][]time.Time) int {
	mu.Lock()
	defer mu.Unlock()
	return len(starts["noisy"])
}
