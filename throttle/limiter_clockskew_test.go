package throttle

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// needFaketime skips a test when faketime is missing, or fails it when real
// dependencies are required (JOBTHROTTLE_REQUIRE_REAL, as in CI).
func needFaketime(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("faketime"); err != nil {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatalf("faketime required (JOBTHROTTLE_REQUIRE_REAL is set): %v", err)
		}
		t.Skipf("faketime is not installed (Debian package faketime), clock-skew test skipped: %v", err)
	}
}

// Processes whose clocks are 300s ahead and 300s behind share one key with processes
// on the right time: nothing changes. The scripts read Redis's TIME, and the Go side
// works in durations: no period holds more than the bound, no WaitN returns before its
// grant takes effect (a waiter that computed its sleep from its own clock would wake
// 300s early or late), and every group gets permits.
//
// Each skewed process runs under libfaketime (FAKETIME=±300s), which shifts the clock
// of what calls libc (the test logs what `date` reads in it), and with the Go side's
// clock (clock.Set, tests only) shifted as much. Go's own time.Now reads the kernel's
// vDSO, which faketime cannot reach (the test logs that too), so clock.Set is what
// moves the library's view of the time.
//
// Every algorithm runs on a key of its own. Tolerances: none on the bounds; 1ms on the
// early return (see TestFleetNeverOverAdmits); 1s on the shift date shows in a skewed
// child, bracketed by the child's own readings of time.Now around it. Utilization and each group's share are
// reported (a third each is fair, as waiters are served in arrival order, but the
// groups start a little apart). Runs 1.2s by default, 30s with JOBTHROTTLE_LONG=1.
func TestClockSkewedProcessesChangeNothing(t *testing.T) {
	parallel(t)
	needFaketime(t)
	const period = 250 * ms
	groups := []fleetGroup{
		{Children: 2},
		{Children: 2, Faketime: "+300s", Shift: 300 * time.Second},
		{Children: 2, Faketime: "-300s", Shift: -300 * time.Second},
	}
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		scale := 1
		if b.Kind == redistest.Mini {
			scale = 5 // as in TestFleetNeverOverAdmits
		}
		jobs := []fleetJob{
			{Alg: SlidingWindow, Keys: []string{"skew-sw"}, Limit: Limit{Rate: 100 / scale, Period: period}},
			{Alg: TokenBucket, Keys: []string{"skew-tb"}, Limit: Limit{Rate: 100 / scale, Period: period, Burst: 3}},
			{Alg: FixedWindow, Keys: []string{"skew-fw"}, Limit: Limit{Rate: 100 / scale, Period: period}},
			{Alg: SlidingCounter, Keys: []string{"skew-sc"}, Limit: Limit{Rate: 100 / scale, Period: period}},
		}
		run := 1200 * ms
		if longFaultTests() {
			run = 30 * time.Second
		}
		res := runFleet(t, b, fleetOrders{Jobs: jobs, Workers: 8, Run: run}, groups)
		for _, e := range res.errs {
			t.Errorf("a child's call failed: %s", e)
		}
		for i, g := range groups[1:] {
			c := res.clocks[i+1]
			t.Logf("%s: processes under faketime %s: time.Now() read %+.3fs from the parent's, `date` %+.3fs; Go side's clock (clock.Set) shifted %v",
				b.Kind, g.Faketime, c.goNow, c.date, g.Shift)
			// date read its clock between the child's two readings of time.Now, which
			// faketime does not reach; a second's slack for date's start and output
			if s := g.Shift.Seconds(); s < c.lo-1 || s > c.hi+1 {
				t.Errorf("faketime %s: date in the child read %+.3fs to %+.3fs from its time.Now, want %v: faketime did not shift the child",
					g.Faketime, c.lo, c.hi, g.Shift)
			}
		}
		for _, j := range jobs {
			s := jobStats(t, res, b.Prefix, j)
			state := "{" + b.Prefix + j.Keys[0] + "}:" + keys.State
			var shares []float64
			for _, g := range res.groups {
				n := 0
				if gk := g.ByKey()[state]; gk != nil {
					n = gk.Total()
				}
				shares = append(shares, float64(n)/float64(s.permits))
			}
			redistest.Figure(t, "%s: %v %v, 6 processes (2 on time, 2 at +300s, 2 at -300s) × 8 goroutines: %d permits; most in any %v: %d (bound %d); over the bucket: %d; utilization %.4f; shares on time / +300s / -300s: %.3f / %.3f / %.3f",
				b.Kind, j.Alg, j.Limit, s.permits, period, s.most, bound(j.Alg, j.Limit), s.over, s.util, shares[0], shares[1], shares[2])
			if s.most > bound(j.Alg, j.Limit) {
				t.Errorf("%v: %d permits took effect within one %v, bound %d", j.Alg, s.most, period, bound(j.Alg, j.Limit))
			}
			if s.over > 0 {
				t.Errorf("%v: a grant took %d permits more than the bucket held", j.Alg, s.over)
			}
			if s.aligned > j.Limit.Rate {
				t.Errorf("%v: %d permits took effect in one aligned window of %v, rate %d", j.Alg, s.aligned, period, j.Limit.Rate)
			}
			for i, sh := range shares {
				if sh == 0 {
					t.Errorf("%v: processes at %v got nothing", j.Alg, groups[i].Shift)
				}
			}
		}
		for i, g := range groups {
			t.Logf("%s: processes at %v: the earliest a WaitN returned before its grant took effect: %v", b.Kind, g.Shift, res.early[i])
			if res.early[i] > time.Millisecond {
				t.Errorf("processes at %v: a WaitN returned %v before its grant took effect", g.Shift, res.early[i])
			}
		}
	})
}

