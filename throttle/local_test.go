package throttle

import (
	"context"
	"fmt"
	"math"
	"math/rand"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// acquire is acquireLocal of n on g alone: the log script's acquire (lua/log.lua's fit
// and take).
func (g *localLog) acquire(now int64, n int, maxWait int64) grant {
	return acquireLocal(now, func(string) int { return n }, maxWait, g)
}

// FailLocal's share of a limit is 1/fleet of it, rounded down but never below 1; a
// token bucket's share keeps both its burst's share and its rate's share.
func TestLocalLogShare(t *testing.T) {
	for _, c := range []struct {
		limits []Limit
		alg    Algorithm
		fleet  int
		want   []Limit
		maxN   int
		span   time.Duration
	}{
		{[]Limit{PerSecond(10)}, SlidingWindow, 1, []Limit{PerSecond(10)}, 10, time.Second},
		{[]Limit{PerSecond(10)}, SlidingWindow, 3, []Limit{PerSecond(3)}, 3, time.Second},
		{[]Limit{PerSecond(10)}, FixedWindow, 20, []Limit{PerSecond(1)}, 1, time.Second}, // never 0
		{[]Limit{PerSecond(10), {Rate: 600, Period: time.Minute}}, SlidingCounter, 4,
			[]Limit{PerSecond(2), {Rate: 150, Period: time.Minute}}, 2, time.Minute},
		// 20 at once, 10 per second; a quarter: 5 at once, refilled in 2s (2.5 per second)
		{[]Limit{{Rate: 10, Period: time.Second, Burst: 20}}, TokenBucket, 4,
			[]Limit{{Rate: 5, Period: 2 * time.Second}}, 5, 2 * time.Second},
		// burst = rate: a third is 3 at once, refilled in 900ms (10/3 per second)
		{[]Limit{PerSecond(10)}, TokenBucket, 3, []Limit{{Rate: 3, Period: 900 * ms}}, 3, 900 * ms},
		// more processes than the burst: 1 each, every fleet/rate periods
		{[]Limit{{Rate: 2, Period: time.Second, Burst: 1}}, TokenBucket, 4,
			[]Limit{{Rate: 1, Period: 2 * time.Second}}, 1, 2 * time.Second},
		// 1 a year over 300 processes: 1 each every 300 years, beyond a Duration; at most
		// 2^50µs (36 years), not a period that wrapped negative and granted every call
		{[]Limit{{Rate: 1, Period: 365 * 24 * time.Hour}}, TokenBucket, 300,
			[]Limit{{Rate: 1, Period: maxBucketUS * time.Microsecond}}, 1, maxBucketUS * time.Microsecond},
		{[]Limit{PerSecond(10)}, TokenBucket, math.MaxInt,
			[]Limit{{Rate: 1, Period: maxBucketUS * time.Microsecond}}, 1, maxBucketUS * time.Microsecond},
	} {
		g := newLocalLog(c.limits, c.alg.algo(), c.fleet)
		if !slices.Equal(g.limits, c.want) {
			t.Errorf("%v %v / %d: share %v, want %v", c.alg, c.limits, c.fleet, g.limits, c.want)
		}
		if got := g.maxN; got != c.maxN {
			t.Errorf("%v %v / %d: maxN %d, want %d", c.alg, c.limits, c.fleet, got, c.maxN)
		}
		if got := g.span; got != c.span {
			t.Errorf("%v %v / %d: span %v, want %v", c.alg, c.limits, c.fleet, got, c.span)
		}
		// the share grants its maxN at once, then nothing more at once
		const t0 = int64(1_000_000_000_000)
		if got := g.acquire(t0, c.maxN, 0); !got.granted {
			t.Errorf("%v %v / %d: the share's first %d denied: %+v", c.alg, c.limits, c.fleet, c.maxN, got)
		}
		if got := g.acquire(t0+1, 1, 0); got.granted {
			t.Errorf("%v %v / %d: granted beyond the share within its period: %+v", c.alg, c.limits, c.fleet, got)
		}
	}
}

// The local log grants like the sliding window: now while the window has room, then
// booked in order at the exact time permits leave it, if that comes within maxWait;
// n = 0 only reads; a booking still in the future can be given back, once.
func TestLocalLogAcquireAndCancel(t *testing.T) {
	g := newLocalLog([]Limit{PerSecond(2)}, SlidingWindow.algo(), 1)
	const t0, s = int64(1_000_000_000), int64(1_000_000) // µs
	type want struct {
		granted bool
		wait    time.Duration
		token   int64
	}
	check := func(step string, got grant, w want) {
		t.Helper()
		if !got.local || got.granted != w.granted || got.wait != w.wait || got.token != w.token {
			t.Fatalf("%s: %+v, want local %+v", step, got, w)
		}
	}
	check("t0: 1", g.acquire(t0, 1, 0), want{true, 0, t0})
	check("t0+100ms: 1", g.acquire(t0+s/10, 1, 0), want{true, 0, t0 + s/10})
	check("t0+200ms: full, no wait allowed", g.acquire(t0+s/5, 1, 0), want{false, 800 * ms, 0})
	check("t0+200ms: full, n = 0 reads", g.acquire(t0+s/5, 0, 0), want{true, 0, 0})
	check("t0+200ms: book when t0's leaves", g.acquire(t0+s/5, 1, s), want{true, 800 * ms, t0 + s})
	check("t0+200ms: next behind it", g.acquire(t0+s/5, 1, 2*s), want{true, 900 * ms, t0 + s + s/10})
	check("t0+200ms: queue behind the bookings", g.acquire(t0+s/5, 1, 0), want{false, 1800 * ms, 0})

	if !g.cancel(t0+s/2, t0+s, 1) {
		t.Fatal("cancel of the booking at t0+1s, at t0+500ms: not given back")
	}
	if g.cancel(t0+s/2, t0+s, 1) {
		t.Fatal("second cancel of the same booking: given back twice")
	}
	if g.cancel(t0+s+s/5, t0+s+s/10, 1) {
		t.Fatal("cancel of a booking that has taken effect: given back")
	}
	// the freed permit goes to the next caller, not before the latest booking (FIFO):
	// at t0+1.1s, beside the booking there, whose window now has room for both
	check("t0+500ms: the freed permit", g.acquire(t0+s/2, 1, s), want{true, 600 * ms, t0 + s + s/10})
	check("t0+500ms: then a second later", g.acquire(t0+s/2, 1, 2*s), want{true, 1600 * ms, t0 + 2*s + s/10})

	// grants no window can see any more are trimmed
	g.acquire(t0+10*s, 0, 0)
	if len(g.entries) != 0 {
		t.Fatalf("entries after every window passed: %v, want none", g.entries)
	}
}

// With several limits a grant must fit each; the wait is the longest.
func TestLocalLogSeveralLimits(t *testing.T) {
	g := newLocalLog([]Limit{{Rate: 2, Period: 100 * ms}, PerSecond(3)}, SlidingWindow.algo(), 1)
	const t0, s = int64(5_000_000), int64(1_000_000)
	for i, c := range []struct {
		at      int64
		n       int
		granted bool
		wait    time.Duration
	}{
		{t0, 2, true, 0},
		{t0 + s/20, 1, false, 50 * ms},     // the 100ms limit: t0's permits leave at t0+100ms
		{t0 + s/10, 1, true, 0},            // now 3 in the second
		{t0 + s/5, 1, false, 800 * ms},     // the 100ms limit has room, the second not until t0+1s
		{t0 + s, 2, true, 0},               // t0's two have left the second
		{t0 + s + s/20, 1, false, 50 * ms}, // 100ms limit full; the second would have room
	} {
		got := g.acquire(c.at, c.n, 0)
		if got.granted != c.granted || got.wait != c.wait {
			t.Fatalf("step %d (t0+%v, n=%d): granted %v wait %v, want %v %v", i,
				time.Duration(c.at-t0)*time.Microsecond, c.n, got.granted, got.wait, c.granted, c.wait)
		}
	}
}

// The local log decides as the reference model of the sliding window does.
func TestLocalLogMatchesModel(t *testing.T) {
	limits := []Limit{{Rate: 3, Period: 200 * ms}, {Rate: 5, Period: time.Second}}
	g := newLocalLog(limits, SlidingWindow.algo(), 1)
	m := newModel(SlidingWindow, limits, 1)
	var now int64 = 1_000_000_000
	for i := 0; i < 300; i++ {
		now += int64((i * 7919) % 90_000)
		n := i % 4
		maxWait := int64((i % 3) * 300_000)
		want, token := m.allow(now, n, maxWait)
		got := g.acquire(now, n, maxWait)
		if got.granted != want.Allowed {
			t.Fatalf("step %d: granted %v, want %+v", i, got.granted, want)
		}
		if got.granted && got.token != token {
			t.Fatalf("step %d: booked at %d, want %d", i, got.token, token)
		}
		if !got.granted && got.wait != want.RetryAfter {
			t.Fatalf("step %d: wait %v, want %v", i, got.wait, want.RetryAfter)
		}
	}
}

// FailLocal's Go model of the log (local.go) decides as the log script does: the same
// limits, requests and times on random timelines, acquires of every n with no wait, a
// bounded wait or none, and cancels of bookings ahead, get the same grants, waits, tokens
// and cancels. The log's rule is written twice, in Lua and in Go; this keeps them equal.
func TestLocalLogDecidesAsTheLogScript(t *testing.T) {
	noteMissingServers(t, "the Go model was checked against the script on miniredis only", redistest.Standalone, redistest.Cluster)
	cases := [][]Limit{
		{PerSecond(5)},
		{{Rate: 3, Period: 200 * ms}, {Rate: 10, Period: time.Second}},
		{{Rate: 7, Period: 300 * ms}, {Rate: 12, Period: 700 * ms}, {Rate: 20, Period: 2 * time.Second}},
		{{Rate: 1, Period: 1500 * time.Microsecond}, {Rate: 4, Period: 10 * ms}},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		steps := 300
		if b.Kind != redistest.Standalone { // as eachModelCase
			steps = 100
		}
		for ci, limits := range cases {
			tl := newTimeline(t, b)
			l := tl.limiter(fmt.Sprintf("local-vs-lua%d", ci), limits[0], WithLimits(limits[1:]...))
			g := newLocalLog(limits, SlidingWindow.algo(), 1)
			longest := maxPeriodOf(limits)
			rng := rand.New(rand.NewSource(int64(ci)))
			type booking struct {
				n     int
				token int64
			}
			var booked []booking
			count := map[string]int{}
			var at time.Duration
			for i := 0; i < steps; i++ {
				at += time.Duration(rng.Int63n(longest/6+1)) * time.Microsecond
				tl.at(at)
				now := tl.now.UnixMicro()
				if rng.Intn(5) == 0 && len(booked) > 0 { // give a booking back
					k := len(booked) - 1 - rng.Intn(min(3, len(booked))) // a recent one: still ahead, likely
					bk := booked[k]
					booked = append(booked[:k], booked[k+1:]...)
					if rng.Intn(2) == 0 && bk.token > now { // at the very µs it takes effect
						at = time.Duration(bk.token-redistest.Epoch.UnixMicro()) * time.Microsecond
						tl.at(at)
						now = bk.token
					}
					rep, err := l.client().do(&request{ctx: ctx, t: l.t, ks: l.client().key(l.t.tag), call: l.request(protocol.OpCancel, bk.n, bk.token), timeout: l.timeout})
					if err != nil {
						t.Fatal(err)
					}
					got, want := rep.v[0] == 1, g.cancel(now, bk.token, bk.n)
					if got != want {
						t.Fatalf("%v step %d (t0+%v): cancel of %d at %d: script freed %v, Go model %v", limits, i, at, bk.n, bk.token, got, want)
					}
					if got {
						count["cancels that freed"]++
					} else {
						count["cancels too late"]++
					}
					continue
				}
				n := rng.Intn(l.maxN + 1)
				var maxWait int64 // µs
				switch rng.Intn(3) {
				case 1:
					maxWait = rng.Int63n(3 * longest)
				case 2:
					maxWait = protocol.MaxWait
				}
				got, err := l.acquire(ctx, n, time.Duration(maxWait)*time.Microsecond, nil, 0, false)
				if err != nil {
					t.Fatal(err)
				}
				want := g.acquire(now, n, maxWait)
				if got.granted != want.granted || got.wait != want.wait || got.granted && got.token != want.token {
					t.Fatalf("%v step %d (t0+%v, n=%d, max wait %dµs): script granted %v wait %v token %d; Go model %v %v %d",
						limits, i, at, n, maxWait, got.granted, got.wait, got.token, want.granted, want.wait, want.token)
				}
				switch {
				case got.granted && got.wait > 0:
					booked = append(booked, booking{n, got.token})
					count["bookings ahead"]++
				case got.granted:
					count["grants now"]++
				default:
					count["denials"]++
				}
			}
			t.Logf("%v: %d steps, the same decisions: %v", limits, steps, count)
		}
	})
}

