package asynqmw_test

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
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

// backlog is a throttled backlog enqueued ahead of unthrottled work in the same
// queue, with the one setup (asynqmw.New, Setup.Config).
type backlog struct {
	servers, workers int // per server
	rate             int // throttled tasks per second
	throttled        int // a quarter of them MaxRetry(0)
	free             int // unthrottled tasks, freeWork each
	freeWork         time.Duration
}

// backlogResult is what a run measured.
type backlogResult struct {
	freeLatency      time.Duration // first unthrottled enqueued → last one done
	freeEnqueue      time.Duration // the time enqueueing them took
	freeWait         time.Duration // the longest an unthrottled task took from its enqueue to done
	freeMost         int           // most unthrottled handlers running at once
	handBacks        float64       // per throttled task
	finished         time.Duration // first throttled enqueued → last one started
	ideal            time.Duration // the limit's own pace for the backlog
	maxStarts        int           // most throttled handler starts in any window of a second, read by the handler
	maxStartsTol     int           // the same in any window of a second less startJitter
	maxServerStarts  int           // the same, the most of one server
	maxCounted       int           // most starts one server's middleware counted (Hooks.Started) in any second
	maxLag           time.Duration // longest from a counted start to the handler's read of the clock
	maxGrants        int           // most permits taking effect in any window of a second (Redis)
	inverted         float64       // share of pairs of throttled tasks started out of enqueue order
	peakSleeping     int           // most tasks asleep in one server's middleware
	sleepBound       int
	callsPerTask     float64 // limiter script calls per throttled task
	kept             int64   // returns that found their booking
	requeued         int64   // last attempts handed back as copies
	archived, failed int
	lateReturns      int           // booked hand-backs that came back after their slot (and were moved)
	maxLate          time.Duration // the latest of them
	earlyBounces     int           // booked hand-backs that came back in time and were handed back again
	bounced          int64         // of them, those handed back again without a script call (Stats.Bounced)
	comeBackEarly    time.Duration // the most a server made its tasks due before their slots at the end (Stats.ComeBackEarly)
	asynqErrors      int           // errors asynq logged (a Redis outage: a CLUSTERDOWN, a timeout)
	firstAsynqError  string        // " over <first to last> (first: <the first>)", if any
	asynqWarnings    []string      // warnings asynq logged
}

// The goals of a backlog run, on every backend: at most 1.1 hand-backs per throttled
// task, the unthrottled tasks all done within a second of the first one's enqueue,
// the backlog done within 2 s of the limit's own pace (timed: reported as figures);
// no task lost, run twice, failed or archived, and no warning logged (asserted).
const (
	goalHandBacks = 1.1
	goalFree      = time.Second
	goalBacklog   = 2 * time.Second
)

