package throttle

import (
	"context"
	"errors"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestUnavailableIsTyped(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	l, err := New(b.Client, "typed", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	for _, reply := range []string{"LOADING Redis is loading", "MASTERDOWN Link with MASTER is down", "CLUSTERDOWN The cluster is down", "TRYAGAIN Multiple keys", "READONLY You can't write against a read only replica."} {
		b.SetError(reply)
		_, err := l.Allow(ctx)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("%q: %v, want ErrUnavailable", reply, err)
		}
	}
	b.SetError("NOPERM this user has no permissions to run the 'evalsha' command")
	if _, err := l.Allow(ctx); err == nil || errors.Is(err, ErrUnavailable) {
		t.Errorf("NOPERM: %v, want an error that is not ErrUnavailable", err)
	}
	b.SetError("")
	gone, err := New(downClient(t), "typed", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := gone.Allow(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("server gone: %v, want ErrUnavailable", err)
	}
	// bad input stays what it is under every policy
	open, _ := New(b.Client, "typed", PerSecond(5), WithFailurePolicy(FailOpen))
	if _, err := open.AllowN(ctx, 6); !errors.Is(err, ErrExceedsLimit) {
		t.Errorf("FailOpen, n too large: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if res, err := open.Allow(canceled); !errors.Is(err, context.Canceled) || res.Allowed {
		t.Errorf("FailOpen, cancelled context: %+v %v", res, err)
	}
}

func TestFailOpenGrantsAndCounts(t *testing.T) {
	var degraded int
	l, err := New(downClient(t), "open", PerSecond(1), WithFailurePolicy(FailOpen),
		WithHooks(Hooks{Degraded: func(key string, p FailurePolicy, err error) {
			if p != FailOpen || !errors.Is(err, ErrUnavailable) {
				t.Errorf("Degraded(%q, %v, %v)", key, p, err)
			}
			degraded++
		}}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 5; i++ {
		res, err := l.Allow(context.Background())
		if err != nil || !res.Allowed {
			t.Fatalf("FailOpen call %d: %+v, %v", i, res, err)
		}
	}
	if err := l.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	if degraded != 6 {
		t.Fatalf("Degraded hook calls %d; want 6", degraded)
	}
}

// FailLocal keeps each process to its share with the sliding window's exactness, and
// books ahead locally; without Redis it never grants more than the share in a period.
func TestFailLocalEnforcesTheShare(t *testing.T) {
	var local atomic.Int64
	l, err := New(downClient(t), "local", Limit{Rate: 40, Period: 200 * ms}, WithFailurePolicy(FailLocal(4)),
		WithHooks(Hooks{Degraded: func(string, FailurePolicy, error) { local.Add(1) }}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var (
		mu    sync.Mutex
		times []time.Time
		wg    sync.WaitGroup
	)
	for w := 0; w < 6; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 5; i++ {
				if err := l.Wait(ctx); err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				times = append(times, time.Now())
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	// 30 permits at a share of 10 per 200ms: they take at least two more periods
	first, last := times[0], times[0]
	for _, at := range times {
		if at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	if d := last.Sub(first); d < 400*ms {
		t.Fatalf("30 permits at 10 per 200ms took %v, want >= 400ms", d)
	}
	if n := local.Load(); n < 30 {
		t.Fatalf("%d local decisions, want >= 30", n)
	}
	// the share can never grant more than 10 at once
	if _, err := l.AllowN(ctx, 11); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("AllowN(11) above the share: %v, want ErrUnavailable", err)
	}
}

// Under FailLocal, a reservation's Cancel gives its booking back to the process's
// share: the next caller books the same slot.
func TestFailLocalCancelGivesBack(t *testing.T) {
	setGoClock(t, stillClock{redistest.Epoch})
	l, err := New(downClient(t), "local-cancel", PerSecond(1), WithFailurePolicy(FailLocal(1)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	delay := func() time.Duration {
		t.Helper()
		r, err := l.Reserve(ctx, 1, 5*time.Second)
		if err != nil || !r.OK() {
			t.Fatalf("Reserve: %v %v", r, err)
		}
		return r.Delay()
	}
	delay() // now
	r, err := l.Reserve(ctx, 1, 5*time.Second)
	if err != nil || !r.OK() || r.Delay() != time.Second {
		t.Fatalf("the second: %v %v, want booked a second ahead", r, err)
	}
	if err := r.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	if d := delay(); d != time.Second {
		t.Fatalf("after the cancel: booked %v ahead, want the slot given back (1s)", d)
	}
	if d := delay(); d != 2*time.Second {
		t.Fatalf("the next: booked %v ahead, want 2s", d)
	}
}

// When Redis comes back, decisions go back to it: the first call after the breaker's
// quiet time probes Redis (TestBreakerBacksOff checks the quiet times).
func TestFailLocalGoesBackToRedis(t *testing.T) {
	s, err := redistest.StartServer()
	if err != nil {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatalf("real Redis required: %v", err)
		}
		t.Skipf("no redis-server: %v", err)
	}
	// a killed server refuses dials at once: no short dial timeout, which a loaded machine
	// would miss with Redis up
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1})
	defer c.Close()
	var local atomic.Int64
	l, err := New(c, "back", PerSecond(1000), WithFailurePolicy(FailLocal(2)),
		WithHooks(Hooks{Degraded: func(string, FailurePolicy, error) { local.Add(1) }}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Allow(ctx); err != nil || local.Load() != 0 {
		t.Fatalf("with Redis up: %v, %d local decisions", err, local.Load())
	}
	s.Kill()
	if _, err := l.Allow(ctx); err != nil || local.Load() != 1 {
		t.Fatalf("with Redis down: %v, %d local decisions", err, local.Load())
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for {
		before := local.Load()
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		if local.Load() == before {
			break // Redis decided
		}
		if time.Since(back) > signalWait {
			t.Fatalf("still deciding locally %v after Redis came back", signalWait)
		}
		time.Sleep(10 * ms)
	}
	t.Logf("back to Redis %v after it returned", time.Since(back).Round(time.Millisecond))
}

// The breaker keeps FailOpen and FailLocal off Redis for 250ms after a failure, twice as
// long after each failure that follows, up to 1s; when the quiet time is over one caller
// probes while the others stay local; a success closes it, and the next failure starts
// from 250ms again.
func TestBreakerBacksOff(t *testing.T) {
	var b breaker
	t0 := time.Unix(1_700_000_000, 0)
	if b.skip(t0) {
		t.Fatal("a closed breaker skipped Redis")
	}
	for i, want := range []time.Duration{250 * ms, 500 * ms, time.Second, time.Second} {
		at := t0.Add(time.Duration(i) * 10 * time.Second)
		if got := b.failed(at); got != want {
			t.Fatalf("failure %d: quiet for %v, want %v", i+1, got, want)
		}
		if !b.skip(at.Add(want-time.Microsecond)) || b.idle(at.Add(want-time.Microsecond)) {
			t.Fatalf("failure %d: Redis tried within the quiet time", i+1)
		}
		if b.skip(at.Add(want)) {
			t.Fatalf("failure %d: no probe once the quiet time was over", i+1)
		}
		if !b.skip(at.Add(want)) {
			t.Fatalf("failure %d: a second caller probed beside the first", i+1)
		}
	}
	b.succeeded()
	if b.skip(t0.Add(time.Minute)) || !b.idle(t0.Add(time.Minute)) {
		t.Fatal("the breaker stayed open after a success")
	}
	if got := b.failed(t0.Add(time.Hour)); got != breakerFirst {
		t.Fatalf("a failure after a success: quiet for %v, want %v again", got, breakerFirst)
	}
}

func TestSemaphoreFailurePolicies(t *testing.T) {
	ctx := context.Background()
	closed, err := NewSemaphore(downClient(t), "sem", 4)
	if err != nil {
		t.Fatal(err)
	}
	if l, _, err := closed.TryAcquire(ctx); !errors.Is(err, ErrUnavailable) || l != nil {
		t.Fatalf("FailClosed semaphore with Redis down: %v, %v", l, err)
	}

	var degraded, localLeases int
	open, err := NewSemaphore(downClient(t), "sem", 1, WithFailurePolicy(FailOpen),
		WithSemaphoreHooks(SemaphoreHooks{Degraded: func(string, FailurePolicy, error) { degraded++ }}))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ { // more than max: open grants them all
		l, _, err := open.TryAcquire(ctx)
		if err != nil || l == nil {
			t.Fatalf("FailOpen TryAcquire %d: %v, %v", i, l, err)
		}
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("FailOpen Extend: %v", err)
		}
		defer l.Release(ctx)
	}
	if degraded != 3 {
		t.Fatalf("FailOpen: %d Degraded hook calls; want 3", degraded)
	}

	local, err := NewSemaphore(downClient(t), "sem", 4, WithFailurePolicy(FailLocal(2)), WithLeaseTTL(time.Minute),
		WithSemaphoreHooks(SemaphoreHooks{Degraded: func(string, FailurePolicy, error) { localLeases++ }}))
	if err != nil {
		t.Fatal(err)
	}
	a, _, err := local.TryAcquire(ctx)
	if err != nil || a == nil {
		t.Fatalf("FailLocal first lease: %v %v", a, err)
	}
	b, _, err := local.TryAcquire(ctx)
	if err != nil || b == nil {
		t.Fatalf("FailLocal second lease: %v %v", b, err)
	}
	c, wait, err := local.TryAcquire(ctx)
	if err != nil || c != nil || wait <= 59*time.Second || wait > time.Minute {
		t.Fatalf("FailLocal third lease of a share of 2: %v, wait %v, %v; want none, ~1m", c, wait, err)
	}
	if err := a.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx); err != nil { // twice: a no-op
		t.Fatal(err)
	}
	c, _, err = local.TryAcquire(ctx)
	if err != nil || c == nil {
		t.Fatalf("FailLocal lease after a release: %v %v", c, err)
	}
	if err := c.Hold(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Hold of a local lease: %v", err)
	}
	if localLeases != 3 {
		t.Fatalf("FailLocal: %d leases granted locally, want 3", localLeases)
	}
}

// The breaker spares Redis only the calls the failure policy can decide: a give-back, a
// lease's extension and release need Redis whatever the policy, so they go to it while
// the breaker is open (a failed call of the key moments before: a blip, a caller's
// deadline passed as its reply came). Skipped, a booking given back stayed booked and a
// released lease held its slot for its TTL, and nothing reported it.
func TestBreakerLeavesGiveBacksToRedis(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, p := range []FailurePolicy{FailOpen, FailLocal(2)} {
			var cancelled, redisErrors atomic.Int32
			hooks := Hooks{
				Cancelled:  func(string, int) { cancelled.Add(1) },
				RedisError: func(string, error) { redisErrors.Add(1) },
			}
			key := "breaker-" + p.String()
			l, err := New(b.Client, key, PerHour(1), WithKeyPrefix(b.Prefix), WithFailurePolicy(p), WithHooks(hooks))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			r, err := l.Reserve(ctx, 1, 2*time.Hour)
			if err != nil || !r.OK() || r.Delay() <= 0 {
				t.Fatalf("%v: Reserve: %v %v, want a booking ahead", p, r, err)
			}
			s, err := NewSemaphore(b.Client, key+"-sem", 1, WithKeyPrefix(b.Prefix), WithFailurePolicy(p))
			if err != nil {
				t.Fatal(err)
			}
			lease := mustTry(t, s)

			openBreaker(l.client().key(l.t.tag))
			openBreaker(s.client().key(s.t.tag))
			if err := r.Cancel(ctx); err != nil {
				t.Errorf("%v: Cancel with the breaker open: %v, want the booking given back", p, err)
			}
			if err := lease.Extend(ctx); err != nil {
				t.Errorf("%v: Extend with the breaker open: %v, want the lease renewed", p, err)
			}
			if err := lease.Release(ctx); err != nil {
				t.Errorf("%v: Release with the breaker open: %v, want the slot freed", p, err)
			}
			if n := cancelled.Load(); n != 1 {
				t.Errorf("%v: %d Cancelled hook calls, want 1", p, n)
			}
			if n := redisErrors.Load(); n != 0 {
				t.Errorf("%v: %d RedisError hook calls, want none", p, n)
			}
			st, err := s.Inspect(ctx)
			if err != nil || st.Held != 0 {
				t.Errorf("%v: after the release: %d leases held (%v), want none", p, st.Held, err)
			}
		}
	})
}

// openBreaker opens the key's breaker for an hour, as failures would for a while.
func openBreaker(ks *keyState) {
	ks.breaker.mu.Lock()
	ks.breaker.downUntil, ks.breaker.backoff = time.Now().Add(time.Hour), breakerMax
	ks.breaker.mu.Unlock()
}