// FailLocal's semaphore share is max/fleet slots, at least 1; a lease lives one TTL
// unless extended; a full share answers the time until the earliest lease expires.
func TestLocalSemFailLocal(t *testing.T) {
	if got := newLocalSem(7, FailLocal(3)).max; got != 2 {
		t.Fatalf("7 slots / 3 processes: share %d, want 2", got)
	}
	if got := newLocalSem(2, FailLocal(3)).max; got != 1 {
		t.Fatalf("2 slots / 3 processes: share %d, want 1 (never 0)", got)
	}
	s := newLocalSem(4, FailLocal(2)) // 2 slots
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	const ttl = 10 * time.Second
	acquire := func(at time.Duration, id string, ok bool, wait time.Duration) {
		t.Helper()
		if gotOK, gotWait := s.acquire(t0.Add(at), id, ttl); gotOK != ok || gotWait != wait {
			t.Fatalf("t0+%v acquire %s: %v %v, want %v %v", at, id, gotOK, gotWait, ok, wait)
		}
	}
	acquire(0, "a", true, 0)
	acquire(time.Second, "b", true, 0)
	acquire(2*time.Second, "c", false, 8*time.Second) // a expires at t0+10s
	acquire(3*time.Second, "a", true, 0)              // a holder asking again keeps its slot
	if !s.renew(t0.Add(5*time.Second), "a", ttl) {
		t.Fatal("extend of a live lease failed")
	}
	acquire(6*time.Second, "c", false, 5*time.Second) // now b (t0+11s) expires first
	acquire(11*time.Second, "c", true, 0)             // b expired: its slot is free
	if s.renew(t0.Add(11*time.Second), "b", ttl) {
		t.Fatal("extend of an expired lease succeeded")
	}
	if s.renew(t0.Add(12*time.Second), "b", 0) {
		t.Fatal("release of an expired lease reported it live")
	}
	if !s.renew(t0.Add(12*time.Second), "a", 0) {
		t.Fatal("release of a live lease reported it gone")
	}
	if s.renew(t0.Add(12*time.Second), "a", 0) {
		t.Fatal("second release of a lease reported it live")
	}
	acquire(12*time.Second, "d", true, 0) // a's slot
	acquire(12*time.Second, "e", false, 9*time.Second)
	if s.renew(t0.Add(15*time.Second), "a", ttl) {
		t.Fatal("extend of a released lease succeeded")
	}
	// c's lease ran out at t0+21s without being extended
	if s.renew(t0.Add(21*time.Second), "c", 0) {
		t.Fatal("release at the expiry instant reported the lease live")
	}
}

