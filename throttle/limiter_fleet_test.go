package throttle

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// The fleet tests run waiters in several OS processes: this test binary again, told by
// fleetChildEnv (a JSON fleetOrders) to run TestFleetChildProcess. A child makes its
// limiters, prints "READY", waits for a line on stdin, then lets Workers goroutines per
// job WaitN (n drawn from 1..3) on the job's keys for Run (each once at least), and
// reports on stdout:
//
//	G <key> <at µs> <n>   a grant its limiters' script replies made, at its server time
//	C <key> <calls>       script calls it made on key
//	P <key> <permits>     permits its WaitN calls returned nil for (what callers believe)
//	EARLY <µs> <n> <u>    the most a WaitN returned before its grant took effect (by this
//	                      machine's clock, which the server shares), how many did, and
//	                      how many returned nil with no grant seen (must be none)
//	E <error>             a call that failed
//	CLOCK <go µs> <date> <go µs>  its time.Now() before and after `date +%s.%N` run
//	                      in its environment, and what date printed
//	END
//
// When a grant takes effect, for EARLY: the latest it can is wait after the Allowed hook
// saw the reply (the script ran, at the server time the wait counts from, before its
// reply came back). Each worker has Limiters of its own, whose hook runs on its
// goroutine, so a hook's call is the worker's own WaitN's grant.
const fleetChildEnv = "JOBTHROTTLE_FLEET_CHILD"

// fleetOrders is what a child is told to do.
type fleetOrders struct {
	Addrs   []string
	Cluster bool
	Prefix  string
	Jobs    []fleetJob
	Workers int           // goroutines per job
	Run     time.Duration // how long they keep asking
	Shift   time.Duration // the Go side's clock (clock.Set, tests only) runs this far from the real one
}

// fleetJob is one limit shared by the fleet on one or more keys; each WaitN picks one
// of the keys at random.
type fleetJob struct {
	Alg   Algorithm
	Keys  []string
	Limit Limit
}

// shiftedClock is a clock.Clock whose wall time is off by d, as on a machine whose
// clock is wrong (Go's monotonic reading stays, as it does there).
type shiftedClock struct{ d time.Duration }

