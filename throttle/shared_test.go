package throttle

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"
)

// entries counts the shared limiter states whose key's hash tag contains text.
func entries(text string) int {
	limiterStates.mu.Lock()
	defer limiterStates.mu.Unlock()
	n := 0
	for k := range limiterStates.m {
		if strings.Contains(k.tag, text) {
			n++
		}
	}
	return n
}

// collected runs the garbage collector until no shared state of text is left, for at
// most 10s (cleanups run on their own goroutine after a collection; one round
// usually suffices, the bound is for a busy machine).
func collected(t *testing.T, text string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for entries(text) > 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%d shared states of %q left after 10s of garbage collections", entries(text), text)
		}
		runtime.GC()
		time.Sleep(time.Millisecond)
	}
}

// A Limiter built per call keeps FailLocal's share: with Redis unreachable, FailLocal(1)
// and 5 per minute, 20 calls at one instant, each on a new Limiter with a garbage
// collection in between, grant 5. (Each Limiter had its own log before: all 20 passed.)
// A grant pins the shared state for twice its period of wall time; a minute leaves any
// machine time enough for the 20 calls.
func TestLimiterPerCallKeepsTheLocalShare(t *testing.T) {
	rdb := downClient(t)
	clock := stillClock{time.Unix(1_700_000_000, 0)}
	ctx := context.Background()
	granted := 0
	for i := 0; i < 20; i++ {
		l, err := New(rdb, "percall", PerMinute(5), WithFailurePolicy(FailLocal(1)), withClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		res, err := l.Allow(ctx)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if res.Allowed {
			granted++
		}
		runtime.GC()
	}
	if granted != 5 {
		t.Fatalf("%d of 20 calls granted on Limiters built per call, want 5 (the share)", granted)
	}
	l, err := New(rdb, "percall", PerMinute(5), WithFailurePolicy(FailLocal(1)), withClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Local != 20 {
		t.Fatalf("Stats().Local = %d on a Limiter built after 20 local decisions, want 20", s.Local)
	}
	// a Limiter of another configuration on the same key has a share of its own
	other, err := New(rdb, "percall", PerMinute(6), WithFailurePolicy(FailLocal(1)), withClock(clock))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("another limit on the key: %+v, %v; want a grant from its own share", res, err)
	}
}

// The same for a Semaphore: a lease granted locally holds its slot while a Semaphore
// built per call asks again.
func TestSemaphorePerCallKeepsTheLocalShare(t *testing.T) {
	rdb := downClient(t)
	ctx := context.Background()
	granted := 0
	for i := 0; i < 4; i++ {
		s, err := NewSemaphore(rdb, "semcall", 4, WithFailurePolicy(FailLocal(2)), WithLeaseTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		l, _, err := s.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if l != nil { // dropped unreleased: it holds its slot for its TTL
			granted++
		}
		runtime.GC()
	}
	if granted != 2 {
		t.Fatalf("%d of 4 leases granted on Semaphores built per call, want 2 (max 4 / fleet 2)", granted)
	}
}

// Shared state is reclaimed: the states of Limiters no longer used go with the garbage
// collector, at once when they hold nothing that matters, after their last local grant
// has left its window when they do; until then a Limiter built again finds it.
func TestSharedStateIsReclaimed(t *testing.T) {
	rdb := downClient(t)
	for i := 0; i < 100; i++ {
		if _, err := New(rdb, "reclaim-"+itoa(i), PerSecond(5)); err != nil {
			t.Fatal(err)
		}
	}
	if n := entries("reclaim-"); n != 100 {
		t.Fatalf("%d shared states for 100 keys", n)
	}
	collected(t, "reclaim-")

	// a local grant pins its state for its period (a minute here: no machine is that slow)
	ctx := context.Background()
	clock := stillClock{time.Unix(1_700_000_000, 0)}
	newPinned := func() *Limiter {
		l, err := New(rdb, "pinned", PerMinute(1), WithFailurePolicy(FailLocal(1)), withClock(clock))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	if res, err := newPinned().Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("first local call: %+v, %v", res, err)
	}
	runtime.GC()
	runtime.GC()
	if res, err := newPinned().Allow(ctx); err != nil || res.Allowed {
		t.Fatalf("after a collection, a new Limiter: %+v, %v; want denied (the grant still counts)", res, err)
	}

	// and goes when its grants have left their window (20ms, pinned for twice that)
	short, err := New(rdb, "short", Limit{Rate: 1, Period: 20 * ms}, WithFailurePolicy(FailLocal(1)))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := short.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("short: %+v, %v", res, err)
	}
	collected(t, "short") // short is not used after Allow: only the pin holds the state
}
