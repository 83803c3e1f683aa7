package throttle

import (
	"context"
	"errors"
	"sync"
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
	if s := l.Stats(); s.FailedOpen != 6 || degraded != 6 {
		t.Fatalf("stats %+v, hook calls %d; want 6 each", s, degraded)
	}
}

// FailLocal keeps each process to its share with the sliding window's exactness, and
// books ahead locally; without Redis it never grants more than the share in a period.
func TestFailLocalEnforcesTheShare(t *testing.T) {
	l, err := New(downClient(t), "local", Limit{Rate: 40, Period: 200 * ms}, WithFailurePolicy(FailLocal(4)))
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
	if s := l.Stats(); s.Local < 30 {
		t.Fatalf("stats %+v, want >= 30 local decisions", s)
	}
	// the share can never grant more than 10 at once
	if _, err := l.AllowN(ctx, 11); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("AllowN(11) above the share: %v, want ErrUnavailable", err)
	}
}

// When Redis comes back, decisions go back to it within the breaker's longest quiet time.
func TestFailLocalGoesBackToRedis(t *testing.T) {
	s, err := redistest.StartServer()
	if err != nil {
		t.Skipf("no redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr, MaxRetries: -1, DialTimeout: 100 * ms})
	defer c.Close()
	l, err := New(c, "back", PerSecond(1000), WithFailurePolicy(FailLocal(2)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Allow(ctx); err != nil || l.Stats().Local != 0 {
		t.Fatalf("with Redis up: %v, %+v", err, l.Stats())
	}
	s.Kill()
	if _, err := l.Allow(ctx); err != nil || l.Stats().Local != 1 {
		t.Fatalf("with Redis down: %v, %+v", err, l.Stats())
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	back := time.Now()
	for {
		before := l.Stats().Local
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		if l.Stats().Local == before {
			break // Redis decided
		}
		if time.Since(back) > 2*time.Second {
			t.Fatal("still deciding locally 2s after Redis came back")
		}
		time.Sleep(10 * ms)
	}
	t.Logf("back to Redis %v after it returned", time.Since(back).Round(time.Millisecond))
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

	var degraded int
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
	if s := open.Stats(); s.FailedOpen != 3 || degraded != 3 {
		t.Fatalf("FailOpen stats %+v, hook calls %d; want 3", s, degraded)
	}

	local, err := NewSemaphore(downClient(t), "sem", 4, WithFailurePolicy(FailLocal(2)), WithLeaseTTL(time.Minute))
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
	if s := local.Stats(); s.Local != 3 {
		t.Fatalf("FailLocal stats %+v, want 3 local leases", s)
	}
}