// Under FailOpen the stand-in grants every lease and keeps none.
func TestLocalSemFailOpen(t *testing.T) {
	s := newLocalSem(1, FailOpen)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, id := range []string{"a", "b", "c"} {
		if ok, wait := s.acquire(now, id, time.Second); !ok || wait != 0 {
			t.Fatalf("acquire %s: %v %v, want a lease", id, ok, wait)
		}
	}
	if len(s.leases) != 0 {
		t.Fatalf("FailOpen kept %d leases, want none", len(s.leases))
	}
	if !s.renew(now.Add(time.Hour), "a", time.Second) || !s.renew(now.Add(time.Hour), "zz", 0) {
		t.Fatal("FailOpen: extend or release failed")
	}
}

// FailLocal keeps each tenant's share of its caps in this process; once it holds
// localCapsSweep tenants, a new tenant's first call forgets those whose permits have all
// left their windows, so a long outage with many tenants holds only the busy ones.
func TestLocalCapsForgetIdleTenants(t *testing.T) {
	c := &localCaps{tenants: map[string][]*localLog{},
		make: func() []*localLog { return newLocalLogs([]Limit{PerSecond(2)}, SlidingWindow.algo(), 1, false) }}
	one := func(string) int { return 1 }
	now := redistest.Epoch.UnixMicro()
	for i := range localCapsSweep {
		if g := acquireLocal(now, one, 0, c.of(fmt.Sprintf("t%d", i), now)...); !g.granted {
			t.Fatalf("tenant %d's first permit: %+v", i, g)
		}
	}
	busy := c.of("t0", now)
	if g := acquireLocal(now+600_000, one, 0, busy...); !g.granted { // t0's permits leave at now+1.6s
		t.Fatalf("t0's second permit: %+v", g)
	}
	now += 1_100_000 // every other tenant's permit has left its window, t0's second has not
	c.of("new", now)
	if len(c.tenants) != 2 || c.tenants["t0"] == nil || c.tenants["new"] == nil {
		t.Fatalf("%d tenants kept after the sweep, want t0 (busy) and the new one", len(c.tenants))
	}
	if g := acquireLocal(now, one, 0, c.of("t0", now)...); !g.granted {
		t.Fatalf("t0 after the sweep: %+v, want its second permit still counted and room for one", g)
	}
	if g := acquireLocal(now, one, 0, c.of("t0", now)...); g.granted {
		t.Fatalf("t0's fourth permit within a second: %+v, want denied (its share of 2 a second)", g)
	}
}

