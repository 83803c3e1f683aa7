package throttle

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Limiters and Semaphores are handles: those of a process on one Redis client and key
// share what the process knows of the key (client.go), however often they are built;
// that state goes once nothing of it matters, and a client with nothing left goes too.

// sendSweep runs c's sweep now, as its timer would after sweepEvery: the seam that
// lets a test see the sweep's bound (a key idle for two sweeps is dropped) without
// waiting minutes.
func sendSweep(c *client) {
	c.mu.Lock()
	if c.sweep != nil {
		c.sweep.Stop()
	}
	c.mu.Unlock()
	c.sweepIdle()
}

// sendKeys returns how many keys c keeps state for.
func sendKeys(c *client) int {
	n := 0
	c.keys.Range(func(any, any) bool { n++; return true })
	return n
}

// sendRegistered reports whether c is the client this process uses for rdb.
func sendRegistered(rdb redis.UniversalClient, c *client) bool {
	v, ok := clients.Load(rdb)
	return ok && v.(*client) == c
}

// A Limiter built per call keeps FailLocal's share: with Redis unreachable, FailLocal(1)
// and 5 per minute, 20 calls at one instant, each on a new Limiter with a garbage
// collection in between, grant 5; a Limiter of another configuration on the key has a
// share of its own.
func TestLimiterPerCallKeepsTheLocalShare(t *testing.T) {
	rdb := downClient(t)
	t.Cleanup(clock.Set(stillClock{time.Unix(1_700_000_000, 0)}))
	ctx := context.Background()
	granted := 0
	for i := range 20 {
		l, err := New(rdb, "percall", PerMinute(5), WithFailurePolicy(FailLocal(1)))
		if err != nil {
			t.Fatal(err)
		}
		res, err := l.Allow(ctx)
		if err != nil {
			t.Fatalf("call %d: got %v, want a local decision", i, err)
		}
		if res.Allowed {
			granted++
		}
		runtime.GC()
	}
	if granted != 5 {
		t.Fatalf("%d of 20 calls granted on Limiters built per call, want 5 (the share)", granted)
	}
	l, err := New(rdb, "percall", PerMinute(5), WithFailurePolicy(FailLocal(1)))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := l.Allow(ctx); err != nil || res.Allowed {
		t.Fatalf("a Limiter built after 20 calls: got %+v, %v; want a denial (the share spent)", res, err)
	}
	other, err := New(rdb, "percall", PerMinute(6), WithFailurePolicy(FailLocal(1)))
	if err != nil {
		t.Fatal(err)
	}
	if res, err := other.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("another limit on the key: got %+v, %v; want a grant from its own share", res, err)
	}
}

// The same for a Semaphore: a lease granted locally holds its slot while a Semaphore
// built per call asks again.
func TestSemaphorePerCallKeepsTheLocalShare(t *testing.T) {
	rdb := downClient(t)
	ctx := context.Background()
	granted := 0
	for range 4 {
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

// A key's state goes once the key has been idle for two sweeps and nothing of it
// matters (here: nothing ever did); a key in use stays. Once every key has gone and
// no handle of the client is left, the client goes too.
func TestIdleStateIsDropped(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	c := func() *client {
		lims := make([]*Limiter, 100)
		for i := range lims {
			l, err := New(b.Client, "idle-"+itoa(i), PerSecond(5), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := l.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			lims[i] = l
		}
		c := lims[0].client()
		if n := sendKeys(c); n != 100 {
			t.Fatalf("state of %d keys after 100 keys were used, want 100", n)
		}
		sendSweep(c) // used since the last sweep: kept
		if _, err := lims[7].Allow(ctx); err != nil {
			t.Fatal(err)
		}
		sendSweep(c) // idle for a whole sweep: dropped, but the key used since
		if n := sendKeys(c); n != 1 {
			t.Fatalf("state of %d keys after two sweeps, one key used between them, want 1", n)
		}
		sendSweep(c)
		if n := sendKeys(c); n != 0 {
			t.Fatalf("state of %d keys after three sweeps, want 0", n)
		}
		return c
	}()
	// the Limiters are gone: nothing holds the client but the process
	for deadline := time.Now().Add(signalWait); sendRegistered(b.Client, c); {
		if time.Now().After(deadline) {
			t.Fatalf("the client of no key and no Limiter is still kept after %v of collections and sweeps", signalWait)
		}
		runtime.GC()
		sendSweep(c)
		time.Sleep(time.Millisecond)
	}
}

// A local grant keeps its key's state while it counts (its window), so that a Limiter
// built meanwhile finds it; the state goes at the first sweeps after that.
func TestLocalGrantKeepsItsState(t *testing.T) {
	rdb := downClient(t)
	ctx := context.Background()
	const window = 50 * ms
	newLimiter := func() *Limiter {
		l, err := New(rdb, "kept", Limit{Rate: 1, Period: window}, WithFailurePolicy(FailLocal(1)))
		if err != nil {
			t.Fatal(err)
		}
		return l
	}
	t.Cleanup(clock.Set(stillClock{time.Unix(1_700_000_000, 0)})) // the local log's clock stands still
	l := newLimiter()
	if res, err := l.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("the first local call: got %+v, %v; want a grant", res, err)
	}
	c := l.client()
	sendSweep(c)
	sendSweep(c)
	if res, err := newLimiter().Allow(ctx); err != nil || res.Allowed {
		t.Fatalf("after two sweeps, a new Limiter: got %+v, %v; want denied (the grant still counts)", res, err)
	}
	// the grant's window and the breaker's quiet time (250ms after its first failure)
	// pass in real time
	time.Sleep(breakerFirst + window)
	sendSweep(c)
	sendSweep(c)
	if n := sendKeys(c); n != 0 {
		t.Fatalf("state of %d keys once the grant's window and the breaker's quiet time passed, want 0", n)
	}
}

// A Limiter built before its key's state and its client were dropped, and one built
// after, share the state: a handle's client stays the process's client for its Redis
// client while any handle of it lives, and the state a handle finds is the key's.
func TestHandlesShareStateAcrossSweeps(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	early, err := New(b.Client, "handles", PerSecond(5), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := early.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the key idle: its state goes, and nothing is left of the client but the handle
		sendSweep(early.client())
	}
	if _, err := early.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	late, err := New(b.Client, "handles", PerSecond(5), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := late.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	if early.client() != late.client() || early.client().key(early.t.tag) != late.client().key(late.t.tag) {
		t.Fatalf("a Limiter built before its client's sweeps and one built after: clients %p and %p; want one client and one key state",
			early.client(), late.client())
	}
	// and a Pause of one holds the other's waiters
	if err := early.Pause(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, held, err := late.client().key(late.t.tag).pass(short); !held && err == nil {
		t.Fatal("the other Limiter's Wait would pass a hold on its key, want it held")
	}
}