func (c shiftedClock) Now() time.Time                       { return time.Now().Add(c.d) }
func (c shiftedClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

// grantSlot is what a worker's Allowed hook saw of its WaitN's grant: the latest time
// (UnixMicro, this machine's clock, which the server shares) at which it takes effect.
type grantSlot struct {
	seen atomic.Bool
	by   atomic.Int64
}

func TestFleetChildProcess(t *testing.T) {
	spec := os.Getenv(fleetChildEnv)
	if spec == "" {
		t.Skip("helper process of the fleet tests")
	}
	var o fleetOrders
	if err := json.Unmarshal([]byte(spec), &o); err != nil {
		t.Fatal(err)
	}
	rdb := redistest.Dial(o.Addrs, o.Cluster)
	defer rdb.Close()
	grants := redistest.RecordGrants(rdb)
	if o.Shift != 0 {
		setGoClock(t, shiftedClock{o.Shift})
	}
	// limiter makes a worker's Limiter of job j on key, whose Allowed hook fills slot
	limiter := func(j fleetJob, key string, slot *grantSlot) *Limiter {
		l, err := New(rdb, key, j.Limit, WithAlgorithm(j.Alg), WithKeyPrefix(o.Prefix), WithHooks(Hooks{
			Allowed: func(_ string, _ int, wait time.Duration) {
				slot.by.Store(time.Now().Add(wait).UnixMicro())
				slot.seen.Store(true)
			},
		}))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	fmt.Println("READY")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		t.Fatalf("waiting for go: %v", err)
	}
	before := time.Now()
	date, _ := exec.Command("date", "+%s.%N").Output()
	fmt.Fprintf(out, "CLOCK %d %s %d\n", before.UnixMicro(), strings.TrimSpace(string(date)), time.Now().UnixMicro())

	ctx := context.Background()
	start := time.Now()
	var (
		mu      sync.Mutex
		believe = map[string]int{}
		errs    []string
		early   time.Duration // the most a WaitN returned before its grant took effect
		earlyN  int
		unseen  int
		wg      sync.WaitGroup
	)
	for i, j := range o.Jobs {
		for w := 0; w < o.Workers; w++ {
			slot := &grantSlot{}
			var lims []*Limiter
			for _, key := range j.Keys {
				lims = append(lims, limiter(j, key, slot))
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewSource(int64(os.Getpid())<<16 + int64(i)<<8 + int64(w)))
				// one WaitN at least, however late a loaded machine starts the goroutine:
				// every job is asked of by every process
				for first := true; first || time.Since(start) < o.Run; first = false {
					l := lims[rng.Intn(len(lims))]
					n := 1 + rng.Intn(3)
					slot.seen.Store(false)
					err := l.WaitN(ctx, n)
					back := time.Now()
					mu.Lock()
					if err != nil {
						errs = append(errs, fmt.Sprintf("%s: %v", l.stateKey(), err))
					} else {
						believe[l.stateKey()] += n
						if !slot.seen.Load() {
							unseen++
						} else if d := time.UnixMicro(slot.by.Load()).Sub(back); d > 0 {
							early = max(early, d)
							earlyN++
						}
					}
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	for key, g := range grants.ByKey() {
		for _, gr := range g.List() {
			fmt.Fprintf(out, "G %s %d %d\n", key, gr.At.UnixMicro(), gr.N)
		}
		fmt.Fprintf(out, "C %s %d\n", key, g.Calls())
	}
	for key, n := range believe {
		fmt.Fprintf(out, "P %s %d\n", key, n)
	}
	fmt.Fprintf(out, "EARLY %d %d %d\n", early.Microseconds(), earlyN, unseen)
	for _, e := range errs {
		fmt.Fprintf(out, "E %s\n", strings.ReplaceAll(e, "\n", " "))
	}
	fmt.Fprintln(out, "END")
}

// fleetGroup is a set of children started alike: under libfaketime with
// FAKETIME=<Faketime> when set, with their limiters' clock shifted by Shift.
type fleetGroup struct {
	Children int
	Faketime string
	Shift    time.Duration
}

// fleetResult is what a fleet's children reported.
type fleetResult struct {
	grants  *redistest.Grants   // every child's grants and calls
	groups  []*redistest.Grants // the grants of each group's children
	believe map[string]int      // permits callers were told they got, by key
	errs    []string            // failed calls
	early   []time.Duration     // per group: the most a WaitN returned before its grant
	earlyN  int                 // how many WaitN returned early
	clocks  []childClock        // per group: a child's clocks
	byKey   map[string]*redistest.Grants
}

// childClock is what a child's CLOCK line says, in seconds: its time.Now (before date
// ran) and what date printed, each less the parent's time when it sent "go"; and the
// bracket [lo, hi] the offset of date's clock from the child's time.Now lies in (date
// read its clock between the child's two readings).
type childClock struct {
	goNow, date float64
	lo, hi      float64
}

// fleetKid is one running child.
type fleetKid struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	ready chan struct{}
	done  <-chan struct{} // closed when its stdout ends
	lines []string        // after READY
	sent  time.Time
}

// runFleet starts the groups' children on b with orders o, lets them go at once, waits
// for their reports and merges them.
func runFleet(t *testing.T, b *redistest.Backend, o fleetOrders, groups []fleetGroup) *fleetResult {
	t.Helper()
	o.Addrs, o.Cluster = b.Addrs()
	o.Prefix = b.Prefix
	var (
		kids    []*fleetKid
		groupOf []int
	)
	for gi, g := range groups {
		oo := o
		oo.Shift = g.Shift
		spec, err := json.Marshal(oo)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < g.Children; i++ {
			args := []string{os.Args[0], "-test.run=^TestFleetChildProcess$", "-test.count=1", "-test.timeout=120s"}
			env := append(os.Environ(), fleetChildEnv+"="+string(spec), "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
			if g.Faketime != "" {
				// libfaketime preloaded as the faketime wrapper does, without the
				// wrapper's shared memory: the wrapper creates /dev/shm/faketime_*_<pid>
				// exclusively, and names a killed run left behind make a later child
				// whose pid matches exit at once ("sem_open: File exists")
				lib, err := redistest.FaketimeLib()
				if err != nil {
					t.Fatal(err)
				}
				env = append(env, "LD_PRELOAD="+lib, "FAKETIME="+g.Faketime)
			}
			k := startFleetKid(t, args, env)
			kids = append(kids, k)
			groupOf = append(groupOf, gi)
		}
	}
	for _, k := range kids {
		select {
		case <-k.ready:
		case <-k.done:
			t.Fatalf("a child ended before it was ready: %v", k.cmd.Wait())
		case <-time.After(60 * time.Second):
			t.Fatal("a child was not ready after 60s")
		}
	}
	for _, k := range kids {
		k.sent = time.Now()
		if _, err := io.WriteString(k.stdin, "go\n"); err != nil {
			t.Fatal(err)
		}
	}
	res := &fleetResult{grants: &redistest.Grants{}, believe: map[string]int{}, clocks: make([]childClock, len(groups)),
		early: make([]time.Duration, len(groups))}
	for range groups {
		res.groups = append(res.groups, &redistest.Grants{})
	}
	for i, k := range kids {
		select {
		case <-k.done:
		case <-time.After(o.Run + 60*time.Second):
			t.Fatal("a child did not finish")
		}
		if err := k.cmd.Wait(); err != nil {
			t.Fatalf("child %d: %v", i, err)
		}
		if len(k.lines) == 0 || k.lines[len(k.lines)-1] != "END" {
			t.Fatalf("child %d's report is cut short: %q", i, k.lines)
		}
		for _, line := range k.lines {
			f := strings.Fields(line)
			switch f[0] {
			case "G":
				at, _ := strconv.ParseInt(f[2], 10, 64)
				n, _ := strconv.Atoi(f[3])
				gr := redistest.Grant{At: time.UnixMicro(at), N: n, Key: f[1]}
				res.grants.Add(gr)
				res.groups[groupOf[i]].Add(gr)
			case "C":
				n, _ := strconv.Atoi(f[2])
				res.grants.AddCalls(f[1], n)
			case "P":
				n, _ := strconv.Atoi(f[2])
				res.believe[f[1]] += n
			case "EARLY":
				us, _ := strconv.ParseInt(f[1], 10, 64)
				n, _ := strconv.Atoi(f[2])
				res.early[groupOf[i]] = max(res.early[groupOf[i]], time.Duration(us)*time.Microsecond)
				res.earlyN += n
				u, _ := strconv.Atoi(f[3])
				if u > 0 {
					t.Errorf("child %d: %d WaitN calls returned nil with no grant in their replies", i, u)
				}
			case "E":
				res.errs = append(res.errs, strings.TrimPrefix(line, "E "))
			case "CLOCK":
				before, _ := strconv.ParseInt(f[1], 10, 64)
				date, _ := strconv.ParseFloat(f[2], 64)
				after, _ := strconv.ParseInt(f[3], 10, 64)
				ref := float64(k.sent.UnixMicro()) / 1e6
				b, a := float64(before)/1e6, float64(after)/1e6
				res.clocks[groupOf[i]] = childClock{goNow: b - ref, date: date - ref, lo: date - a, hi: date - b}
			}
		}
	}
	res.byKey = res.grants.ByKey()
	return res
}

func startFleetKid(t *testing.T, args, env []string) *fleetKid {
	t.Helper()
	cmd := exec.Command(args[0], args[1:]...)
	cmd.Env = env
	k := &fleetKid{cmd: cmd, ready: make(chan struct{})}
	// the report is the lines from READY to END; what the test binary prints after
	// it (PASS, and coverage: under -cover) is not the child's
	ready, ended := false, false
	k.stdin, k.done = startHelperProcess(t, cmd, func(line string) {
		switch {
		case !ready && line == "READY":
			ready = true
			close(k.ready)
		case ready && !ended && line != "":
			k.lines = append(k.lines, line)
			ended = line == "END"
		}
	})
	return k
}

// keyStats is what a fleet did on one job: every key's most permits in one period,
// its over-bucket excess (token bucket), and the utilization and calls per permit.
type keyStats struct {
	most, over     int // the largest over the job's keys
	aligned        int // FixedWindow: the most in one aligned window on a key
	util, minUtil  float64
	permits, calls int
	keys           int
}

// jobStats checks a job's keys in res against the job's limit: most in any window and,
// for the token bucket, conformance to the bucket.
func jobStats(t *testing.T, res *fleetResult, prefix string, j fleetJob) keyStats {
	t.Helper()
	s := keyStats{minUtil: 2}
	suffix := keys.State
	for _, key := range j.Keys {
		state := "{" + prefix + key + "}:" + suffix
		g := res.byKey[state]
		if g == nil {
			continue // a key of many that no call picked or got through in time
		}
		if got, want := g.Total(), res.believe[state]; got != want {
			t.Errorf("%v %s: the scripts' replies granted %d permits, callers were told %d", j.Alg, key, got, want)
		}
		s.most = max(s.most, g.MaxInWindow(j.Limit.Period))
		switch j.Alg {
		case TokenBucket:
			over, _ := g.MaxOverBucket(j.Limit.Rate, j.Limit.Period, j.Limit.Burst)
			s.over = max(s.over, over)
		case FixedWindow:
			s.aligned = max(s.aligned, maxInAlignedWindow(g, j.Limit.Period))
		}
		u := g.Utilization(j.Limit.Period, j.Limit.Rate)
		s.util += u
		s.minUtil = min(s.minUtil, u)
		s.permits += g.Total()
		s.calls += g.Calls()
		s.keys++
	}
	if s.keys == 0 {
		t.Fatalf("%v %v: nothing was granted on any key", j.Alg, j.Keys)
	}
	s.util /= float64(s.keys)
	return s
}

// maxInAlignedWindow returns the most permits of g that took effect in one window of p
// aligned on the Unix epoch (FixedWindow's windows).
func maxInAlignedWindow(g *redistest.Grants, p time.Duration) int {
	per := map[int64]int{}
	most := 0
	for _, gr := range g.List() {
		w := gr.At.UnixMicro() / p.Microseconds()
		per[w] += gr.N
		most = max(most, per[w])
	}
	return most
}

// 8 processes × 8 goroutines WaitN (n mixed 1–3) on one key of each algorithm, and on
// 16 keys of the sliding window and of the token bucket: no period ever holds more than
// the bound on any key, by the server times the grants take effect (each process
// records them from its scripts' replies and reports them); the token bucket's grants
// conform to the bucket exactly; the fixed window's aligned windows hold at most the
// rate; what the scripts granted is what the callers were told; and no WaitN returns
// before its grant takes effect (server and processes share this machine's clock).
//
// Tolerances: none on the bounds; 1ms on the early return (µs against ns readings of
// one clock). Utilization (the share of the rate used in whole periods after the
// first) and calls per permit are reported, not asserted: they measure how fast the
// processes run, which a loaded machine changes. miniredis serves every process from
// this one (re-running its Lua interpreter per call), so it gets a fifth of the rates.
// Runs 1.5s by default, 30s with JOBTHROTTLE_LONG=1.
func TestFleetNeverOverAdmits(t *testing.T) {
	parallel(t)
	const period = 250 * ms
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		scale := 1
		if b.Kind == redistest.Mini {
			scale = 5
		}
		jobs := []fleetJob{
			{Alg: SlidingWindow, Keys: []string{"one-sw"}, Limit: Limit{Rate: 100 / scale, Period: period}},
			{Alg: TokenBucket, Keys: []string{"one-tb"}, Limit: Limit{Rate: 100 / scale, Period: period, Burst: 3}},
			{Alg: FixedWindow, Keys: []string{"one-fw"}, Limit: Limit{Rate: 100 / scale, Period: period}},
			{Alg: SlidingCounter, Keys: []string{"one-sc"}, Limit: Limit{Rate: 100 / scale, Period: period}},
			{Alg: SlidingWindow, Keys: keyNames("many-sw", 16), Limit: Limit{Rate: 20 / scale, Period: period}},
			{Alg: TokenBucket, Keys: keyNames("many-tb", 16), Limit: Limit{Rate: 20 / scale, Period: period, Burst: 3}},
		}
		run := 1500 * ms
		if longFaultTests() {
			run = 30 * time.Second
		}
		res := runFleet(t, b, fleetOrders{Jobs: jobs, Workers: 8, Run: run}, []fleetGroup{{Children: 8}})
		for _, e := range res.errs {
			t.Errorf("a child's call failed: %s", e)
		}
		for _, j := range jobs {
			s := jobStats(t, res, b.Prefix, j)
			redistest.Figure(t, "%s: %v %v on %d key(s), 8 processes × 8 goroutines: %d permits in %d calls (%.2f calls/permit); most in any %v on a key: %d (bound %d); over the bucket: %d; most in an aligned window: %d; utilization mean %.4f, lowest key %.4f",
				b.Kind, j.Alg, j.Limit, s.keys, s.permits, s.calls, float64(s.calls)/float64(s.permits), period, s.most, bound(j.Alg, j.Limit), s.over, s.aligned, s.util, s.minUtil)
			if s.most > bound(j.Alg, j.Limit) {
				t.Errorf("%v: %d permits took effect within one %v on one key, bound %d", j.Alg, s.most, period, bound(j.Alg, j.Limit))
			}
			if s.over > 0 {
				t.Errorf("%v: a grant took %d permits more than the bucket held", j.Alg, s.over)
			}
			if s.aligned > j.Limit.Rate {
				t.Errorf("%v: %d permits took effect in one aligned window of %v, rate %d", j.Alg, s.aligned, period, j.Limit.Rate)
			}
		}
		redistest.Figure(t, "%s: WaitN calls that returned before their grant took effect: %d (the earliest by %v)", b.Kind, res.earlyN, res.early[0])
		if res.early[0] > time.Millisecond {
			t.Errorf("a WaitN returned %v before its grant took effect", res.early[0])
		}
	})
}
