package throttle

import (
	"context"
	"runtime"
	"strings"
	"testing"
	"time"

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
	setGoClock(t, stillClock{time.Unix(1_700_000_000, 0)})
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
	setGoClock(t, stillClock{time.Unix(1_700_000_000, 0)}) // the local log's clock stands still
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
	if _, held, err := late.client().key(late.t.tag).pass(short, late); !held && err == nil {
		t.Fatal("the other Limiter's Wait would pass a hold on its key, want it held")
	}
}

// Go-redis clients used and closed leave nothing behind: 150 clients (60 on the
// cluster), a third used for Allow, a third for a Wait asleep on its booking, a third
// for an Acquire queued for a slot, each closed at once after its call was cancelled
// (the subscription its waiter opened still lingering). Asserted: none of them is
// still registered, and every goroutine they started has ended (go-redis's
// subscription health check among them), after the sweeps two minutes hold (run here
// by hand, sweepEvery being what the timers would wait). Reported: what is left once
// they are closed, before any sweep (a subscription ends with its client, but go-redis
// keeps one open that it was dialling as the client closed, and its cluster client
// leaves them open: the sweep closes those); the heap they leave, beside what as many
// go-redis clients used without the library leave.
func TestClosedClientsLeaveNothing(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		addrs, cluster := b.Addrs()
		n := 150
		if cluster {
			n = 60
		}
		ctx := context.Background()
		if err := b.Client.Ping(ctx).Err(); err != nil { // the test's own connection, counted before
			t.Fatal(err)
		}
		runtime.GC()
		goroutines, heap := runtime.NumGoroutine(), heapInUse()
		var rdbs []redis.UniversalClient
		for i := range n {
			rdb := redistest.Dial(addrs, cluster)
			rdbs = append(rdbs, rdb)
			key := "churn-" + itoa(i)
			switch i % 3 {
			case 0:
				l := churnLimiter(t, rdb, b.Prefix, key)
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			case 1: // a Wait asleep on a booking an hour ahead, cancelled
				l := churnLimiter(t, rdb, b.Prefix, key)
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
				wctx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { done <- l.Wait(wctx) }()
				sendEventually(t, signalWait, "the Wait asleep", func() bool { return sendSleepers(l) == 1 })
				cancel()
				<-done
			case 2: // an Acquire queued behind a held lease, cancelled
				s, err := NewSemaphore(rdb, key, 1, WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				mustTry(t, s)
				actx, cancel := context.WithCancel(ctx)
				done := make(chan error, 1)
				go func() { _, err := s.Acquire(actx); done <- err }()
				sendEventually(t, signalWait, "the Acquire queued", func() bool {
					return b.Client.ZCard(ctx, s.t.keys[1]).Val() == 1
				})
				cancel()
				<-done
			}
			if err := rdb.Close(); err != nil {
				t.Fatal(err)
			}
		}
		left := func() int {
			runtime.GC()
			return runtime.NumGoroutine() - goroutines
		}
		settled := func(d time.Duration) int { // goroutines left once those ending end
			for deadline := time.Now().Add(d); left() > 0 && time.Now().Before(deadline); {
				time.Sleep(10 * ms)
			}
			return max(0, left())
		}
		registered := func() (k int, cs []*client) {
			for _, rdb := range rdbs {
				if v, ok := clients.Load(rdb); ok {
					k++
					cs = append(cs, v.(*client))
				}
			}
			return k, cs
		}
		closedLeft := settled(time.Second)
		atClose, cs := registered()
		sweeps := int(2 * time.Minute / sweepEvery)
		for range sweeps {
			for _, c := range cs {
				sendSweep(c)
			}
		}
		after, _ := registered()
		sweptLeft := settled(signalWait)
		rdbs, cs = nil, nil
		runtime.GC()
		runtime.GC() // go-redis's buffer pools
		retained := heapInUse() - heap
		heap = heapInUse() // go-redis's own: as many clients used for a PING and closed
		for range n {
			rdb := redistest.Dial(addrs, cluster)
			_ = rdb.Ping(ctx).Err()
			_ = rdb.Close()
		}
		runtime.GC()
		runtime.GC()
		redistest.Figure(t, "%d clients used and closed: %d goroutines and %d clients left once closed; after the %d sweeps of 2 minutes %d and %d; heap %+d kB (as many bare go-redis clients: %+d kB)",
			n, closedLeft, atClose, sweeps, sweptLeft, after, retained/1024, (heapInUse()-heap)/1024)
		if sweptLeft > 0 {
			t.Errorf("%d goroutines more than before %d clients were used and closed, want none:\n%s", sweptLeft, n, churnStacks())
		}
		if after > 0 {
			t.Errorf("%d of %d closed clients still registered after %d sweeps, want none", after, n, sweeps)
		}
	})
}

// churnLimiter returns a limiter of one permit an hour on key.
func churnLimiter(t *testing.T, rdb redis.UniversalClient, prefix, key string) *Limiter {
	t.Helper()
	l, err := New(rdb, key, PerHour(1), WithKeyPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// heapInUse returns the bytes of the heap's objects (after a collection: those live).
func heapInUse() int64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// churnStacks returns the stacks of the goroutines that run go-redis or this package's
// code, for a test's failure message.
func churnStacks() string {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "go-redis") || strings.Contains(g, "jobthrottle/throttle.") && !strings.Contains(g, "testing.tRunner") {
			out = append(out, g)
		}
	}
	if len(out) > 5 {
		out = append(out[:5], "…")
	}
	return strings.Join(out, "\n\n")
}