// gateClock stands still at now and, once armed, stops the k-th reading of it until
// released: a test pauses a call at that reading (entered says it is there).
type gateClock struct {
	now     time.Time
	mu      sync.Mutex
	k       int // readings to go until the stop; 0: unarmed
	entered chan struct{}
	release chan struct{}
}

func (c *gateClock) Now() time.Time {
	c.mu.Lock()
	stop := c.k > 0
	if stop {
		c.k--
		stop = c.k == 0
	}
	c.mu.Unlock()
	if stop {
		close(c.entered)
		<-c.release
	}
	return c.now
}

func (c *gateClock) NewTimer(d time.Duration) clock.Timer { return clock.System.NewTimer(d) }

func (c *gateClock) arm(k int) {
	c.mu.Lock()
	c.k, c.entered, c.release = k, make(chan struct{}), make(chan struct{})
	c.mu.Unlock()
}

func (c *gateClock) disarm() {
	c.mu.Lock()
	c.k = 0
	c.mu.Unlock()
}

// A tenant's local grant stays in its share of the caps while a new tenant's call sweeps
// the idle ones: the sweep cannot forget the record a decision has found and is about
// to book in, so the tenant's next call finds the grant. Here the tenant's call is
// stopped at its second clock reading, which came between finding its record and
// booking in it, while the new tenant's call sweeps; before, the grant went into a
// record nobody kept, and the tenant's next call, on a fresh one, was granted too: two
// in a second under a share of 1 a second.
func TestLocalCapsSweepKeepsARecordInUse(t *testing.T) {
	gc := &gateClock{now: redistest.Epoch}
	setGoClock(t, gc)
	ctx := context.Background()
	l, err := New(downClient(t), "local-caps-sweep", PerSecond(100_000), WithTenantLimits(PerSecond(1)),
		WithFailurePolicy(FailLocal(1)))
	if err != nil {
		t.Fatal(err)
	}
	allow := func(name string) bool {
		t.Helper()
		r, err := l.Tenant(name).Allow(ctx)
		if err != nil {
			t.Fatalf("tenant %s: %v", name, err)
		}
		return r.Allowed
	}
	for i := range localCapsSweep {
		if !allow(fmt.Sprintf("t%d", i)) {
			t.Fatalf("tenant t%d's first permit denied", i)
		}
	}
	gc.now = gc.now.Add(2 * time.Second) // every tenant idle: its permit left its window
	gc.arm(2)
	first := make(chan bool)
	go func() {
		r, err := l.Tenant("t0").Allow(ctx)
		if err != nil {
			t.Error(err)
		}
		first <- r.Allowed
	}()
	var granted, stopped bool
	select {
	case <-gc.entered: // stopped in its decision
		stopped = true
	case granted = <-first: // decided without stopping there
	}
	gc.disarm()
	if !allow("new") { // more than localCapsSweep tenants: sweeps the idle ones
		t.Fatal("the new tenant's first permit denied")
	}
	close(gc.release)
	if stopped {
		granted = <-first
	}
	if !granted {
		t.Fatal("t0's permit, 2s after its last, denied")
	}
	if allow("t0") {
		t.Fatal("t0 granted a second permit within a second: its share of its cap is 1 a second")
	}
}