// TestBacklogDoesNotHoldWorkers runs 75 throttled tasks (5 a second: 15 s of the
// limit, a quarter of them MaxRetry(0)) enqueued ahead of 200 unthrottled ones of
// 20ms, on a server of 10 workers, on every backend (in turn, but side by side under
// the race detector), and checks the goals above; on the real server it also runs two
// such servers sharing the limit. It also asserts what must hold
// whatever the load: Redis never lets more than the limit take effect in a window; no
// server's middleware counts more handler starts than the limit in any window of its
// period (Hooks.Started, the pacer's bound); no more tasks sleep in the middleware
// than its bound. The rest (handler starts per window as the handler reads the clock
// and fleet-wide, order, calls per task) it reports as figures, and so the timed goals.
func TestBacklogDoesNotHoldWorkers(t *testing.T) {
	sc := backlog{rate: 5, throttled: 75, free: 200, freeWork: 20 * time.Millisecond}
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		if raceEnabled {
			t.Parallel() // the timed goals' figures are taken without the race detector one fleet at a time
		}
		shapes := []struct{ servers, workers int }{{1, 10}}
		if b.Kind == redistest.Standalone {
			shapes = append(shapes, struct{ servers, workers int }{2, 10})
		}
		for _, shape := range shapes {
			sc := sc
			sc.servers, sc.workers = shape.servers, shape.workers
			t.Run(fmt.Sprintf("%dx%d", sc.servers, sc.workers), func(t *testing.T) {
				if raceEnabled {
					t.Parallel()
				}
				r := runBacklog(t, b, sc)
				redistest.Figure(t, "%s, %d server(s) x %d workers, %d throttled at %d/s + %d unthrottled of %v: "+
					"unthrottled done after %v (enqueueing them took %v; the longest one took from its enqueue to done %v; at most %d ran at once); hand-backs per throttled task %.2f, %d of them last attempts' copies "+
					"(came back after their slot %d, the latest by %v; handed back again in time %d, %d of them without a script call; made due %v before the slot at the end); backlog done after %v (ideal %v, +%v); "+
					"most handler starts in any 1s %d (in any 1s-%v %d; of one server %d, counted by its middleware %d, the handler's read of the clock up to %v later; Redis grants %d, limit %d); pairs out of order %.3f; "+
					"peak asleep in middleware %d (bound %d); limiter script calls per task %.2f; "+
					"lost/twice/failed/archived 0/0/%d/%d; asynq logged %d warnings, %d errors%s",
					b.Kind, sc.servers, sc.workers, sc.throttled, sc.rate, sc.free, sc.freeWork,
					r.freeLatency.Round(time.Millisecond), r.freeEnqueue.Round(time.Millisecond), r.freeWait.Round(time.Millisecond), r.freeMost, r.handBacks, r.requeued, r.lateReturns, r.maxLate.Round(time.Millisecond), r.earlyBounces, r.bounced, r.comeBackEarly.Round(time.Millisecond), r.finished.Round(time.Millisecond), r.ideal,
					(r.finished - r.ideal).Round(time.Millisecond), r.maxStarts, startJitter, r.maxStartsTol,
					r.maxServerStarts, r.maxCounted, r.maxLag.Round(time.Microsecond), r.maxGrants, sc.rate, r.inverted,
					r.peakSleeping, r.sleepBound, r.callsPerTask, r.failed, r.archived, len(r.asynqWarnings), r.asynqErrors, r.firstAsynqError)
				if len(r.asynqWarnings) != 0 {
					t.Errorf("asynq logged %d warnings, want none: %q", len(r.asynqWarnings), r.asynqWarnings)
				}
				// The goals are timed (how late a busy host brings a task back decides the
				// hand-backs): reported against their goals, never judged, as a loaded
				// 2-core host misses them whatever the middleware does.
				redistest.Figure(t, "%s, %d server(s) x %d workers: goals: hand-backs per throttled task %.2f (<= %.1f), unthrottled done after %v (<= %v), backlog %v after the limit's pace (<= %v)%s",
					b.Kind, sc.servers, sc.workers, r.handBacks, goalHandBacks, r.freeLatency.Round(time.Millisecond), goalFree,
					(r.finished - r.ideal).Round(time.Millisecond), goalBacklog, map[bool]string{true: " (under the race detector)"}[raceEnabled])
			})
		}
	})
}

// startJitter is the lateness of a handler start after its permit that the second
// figure of handler starts per window forgives. A task sleeps for the wait the script
// returned, counted from when the reply arrived, so a slow reply (a busy shared host
// delays one by up to about this much) starts a whole batch that much
// late, and the sliding window books each period's permits in one burst: one late
// batch shifts into the next batch's window.
const startJitter = 100 * time.Millisecond