// A redis-server whose clock steps back (run under libfaketime, its offset rewritten
// while the limiters are in use) admits nothing extra, for every algorithm. The log and
// window algorithms hold the latest grant's time and place no grant before it, so
// grants made after the step are booked after the ones made before it, in the server's
// own timeline from before the step, and the callers wait the step out. The token
// bucket decides as golang.org/x/time/rate does when time goes back: the tokens it
// holds stay as they are (the step adds none) and refill from the new time on, so its
// grants after the step are stamped by the stepped clock and conform to the bucket in
// real time.
//
// The clock steps while no call is in flight (the calls wait at a gate meanwhile), so
// a call sent before the step ran before it, and one sent after it on the stepped
// clock. Each grant's effect time is read from its reply; a grant made after the step
// is mapped back to the timeline from before the step by adding the step. In that
// timeline, which is the real time, no period holds more than the bound (the token
// bucket's grants conform to the bucket), and for the log and window algorithms neither
// does any period of the times as the server stamped them, on a key that held state as
// the clock stepped (the token bucket's stamps are reported). Tolerances: none on the
// bound (the offset of the step is exact; the check that it took effect reads the
// server's clock until it rules out no step). The stall, the real time from the step
// until a grant made after it takes effect, is reported: about the step for the log
// and window algorithms, as the bookings made before it still run.
func TestServerClockStepBackAdmitsNothingExtra(t *testing.T) {
	parallel(t)
	needFaketime(t)
	const (
		period = 250 * ms
		step   = time.Second
	)
	s, clock, err := redistest.StartServerWithClock()
	if err != nil {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatal(err)
		}
		t.Skipf("no redis-server under faketime: %v", err)
	}
	defer s.Kill()
	rdb := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer rdb.Close()
	ctl := redis.NewClient(&redis.Options{Addr: s.Addr}) // the test's own calls, past the gate below
	defer ctl.Close()
	ctx := context.Background()
	// offset brackets the server's clock less this process's: its TIME lies between the
	// times the call was sent and answered. Not 0 at offset 0: a server started on a
	// starved machine reads behind from its start until the offset is next set (the
	// time libfaketime took to start, it seems), so the step is read as the difference
	// of two brackets, read until it tells a step from none: a reply a starved machine
	// reads late widens a bracket, never moves it off. (The lag, behind, only moves the
	// grants made before the step earlier in real time, away from those after it.)
	offset := func() (lo, hi time.Duration) {
		t.Helper()
		before := time.Now()
		now, err := ctl.Time(ctx).Result()
		after := time.Now()
		if err != nil {
			t.Fatal(err)
		}
		return now.Sub(after), now.Sub(before)
	}
	lo0, hi0 := offset() // narrowed until it cannot be the offset the step leaves
	for hi0-lo0 >= step/2 {
		lo, hi := offset()
		lo0, hi0 = max(lo0, lo), min(hi0, hi)
	}
	// gate holds the limiters' calls back while the clock steps: each passes it (before
	// the recorder below stamps it Sent) and holds it until its reply is read, and the
	// step waits for every call in flight to end and lets none start. So a call was
	// made before the step if it was sent before the gate closed, else after it,
	// however long a loaded machine takes to send, run or answer it.
	gate := &gateHook{}
	rdb.AddHook(gate)
	grants := redistest.RecordGrants(rdb)
	var lims []*Limiter
	for _, alg := range allAlgorithms {
		limit := Limit{Rate: 20, Period: period}
		if alg == TokenBucket {
			limit.Burst = 3
		}
		l, err := New(rdb, "stepback-"+alg.String(), limit, WithAlgorithm(alg)) // one algorithm per key
		if err != nil {
			t.Fatal(err)
		}
		lims = append(lims, l)
		t.Cleanup(func() { rdb.Del(context.Background(), l.stateKey()) })
	}
	var (
		stop = make(chan struct{})
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for i, l := range lims {
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := 1 + (i+w)%3
				for {
					select {
					case <-stop:
						return
					default:
					}
					var err error
					if w < 6 {
						err = l.WaitN(ctx, n)
					} else { // callers that take their chance and poll
						var r Result
						r, err = l.AllowN(ctx, n)
						if err == nil && !r.Allowed {
							time.Sleep(min(r.RetryAfter, 10*ms))
						}
					}
					if err != nil {
						mu.Lock()
						errs = append(errs, err)
						mu.Unlock()
						return
					}
				}
			}()
		}
	}
	time.Sleep(time.Second)
	gate.Lock()
	closed := time.Now() // every call sent before it has been answered
	if err := clock.Set(-step); err != nil {
		t.Fatal(err)
	}
	// which keys hold state as the clock steps back: the log and window algorithms
	// stamp no grant before the latest one they hold; a key whose grants had all
	// stopped counting (its callers stalled for a period on a loaded machine) has
	// expired, rightly, and the stepped clock stamps its next grants afresh
	held := map[string]bool{}
	for _, l := range lims {
		n, err := ctl.Exists(ctx, l.stateKey()).Result()
		if err != nil {
			t.Fatal(err)
		}
		held[l.stateKey()] = n == 1
	}
	stepped := time.Now() // every call sent after it runs on the stepped clock
	gate.Unlock()
	// the change of the offset brackets, read until they tell a step from none
	for {
		lo1, hi1 := offset()
		lo, hi := lo1-hi0, hi1-lo0
		if -step*3/2 < lo && hi < -step/2 {
			break
		}
		if -step/2 < lo && hi < step/2 {
			t.Fatalf("the server's clock did not step back %v: it reads between %v and %v off this process's, between %v and %v before the step", step, lo1, hi1, lo0, hi0)
		}
	}
	eps := (lo0 + hi0) / 2 // the server's clock less this process's before the step
	time.Sleep(step + 700*ms)
	close(stop)
	wg.Wait()
	for _, err := range errs {
		t.Errorf("a call failed: %v", err)
	}

	byKey := grants.ByKey()
	for _, l := range lims {
		alg, limit := l.alg, l.limits[0]
		g := byKey[l.stateKey()]
		if g == nil {
			t.Fatalf("%v: no grants", alg)
		}
		inReal := &redistest.Grants{}
		var before, after int
		var lastBefore, firstAfter time.Time
		for _, gr := range g.List() {
			if gr.Sent.Before(closed) {
				before += gr.N
				if gr.At.After(lastBefore) {
					lastBefore = gr.At
				}
			} else {
				after += gr.N
				gr.At = gr.At.Add(step)
				if firstAfter.IsZero() || gr.At.Before(firstAfter) {
					firstAfter = gr.At
				}
			}
			inReal.Add(gr)
		}
		most, stamped := inReal.MaxInWindow(period), g.MaxInWindow(period)
		over, _ := inReal.MaxOverBucket(limit.Rate, limit.Period, limit.Burst)
		redistest.Figure(t, "%v %v: %d permits before the step back of %v, %d after; most in any %v: %d in real time, %d by the server's stamps (bound %d); the first grant made after the step took effect %v after it (the last one booked before it %v after it)",
			alg, limit, before, step, after, period, most, stamped, bound(alg, limit),
			firstAfter.Sub(stepped).Round(ms), lastBefore.Add(-eps).Sub(stepped).Round(ms))
		if after == 0 {
			t.Errorf("%v: nothing granted after the step", alg)
		}
		if most > bound(alg, limit) {
			t.Errorf("%v: %d permits in one %v in real time; bound %d", alg, most, period, bound(alg, limit))
		}
		if !held[l.stateKey()] {
			t.Logf("%v: the key held no state as the clock stepped back (no grant of it counted any more)", alg)
		}
		if alg != TokenBucket && held[l.stateKey()] && stamped > bound(alg, limit) {
			t.Errorf("%v: %d permits in one %v by the server's stamps; bound %d", alg, stamped, period, bound(alg, limit))
		}
		if alg == TokenBucket && over > 0 {
			t.Errorf("%v: a grant took %d permits more than the bucket held", alg, over)
		}
	}
}

// gateHook holds every command back while its write lock is held, and holds the lock
// back until no command is in flight: a command passes once its reply is read.
type gateHook struct{ sync.RWMutex }

func (g *gateHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (g *gateHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		g.RLock()
		defer g.RUnlock()
		return next(ctx, cmd)
	}
}

func (g *gateHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		g.RLock()
		defer g.RUnlock()
		return next(ctx, cmds)
	}
}