// runBacklog runs sc on b and checks what must hold.
func runBacklog(t *testing.T, b *redistest.Backend, sc backlog) backlogResult {
	// a client of the shape's own, which records its grants (the backend's serves the
	// other shapes, side by side: a hook added to it would race with their calls)
	addrs, cluster := b.Addrs()
	own := *b
	own.Client = redistest.Dial(addrs, cluster)
	t.Cleanup(func() { own.Client.Close() })
	b = &own
	all := redistest.RecordGrants(b.Client)
	f := newFleet(t, b)
	key := "backlog-" + strconv.Itoa(sc.servers)
	stateKey := "{" + b.Prefix + key + "}:l"
	lim := f.limiter(key, throttle.PerSecond(sc.rate))
	c := newCounters()
	var (
		mu     sync.Mutex
		starts = map[int]time.Time{} // throttled task → handler start
		server = map[int]int{}       // throttled task → the server that ran it
		// per server: throttled task → the start its middleware counted (Hooks.Started)
		counted               = make([]map[int]time.Time, sc.servers)
		backs                 = map[int][]handBack{}   // throttled task → its hand-backs
		runs                  = map[string]int{}       // payload → runs
		freeAt                time.Time                // the last unthrottled task done
		freeIn                = map[string]time.Time{} // unthrottled task → just before its enqueue
		freeOut               = map[string]time.Time{} // unthrottled task → done
		freeStart             = map[string]time.Time{} // unthrottled task → its handler's start
		freeRunning, freeMost atomic.Int64
		logged                = &errorLog{t: t}
	)
	handler := asynq.HandlerFunc(func(ctx context.Context, t *asynq.Task) error {
		now := time.Now()
		p := string(t.Payload())
		if t.Type() == "free" {
			k := freeRunning.Add(1)
			for m := freeMost.Load(); k > m && !freeMost.CompareAndSwap(m, k); m = freeMost.Load() {
			}
			mu.Lock()
			freeStart[p] = now
			mu.Unlock()
			time.Sleep(sc.freeWork)
			freeRunning.Add(-1)
		}
		mu.Lock()
		defer mu.Unlock()
		runs[p]++
		if t.Type() == "throttled" {
			i, _ := strconv.Atoi(p[1:])
			starts[i] = now
		} else {
			freeAt = time.Now()
			freeOut[p] = freeAt
		}
		return nil
	})
	pick := func(_ context.Context, t *asynq.Task) (*throttle.Limiter, error) {
		if t.Type() == "throttled" {
			return lim, nil
		}
		return nil, nil
	}
	var setups []*asynqmw.Setup
	for s := range sc.servers {
		counted[s] = map[int]time.Time{}
		hooks := c.hooks()
		throttled := hooks.Throttled
		hooks.Throttled = func(ctx context.Context, t *asynq.Task, err *asynqmw.ThrottledError) {
			throttled(ctx, t, err)
			if t.Type() != "throttled" {
				return
			}
			i, _ := strconv.Atoi(string(t.Payload()[1:]))
			now := time.Now()
			mu.Lock()
			defer mu.Unlock()
			backs[i] = append(backs[i], handBack{at: now, slot: now.Add(err.RetryIn), booked: err.Booked})
		}
		hooks.Started = func(_ context.Context, t *asynq.Task, at time.Time) {
			i, _ := strconv.Atoi(string(t.Payload()[1:]))
			mu.Lock()
			defer mu.Unlock()
			counted[s][i] = at
			server[i] = s
		}
		jt := asynqmw.New(b.Client, asynqmw.WithHooks(hooks))
		setups = append(setups, jt)
		mux := asynq.NewServeMux()
		mux.Use(jt.ThrottleFunc(pick))
		mux.Handle("throttled", handler)
		mux.Handle("free", handler)
		srv := asynq.NewServerFromRedisClient(b.Client, jt.Config(asynq.Config{
			Concurrency:     sc.workers,
			Queues:          map[string]int{f.queue: 1},
			ShutdownTimeout: 2 * time.Second,
			LogLevel:        asynq.WarnLevel,
			Logger:          logged,
		}))
		if err := srv.Start(mux); err != nil {
			t.Fatal(err)
		}
		f.servers = append(f.servers, srv)
	}

	t0 := time.Now()
	for i := range sc.throttled {
		retry := asynq.MaxRetry(3)
		if i%4 == 0 {
			retry = asynq.MaxRetry(0)
		}
		if _, err := f.client.Enqueue(asynq.NewTask("throttled", []byte("t"+strconv.Itoa(i))), asynq.Queue(f.queue), retry); err != nil {
			t.Fatal(err)
		}
	}
	// The unthrottled tasks come from several producers at once, as from a fleet:
	// what the run measures is the servers, not one client's round trips.
	const producers = 8
	t1 := time.Now()
	var wg sync.WaitGroup
	for p := range producers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := p; i < sc.free; i += producers {
				id := "f" + strconv.Itoa(i)
				mu.Lock()
				freeIn[id] = time.Now()
				mu.Unlock()
				if _, err := f.client.Enqueue(asynq.NewTask("free", []byte(id)), asynq.Queue(f.queue)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	t2 := time.Now()
	total := sc.throttled + sc.free
	qi := f.waitIdle(idleLimit+time.Duration(sc.throttled/sc.rate)*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(runs) >= total
	})
	f.stop()

	var r backlogResult
	mu.Lock()
	defer mu.Unlock()
	for p, n := range runs {
		if n != 1 {
			t.Errorf("task %s ran %d times, want 1", p, n)
		}
	}
	if len(runs) != total {
		t.Errorf("%d tasks ran, want %d", len(runs), total)
	}
	r.archived, r.failed = qi.Archived, qi.FailedTotal
	if qi.Archived != 0 || qi.FailedTotal != 0 {
		t.Errorf("archived %d, failed %d; want 0", qi.Archived, qi.FailedTotal)
	}
	r.freeLatency = freeAt.Sub(t1)
	r.freeEnqueue = t2.Sub(t1)
	for p, in := range freeIn {
		r.freeWait = max(r.freeWait, freeOut[p].Sub(in))
	}
	r.freeMost = int(freeMost.Load())
	if os.Getenv("JT_DEBUG") != "" {
		var st []time.Duration
		for _, at := range freeStart {
			st = append(st, at.Sub(t1))
		}
		slices.Sort(st)
		for k := 0; k < len(st); k += 40 {
			t.Logf("free start #%d at %v", k, st[k].Round(time.Millisecond))
		}
		var firsts []time.Duration
		for _, hb := range backs {
			firsts = append(firsts, hb[0].at.Sub(t1))
		}
		slices.Sort(firsts)
		for k := 0; k < len(firsts); k += 20 {
			t.Logf("first hand-back #%d at %v after the first unthrottled enqueue", k, firsts[k].Round(time.Millisecond))
		}
		t.Logf("throttled enqueued in %v", t1.Sub(t0))
	}
	r.asynqErrors, r.firstAsynqError = logged.count()
	r.asynqWarnings = logged.warnings()
	r.handBacks = float64(c.sum(c.throttled)) / float64(sc.throttled)
	var last time.Time
	times := make([]time.Time, 0, len(starts))
	order := make([]int, 0, len(starts))
	for i := range sc.throttled {
		order = append(order, i)
	}
	slices.SortFunc(order, func(a, b int) int { return starts[a].Compare(starts[b]) })
	for _, i := range order {
		times = append(times, starts[i])
		if starts[i].After(last) {
			last = starts[i]
		}
	}
	r.finished = last.Sub(t0)
	r.ideal = time.Duration((sc.throttled+sc.rate-1)/sc.rate-1) * time.Second
	r.maxStarts = redistest.MaxTimesInWindow(times, time.Second)
	r.maxStartsTol = redistest.MaxTimesInWindow(times, time.Second-startJitter)
	for s := range sc.servers {
		var own, cnt []time.Time
		for _, i := range order {
			if at, ok := counted[s][i]; ok {
				own = append(own, starts[i])
				cnt = append(cnt, at)
				r.maxLag = max(r.maxLag, starts[i].Sub(at))
			}
		}
		slices.SortFunc(cnt, time.Time.Compare)
		r.maxServerStarts = max(r.maxServerStarts, redistest.MaxTimesInWindow(own, time.Second))
		r.maxCounted = max(r.maxCounted, redistest.MaxTimesInWindow(cnt, time.Second))
		if os.Getenv("JT_DEBUG") != "" {
			for k := range own {
				if k+sc.rate < len(own) && own[k+sc.rate].Sub(own[k]) < time.Second {
					for _, i := range order {
						if at, ok := counted[s][i]; ok && !starts[i].Before(own[k]) && !starts[i].After(own[k+sc.rate]) {
							t.Logf("server %d: t%d counted at %v, handler read %v (+%v)", s, i, at.Sub(t0), starts[i].Sub(t0), starts[i].Sub(at))
						}
					}
				}
			}
		}
	}
	if len(server) != sc.throttled {
		t.Errorf("Hooks.Started reported %d throttled tasks' starts, want %d", len(server), sc.throttled)
	}
	if r.maxCounted > sc.rate {
		t.Errorf("one server's middleware counted %d handler starts in a second, limit %d", r.maxCounted, sc.rate)
	}
	if os.Getenv("JT_DEBUG") != "" {
		for k, i := range order {
			if k+9 < len(order) && starts[order[k+9]].Sub(starts[i]) < time.Second-startJitter {
				for _, j := range order[k : k+10] {
					t.Logf("dense: start t%d at %v", j, starts[j].Sub(t0))
				}
				break
			}
		}
		if k := all.ByKey()[stateKey]; k != nil {
			for _, g := range k.List() {
				t.Logf("grant at %v (sent %v)", g.At.Sub(t0), g.Sent.Sub(t0))
			}
		}
	}
	for _, hb := range backs {
		for k := 1; k < len(hb); k++ {
			if !hb[k-1].booked {
				continue
			}
			if late := hb[k].at.Sub(hb[k-1].slot); late > 0 {
				r.lateReturns++
				r.maxLate = max(r.maxLate, late)
				if os.Getenv("JT_DEBUG") != "" {
					t.Logf("late return: slot %v after the first enqueue, handed back at %v, back %v after its slot",
						hb[k-1].slot.Sub(t0).Round(time.Millisecond), hb[k-1].at.Sub(t0).Round(time.Millisecond), late.Round(time.Millisecond))
				}
			} else {
				r.earlyBounces++
			}
		}
	}
	grants := all.ByKey()[stateKey]
	if grants == nil {
		t.Fatalf("no grant recorded on %s", stateKey)
	}
	r.maxGrants = grants.MaxInWindow(time.Second)
	if r.maxGrants > sc.rate {
		t.Errorf("most permits taking effect in any second: %d, limit %d", r.maxGrants, sc.rate)
	}
	inv, pairs := 0, 0
	for a := range order {
		for b := a + 1; b < len(order); b++ {
			pairs++
			if order[a] > order[b] {
				inv++
			}
		}
	}
	r.inverted = float64(inv) / float64(max(pairs, 1))
	r.callsPerTask = float64(grants.Calls()) / float64(sc.throttled)
	for _, jt := range setups {
		st := jt.Stats()
		r.requeued += st.Requeued
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

// errorLog is testLogger that also keeps the warnings and counts the errors asynq logs: a stall of the backlog
// with errors logged is an outage of the backend (a cluster node silent past its
// cluster-node-timeout answers CLUSTERDOWN for seconds), not the middleware's doing.
type errorLog struct {
	t           *testing.T
	mu          sync.Mutex
	n           int
	first       string
	from, until time.Time // the first and the last
	warns       []string
}

func (l *errorLog) Debug(args ...any) { testLogger{l.t}.Debug(args...) }
func (l *errorLog) Info(args ...any)  { testLogger{l.t}.Info(args...) }
func (l *errorLog) Warn(args ...any) {
	l.mu.Lock()
	l.warns = append(l.warns, fmt.Sprint(args...))
	l.mu.Unlock()
	testLogger{l.t}.Warn(args...)
}

// warnings returns the warnings logged.
func (l *errorLog) warnings() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.warns)
}
func (l *errorLog) Fatal(args ...any) { testLogger{l.t}.Fatal(args...) }
func (l *errorLog) Error(args ...any) {
	l.mu.Lock()
	if l.n++; l.n == 1 {
		l.first = fmt.Sprint(args...)
		l.from = time.Now()
	}
	l.until = time.Now()
	l.mu.Unlock()
	testLogger{l.t}.Error(args...)
}

// count returns how many errors were logged and " over <first to last> (first:
// <the first>)", or "".
func (l *errorLog) count() (int, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.n == 0 {
		return 0, ""
	}
	return l.n, fmt.Sprintf(" over %v (first: %s)", l.until.Sub(l.from).Round(time.Millisecond), l.first)
}

// handBack is one hand-back of a throttled task: when, and when its slot was (booked).
type handBack struct {
	at, slot time.Time
	booked   bool
}

// Tenants through asynq: a noisy tenant's 300 tasks at 20/s over two servers, enqueued
// first, and quiet tenants' tasks arriving meanwhile (two tenants, one task every 500ms
// each for 6s). With a tenant's handle per task (ThrottleFunc), a quiet task waits about
// a turn instead of behind the backlog (first come first served: about 15s). It reports
// the quiet tasks' enqueue-to-start times (a timed figure, which a loaded host stretches:
// measured, not asserted) and asserts every task ran.
func TestTenantsQuietBehindNoisy(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tenants", throttle.PerSecond(20))
		const noisy = 300
		var (
			mu     sync.Mutex
			starts = map[string]time.Time{}
			queued = map[string]time.Time{}
			twice  []string
		)
		handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			mu.Lock()
			defer mu.Unlock()
			if _, ran := starts[string(task.Payload())]; ran {
				twice = append(twice, string(task.Payload()))
			}
			starts[string(task.Payload())] = time.Now()
			return nil
		})
		pick := func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
			tenant, _, _ := strings.Cut(string(task.Payload()), "-")
			return lim.Tenant(tenant), nil
		}
		for range 2 {
			jt := asynqmw.New(b.Client)
			f.run(jt, 10, handler, jt.ThrottleFunc(pick))
		}
		for i := range noisy {
			f.enqueue(fmt.Sprintf("noisy-%d", i), asynq.MaxRetry(3))
		}
		var quiet []string
		for i := range 12 {
			time.Sleep(500 * time.Millisecond)
			for _, tenant := range []string{"quietA", "quietB"} {
				id := fmt.Sprintf("%s-%d", tenant, i)
				mu.Lock()
				queued[id] = time.Now()
				mu.Unlock()
				f.enqueue(id, asynq.MaxRetry(3))
				quiet = append(quiet, id)
			}
		}
		f.waitIdle(2*time.Minute, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(starts) == noisy+len(quiet)
		})
		mu.Lock()
		defer mu.Unlock()
		if len(twice) > 0 {
			t.Errorf("tasks run twice: %v", twice)
		}
		var waits []time.Duration
		var lastQuiet, lastNoisy time.Time
		for _, id := range quiet {
			waits = append(waits, starts[id].Sub(queued[id]))
			if starts[id].After(lastQuiet) {
				lastQuiet = starts[id]
			}
		}
		left := 0
		for i := range noisy {
			s := starts[fmt.Sprintf("noisy-%d", i)]
			if s.After(lastNoisy) {
				lastNoisy = s
			}
			if s.After(lastQuiet) {
				left++
			}
		}
		slices.Sort(waits)
		q := func(p float64) time.Duration { return waits[int(p*float64(len(waits)-1))].Round(time.Millisecond) }
		redistest.Figure(t, "%s: quiet tenants' %d tasks behind a noisy tenant's %d at 20/s over 2 servers: enqueue to start p50 %v, p90 %v, max %v; the noisy backlog done %v after the last quiet start (%d of its tasks left then)",
			b.Kind, len(quiet), noisy, q(0.5), q(0.9), q(1), lastNoisy.Sub(lastQuiet).Round(time.Millisecond), left)
	})
}

// A fleet pause through asynq: two tenants' tasks at 20/s over two servers, paused for 4s
// by an operator (another process's limiter) a second in. A task handed back during the
// pause comes back after it, a tenant's whose turn has not come too (its RetryIn reaches
// past the pause's end), so the fleet does not hand its tasks round and round while
// paused: no task is handed back more than three times in the pause's first 2.5s. Three: a
// reply decided just before the pause may reach the hook after it, and the task, back
// before that slot with the sleepers' bound full, is handed back once more on the slot
// remembered, without asking Redis (bounce: a pause is found at the return after); then
// Redis tells it the pause's end. In its last second a task
// handed back may come back at once, asynq keeping retry times in whole seconds
// (retryDue), as before any slot under a second ahead.
func TestTenantsPausedComeBackAfterThePause(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tenantspause", throttle.PerSecond(20))
		const tasks, pause = 120, 4 * time.Second
		var (
			mu         sync.Mutex
			from, end  time.Time // the pause set, and its end at the earliest
			backs      = map[string]int{}
			early, all int
			started    = map[string]bool{}
			throttled  = func(ctx context.Context, task *asynq.Task, err *asynqmw.ThrottledError) {
				mu.Lock()
				defer mu.Unlock()
				if now := time.Now(); !from.IsZero() && now.After(from) && now.Before(end.Add(-1500*time.Millisecond)) {
					backs[string(task.Payload())]++
					all++
					if now.Add(err.RetryIn).Before(end) {
						early++
					}
				}
			}
		)
		handler := asynq.HandlerFunc(func(ctx context.Context, task *asynq.Task) error {
			mu.Lock()
			defer mu.Unlock()
			started[string(task.Payload())] = true
			return nil
		})
		pick := func(_ context.Context, task *asynq.Task) (*throttle.Limiter, error) {
			tenant, _, _ := strings.Cut(string(task.Payload()), "-")
			return lim.Tenant(tenant), nil
		}
		for range 2 {
			jt := asynqmw.New(b.Client, asynqmw.WithHooks(asynqmw.Hooks{Throttled: throttled}))
			f.run(jt, 10, handler, jt.ThrottleFunc(pick))
		}
		for i := range tasks {
			f.enqueue(fmt.Sprintf("noisy-%d", i), asynq.MaxRetry(3))
			f.enqueue(fmt.Sprintf("other-%d", i), asynq.MaxRetry(3))
		}
		time.Sleep(time.Second)
		earliest := time.Now().Add(pause)
		if err := f.limiter("tenantspause", throttle.PerSecond(20)).Pause(context.Background(), pause); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		from, end = time.Now(), earliest
		mu.Unlock()
		f.waitIdle(idleLimit, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return len(started) == 2*tasks
		})
		mu.Lock()
		defer mu.Unlock()
		most, which := 0, ""
		for task, n := range backs {
			if n > most {
				most, which = n, task
			}
		}
		redistest.Figure(t, "%s: %d tasks of two tenants at 20/s over 2 servers, paused 4s: %d hand-backs in its first 2.5s (%d tasks; %d told to come back before its end), at most %d of a task",
			b.Kind, 2*tasks, all, len(backs), early, most)
		if most > 3 {
			t.Errorf("task %s handed back %d times in the pause's first 2.5s, want at most 3: told to come back before the pause's end", which, most)
		}
	})
}
