package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// eventually polls cond every millisecond for up to d.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// placesQueued returns how many places the semaphore's queue holds.
func placesQueued(t *testing.T, b *redistest.Backend, s *Semaphore) int {
	t.Helper()
	n, err := b.Client.ZCard(context.Background(), s.t.keys[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	return int(n)
}

func TestNewSemaphoreRejectsBadInput(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}) // never contacted
	defer rdb.Close()
	var nilClient *redis.Client
	cases := []struct {
		name string
		rdb  redis.UniversalClient
		key  string
		max  int
		opts []SemaphoreOption
		want error
	}{
		{"nil client", nil, "k", 1, nil, ErrNilClient},
		{"typed nil client", nilClient, "k", 1, nil, ErrNilClient},
		{"empty key", rdb, "", 1, nil, ErrInvalidKey},
		{"empty hash tag", rdb, "}k", 1, []SemaphoreOption{WithKeyPrefix("")}, ErrInvalidKey},
		{"max 0", rdb, "k", 0, nil, ErrInvalidLimit},
		{"max -1", rdb, "k", -1, nil, ErrInvalidLimit},
		{"max above 10^9", rdb, "k", 1_000_000_001, nil, ErrInvalidLimit},
		{"TTL 0", rdb, "k", 1, []SemaphoreOption{WithLeaseTTL(0)}, ErrInvalidArgument},
		{"TTL negative", rdb, "k", 1, []SemaphoreOption{WithLeaseTTL(-time.Second)}, ErrInvalidArgument},
		{"TTL below 1ms", rdb, "k", 1, []SemaphoreOption{WithLeaseTTL(999 * time.Microsecond)}, ErrInvalidArgument},
		{"TTL above 2^45µs", rdb, "k", 1, []SemaphoreOption{WithLeaseTTL((1<<45 + 1) * time.Microsecond)}, ErrInvalidArgument},
	}
	for _, c := range cases {
		s, err := NewSemaphore(c.rdb, c.key, c.max, c.opts...)
		if !errors.Is(err, c.want) || s != nil {
			t.Errorf("%s: NewSemaphore = %v, %v; want an error wrapping %v", c.name, s, err, c.want)
		}
	}
	// the defaults show (a Limiter's options do not compile here: see options_test.go)
	s, err := NewSemaphore(rdb, "k", 7)
	if err != nil {
		t.Fatal(err)
	}
	if s.Key() != "k" || s.Max() != 7 || s.ttl != 30*time.Second {
		t.Fatalf("Key %q Max %d lease TTL %v; want k 7 30s", s.Key(), s.Max(), s.ttl)
	}
	if _, err := NewSemaphore(rdb, "k", 1, WithLeaseTTL(time.Millisecond)); err != nil {
		t.Fatalf("WithLeaseTTL(1ms): %v", err)
	}
}

// The script checks its arguments before it writes anything, and reports state it did
// not write.
func TestSemaphoreScriptRejectsBadArguments(t *testing.T) {
	id := strings.Repeat("ab", 16)
	cases := []struct {
		name string
		args []any
	}{
		{"op", []any{1, 4, id, id, 0, 1, 1000}},
		{"short token", []any{1, 0, "abc", id, 0, 1, 1000}},
		{"upper-case token", []any{1, 0, strings.ToUpper(id), id, 0, 1, 1000}},
		{"token with a colon", []any{1, 0, id[:31] + ":", id, 0, 1, 1000}},
		{"no place to acquire in", []any{1, 0, id, "", 0, 1, 1000}},
		{"place with a space", []any{1, 0, id, "a b", 0, 1, 1000}},
		{"max 0", []any{1, 0, id, id, 0, 0, 1000}},
		{"max 1e3", []any{1, 0, id, id, 0, "1e3", 1000}},
		{"ttl below 1ms", []any{1, 0, id, id, 0, 1, 999}},
		{"join 2", []any{1, 0, id, id, 2, 1, 1000}},
		{"join on extend", []any{1, 1, id, id, 1, 1, 1000}},
		{"argument count", []any{1, 0, id, id, 0, 1}},
		{"extra argument", []any{1, 0, id, id, 0, 1, 1000, 0}},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		s, err := NewSemaphore(b.Client, "args", 1, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cases {
			v, err := b.Client.Eval(ctx, semaphoreScript.src, s.t.keys, c.args...).Result()
			if err == nil { // a request's error is its reply: -1, code, at, len, then the text
				var f failed
				if r, ok := v.([]any); ok && len(r) >= protocol.Width && r[0] == int64(-1) {
					f.code = int(r[1].(int64))
					for _, x := range r[protocol.Width:] {
						f.text += string(rune(x.(int64)))
					}
				}
				err = &f
			}
			if !strings.Contains(err.Error(), "JTARG") {
				t.Errorf("%s: got %v, want a JTARG error", c.name, err)
			}
			if !errors.Is(scriptError(ctx, "args", err), ErrInvalidArgument) {
				t.Errorf("%s: %v does not map to ErrInvalidArgument", c.name, err)
			}
		}
		if n := keysUnder(t, b); n != 0 {
			t.Fatalf("bad arguments wrote %d keys", n)
		}
		// a key of another type
		if err := b.Client.Set(ctx, s.t.keys[0], "x", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.TryAcquire(ctx); !errors.Is(err, ErrCorruptState) {
			t.Fatalf("TryAcquire on a string key: %v, want ErrCorruptState", err)
		}
	})
}

// Up to max leases are granted at once; then TryAcquire gets the exact time until the
// earliest lease expires. Extending moves a lease's expiry, expired leases free their
// slot, and a released lease frees it at once.
func TestSemaphoreTryAcquireWaitsForEarliestExpiry(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("try", 3, WithLeaseTTL(10*time.Second))
		a := mustTry(t, s) // t0: expires t0+10s
		tl.at(time.Second)
		bl := mustTry(t, s) // expires t0+11s
		tl.at(2 * time.Second)
		c := mustTry(t, s) // expires t0+12s
		tl.at(2500 * ms)
		wantDenied(t, s, 7500*ms) // a expires at t0+10s
		tl.at(3 * time.Second)
		if err := a.Extend(ctx); err != nil { // now expires t0+13s
			t.Fatal(err)
		}
		wantDenied(t, s, 8*time.Second) // b (t0+11s) is the earliest now
		tl.at(11 * time.Second)
		d := mustTry(t, s)            // b expired: its slot is free
		wantDenied(t, s, time.Second) // c expires at t0+12s
		if err := bl.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Extend of an expired lease: %v, want ErrLeaseLost", err)
		}
		if err := bl.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release of a stale lease: %v, want ErrLeaseLost", err)
		}
		wantDenied(t, s, time.Second) // the stale release freed nothing
		if err := c.Release(ctx); err != nil {
			t.Fatal(err)
		}
		e := mustTry(t, s) // c's slot at once
		if err := c.Release(ctx); err != nil {
			t.Fatalf("second Release: %v, want nil", err)
		}
		wantDenied(t, s, 2*time.Second) // the double release freed nothing; a expires t0+13s
		if err := c.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Extend of a released lease: %v, want ErrLeaseLost", err)
		}
		for _, l := range []*Lease{a, d, e} {
			if len(l.ID()) != 32 || strings.Trim(l.ID(), "0123456789abcdef") != "" {
				t.Fatalf("lease id %q is not 32 hex digits", l.ID())
			}
		}
		if a.ID() == d.ID() || d.ID() == e.ID() {
			t.Fatal("lease ids repeat")
		}
		held, err := b.Client.ZCard(ctx, s.t.keys[0]).Result()
		if err != nil || held != 3 {
			t.Fatalf("leases in Redis: %d, %v; want 3", held, err)
		}
	})
}

// Waiters are served in arrival order, each handed the slot by the release that frees
// it; a caller that comes later does not overtake them.
func TestSemaphoreQueueIsFirstComeFirstServed(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("fifo", 1, WithLeaseTTL(time.Minute))
		holder := mustTry(t, s)
		type got struct {
			who   int
			lease *Lease
			err   error
		}
		served := make(chan got, 3)
		for i := 1; i <= 3; i++ {
			go func() {
				l, err := s.Acquire(ctx)
				served <- got{i, l, err}
			}()
			eventually(t, 5*time.Second, fmt.Sprintf("waiter %d queued", i), func() bool { return placesQueued(t, b, s) == i })
		}
		wantDenied(t, s, time.Minute) // behind the holder and three waiters
		prev := holder
		for i := 1; i <= 3; i++ {
			if err := prev.Release(ctx); err != nil {
				t.Fatal(err)
			}
			wantDenied(t, s, time.Minute) // the slot went to the waiter, not to us
			g := <-served
			if g.err != nil || g.who != i {
				t.Fatalf("served waiter %d (%v), want waiter %d", g.who, g.err, i)
			}
			prev = g.lease
		}
		if err := prev.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := keysUnder(t, b); n != 0 {
			t.Fatalf("%d keys left after every lease was released", n)
		}
	})
}

// A blocked Acquire wakes on the release that frees a slot, not at the lease's expiry
// nor on its own timer: with a lease TTL of 3 minutes the waiter's timer fires after
// TTL/3 = 1 minute, so a waiter that has its lease within signalWait of the release
// was woken by it (the lag is logged: a pub/sub notice takes well under a millisecond
// on 127.0.0.1).
func TestSemaphoreReleaseWakesWaiter(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		s, err := NewSemaphore(b.Client, "wake", 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(3*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		for round := 0; round < 3; round++ { // the first round also opens the subscription
			holder := mustTry(t, s)
			woke := make(chan time.Time, 1)
			var lease *Lease
			go func() {
				l, err := s.Acquire(ctx)
				if err != nil {
					t.Error(err)
				}
				lease = l
				woke <- time.Now()
			}()
			eventually(t, 5*time.Second, "waiter queued", func() bool { return placesQueued(t, b, s) == 1 })
			time.Sleep(20 * time.Millisecond)
			released := time.Now()
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
			select {
			case at := <-woke:
				t.Logf("round %d: waiter had its lease %v after the release", round, at.Sub(released))
			case <-time.After(signalWait):
				t.Fatalf("waiter still blocked %v after the release (its own timer: 1m)", signalWait)
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}

// A Resume wakes a waiter that a pause held back: a slot freed during the pause goes to
// it at once, not at its own timer (here TTL/3, a minute).
func TestSemaphoreResumeWakesWaiter(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		lim, got := heldByAPause(t, b, "resume", 10*time.Minute)
		select {
		case <-got:
			t.Fatal("the waiter had a lease while the key was paused")
		case <-time.After(20 * time.Millisecond):
		}
		resumed := time.Now()
		if err := lim.Resume(context.Background()); err != nil {
			t.Fatal(err)
		}
		leaseComes(t, got, "after the resume", resumed)
	})
}

// A pause that ends by itself wakes a waiter it held back: a slot released during the
// pause goes to it when the pause ends, not at its own timer (here TTL/3, a minute).
func TestSemaphorePauseEndWakesWaiter(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		_, got := heldByAPause(t, b, "pauseend", 200*time.Millisecond)
		leaseComes(t, got, "after a pause of 200ms", time.Now())
	})
}

// acquired is what a waiting Acquire returned.
type acquired struct {
	l   *Lease
	err error
}

// heldByAPause queues a waiter on a semaphore of max 1 (lease TTL 3m) under key, then
// pauses the key for d through a limiter on it and releases the slot's holder: the pause
// keeps the slot from the waiter. It returns the limiter and the waiter's outcome; the
// waiter's context ends with the test.
func heldByAPause(t *testing.T, b *redistest.Backend, key string, d time.Duration) (*Limiter, <-chan acquired) {
	t.Helper()
	ctx := context.Background()
	s, err := NewSemaphore(b.Client, key, 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(3*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lim, err := New(b.Client, key, PerSecond(1), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	holder := mustTry(t, s)
	actx, cancel := context.WithCancel(ctx)
	got := make(chan acquired, 1)
	go func() {
		l, err := s.Acquire(actx)
		got <- acquired{l, err}
	}()
	t.Cleanup(cancel)
	eventually(t, 5*time.Second, "waiter queued", func() bool { return placesQueued(t, b, s) == 1 })
	if err := lim.Pause(ctx, d); err != nil {
		t.Fatal(err)
	}
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	return lim, got
}

// leaseComes fails t unless the waiter has its lease within signalWait (its own timer
// is a minute); since is when what should wake it happened.
func leaseComes(t *testing.T, got <-chan acquired, what string, since time.Time) {
	t.Helper()
	select {
	case a := <-got:
		if a.err != nil {
			t.Fatal(a.err)
		}
		t.Logf("waiter had its lease %v %s", time.Since(since), what)
		if err := a.l.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	case <-time.After(signalWait):
		t.Fatalf("waiter still blocked %v %s (its own timer: 1m)", signalWait, what)
	}
}

// A waiter whose context ends gives its place back (in the background): nothing is
// left queued and the next release does not go to it.
func TestSemaphoreAcquireHonoursContext(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		s := tl.semaphore("ctx", 1, WithLeaseTTL(time.Minute))
		holder := mustTry(t, s)
		done, cancel := context.WithCancel(context.Background())
		cancel()
		if l, err := s.Acquire(done); l != nil || !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire(done ctx) = %v, %v; want context.Canceled", l, err)
		}
		ctx, stop := context.WithTimeout(context.Background(), 50*ms)
		defer stop()
		start := time.Now()
		if l, err := s.Acquire(ctx); l != nil || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire = %v, %v; want context.DeadlineExceeded", l, err)
		}
		if took := time.Since(start); took > signalWait { // the lease it waits on lasts a minute
			t.Fatalf("Acquire returned %v after its 50ms deadline", took)
		}
		// its place goes back in the background
		sendEventually(t, signalWait, "the place given back", func() bool { return placesQueued(t, b, s) == 0 })
		if err := holder.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		mustTry(t, s) // the slot was not handed to the waiter that left
	})
}

// Every key the semaphore writes has a TTL: leases, the queue and its expiries.
func TestSemaphoreKeysExpire(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		s := tl.semaphore("ttl", 1, WithLeaseTTL(time.Minute))
		holder := mustTry(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		waiting := make(chan error, 1)
		go func() { _, err := s.Acquire(ctx); waiting <- err }()
		eventually(t, 5*time.Second, "waiter queued", func() bool { return placesQueued(t, b, s) == 1 })
		seen := map[string]bool{}
		for _, k := range scanKeys(t, b) {
			pttl, err := b.Client.PTTL(context.Background(), k).Result()
			if err != nil || pttl <= 0 {
				t.Errorf("key %s: PTTL %v, %v; want > 0", k, pttl, err)
			}
			seen[k[strings.LastIndex(k, "}")+1:]] = true
		}
		for _, suffix := range []string{":sem", ":semq", ":semx"} {
			if !seen[suffix] {
				t.Errorf("key %s not written (saw %v)", suffix, seen)
			}
		}
		cancel()
		if err := <-waiting; !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire: %v", err)
		}
		if err := holder.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The waiter may have left while the reply to the call that queued it was on
		// its way (the test saw the place before the waiter did): that place is given
		// back by the late reply's release, which can run after Acquire returned (seen
		// under load: 1 key left when checked at once). Wait for it, up to 10s.
		eventually(t, 10*time.Second, "keys left with nothing held or queued", func() bool { return keysUnder(t, b) == 0 })
	})
}

// A pause on the key (a Limiter's Pause: the pause is the key's, in its limiter state's
// meta) holds back new leases until it ends, whichever algorithm's state holds it; held
// leases can still be extended and released.
func TestSemaphoreHonoursPause(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("pause", 2, WithLeaseTTL(10*time.Second))
		a := mustTry(t, s)
		if err := tl.limiter("pause", PerSecond(1), WithAlgorithm(alg)).Pause(ctx, 2*time.Second); err != nil {
			t.Fatal(err)
		}
		wantDenied(t, s, 2*time.Second) // a slot is free, but the pause holds
		tl.at(time.Second)
		if err := a.Extend(ctx); err != nil {
			t.Fatalf("Extend while paused: %v", err)
		}
		wantDenied(t, s, time.Second)
		tl.at(2 * time.Second)
		mustTry(t, s)
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// hookClock is the system clock; it calls onLong, if set, whenever a timer of at
// least 10s is made, on the goroutine that makes it.
type hookClock struct{ onLong atomic.Pointer[func()] }

func (c *hookClock) Now() time.Time { return time.Now() }
func (c *hookClock) NewTimer(d time.Duration) clock.Timer {
	if f := c.onLong.Load(); f != nil && d >= 10*time.Second {
		(*f)()
	}
	return clock.System.NewTimer(d)
}

// SemaphoreHooks see grants (with the wait), denials, a waiter giving up, releases
// (with the time held) and a lost lease; with Redis down every call fails at once
// with ErrUnavailable and the RedisError hook.
func TestSemaphoreHooksAndRedisDown(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		var mu sync.Mutex
		var seen []string
		add := func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, fmt.Sprintf(format, args...))
		}
		hooks := SemaphoreHooks{
			Acquired:  func(key string, waited time.Duration) { add("acquired %s waited %v", key, waited > 0) },
			Denied:    func(key string, wait time.Duration) { add("denied %s %v", key, wait) },
			GaveUp:    func(key string) { add("gave up %s", key) },
			Released:  func(key string, held time.Duration) { add("released %s", key) },
			LeaseLost: func(key string) { add("lost %s", key) },
			RedisError: func(key string, err error) {
				if !errors.Is(err, context.Canceled) { // the test's give-up, should a wake-up start a call as it cancels (reported as a Redis error too)
					add("redis error %s", key)
				}
			},
		}
		tl := newTimeline(t, b)
		clk := &hookClock{}
		setGoClock(t, clk)
		s := tl.semaphore("hooks", 1, WithLeaseTTL(time.Minute), WithSemaphoreHooks(hooks))
		ctx := context.Background()
		a := mustTry(t, s)
		wantDenied(t, s, time.Minute)
		released := make(chan struct{}) // a's Release has returned, its hook called
		go func() {
			defer close(released)
			eventually(t, 5*time.Second, "waiter queued", func() bool { return placesQueued(t, b, s) == 1 })
			if err := a.Release(ctx); err != nil {
				t.Error(err)
			}
		}()
		l, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		// gives up once it is known to wait in the queue (a 20ms deadline could pass
		// before the queuing call's reply on a loaded machine: ErrUnavailable, the
		// RedisError hook, no GaveUp): when it sets a renewal timer (TTL/3 = 20s, the
		// only timer that long) with its place in Redis, the queuing call is over, and
		// the cancellation finds it waiting
		wctx, cancel := context.WithCancel(ctx)
		defer cancel()
		giveUp := func() {
			if placesQueued(t, b, s) == 1 {
				cancel()
			}
		}
		clk.onLong.Store(&giveUp)
		if _, err := s.Acquire(wctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire: %v, want context.Canceled", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		l, err = s.Acquire(ctx) // at once: no wait to report
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lost := mustTry(t, s)
		tl.at(2 * time.Minute) // the lease expires unextended
		if err := lost.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Extend of an expired lease: %v, want ErrLeaseLost", err)
		}
		// the waiter can get a's place (a wake-up) before a's Release returns to its
		// goroutine and calls the Released hook: wait for that goroutine
		<-released
		mu.Lock()
		slices.Sort(seen) // the first release (another goroutine) and the handed lease race
		got := strings.Join(seen, "; ")
		mu.Unlock()
		want := "acquired hooks waited false; acquired hooks waited false; acquired hooks waited false; acquired hooks waited true; " +
			"denied hooks 1m0s; gave up hooks; lost hooks; released hooks; released hooks; released hooks"
		if got != want {
			t.Fatalf("hooks saw %q,\nwant %q", got, want)
		}
	})

	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer down.Close()
	var errs atomic.Int64
	s, err := NewSemaphore(down, "down", 1, WithSemaphoreHooks(SemaphoreHooks{RedisError: func(string, error) { errs.Add(1) }}))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if l, _, err := s.TryAcquire(ctx); l != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryAcquire with Redis down: %v, %v; want ErrUnavailable", l, err)
	}
	if l, err := s.Acquire(ctx); l != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Acquire with Redis down: %v, %v; want ErrUnavailable", l, err)
	}
	if err := s.Do(ctx, func(context.Context) error { t.Fatal("fn ran without a lease"); return nil }); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Do with Redis down: %v; want ErrUnavailable", err)
	}
	if errs.Load() != 3 {
		t.Fatalf("RedisError hook called %d times, want 3", errs.Load())
	}
}

// Many goroutines through Do and TryAcquire: never more than max hold at once, and
// max is reached (the first max holders wait for one another, holding: see work).
func TestSemaphoreNeverExceedsMax(t *testing.T) {
	const (
		max     = 4
		workers = 24
		rounds  = 10
	)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		s, err := NewSemaphore(b.Client, "many", max, WithKeyPrefix(b.Prefix), WithLeaseTTL(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		calls := &cmdCount{match: func(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }}
		b.Client.AddHook(calls)
		var holders, peak, done, entered atomic.Int64
		// The first max holders wait, holding, until max hold at once: so max is
		// reached by mechanism, not by how the goroutines happen to be scheduled, and a
		// semaphore that admits fewer than max keeps them waiting. fillBound only ends
		// that wait when it would never end (a pass fills the slots in milliseconds);
		// it is long beside any scheduling delay of the loaded machine.
		const fillBound = 10 * time.Second
		full := make(chan struct{})
		var fillOnce sync.Once
		work := func(ctx context.Context) error {
			n := holders.Add(1)
			defer holders.Add(-1)
			for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
			}
			if n > max {
				return fmt.Errorf("%d holders at once, max %d", n, max)
			}
			if n == max {
				fillOnce.Do(func() { close(full) })
			}
			if entered.Add(1) <= max {
				select {
				case <-full:
				case <-time.After(fillBound):
					return fmt.Errorf("%d holders at once for %v while the other slots were free, want max = %d", holders.Load(), fillBound, max)
				}
			}
			time.Sleep(5 * time.Millisecond) // long beside a script call, so the slots fill
			done.Add(1)
			return nil
		}
		ctx := context.Background()
		var wg sync.WaitGroup
		for w := 0; w < workers; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < rounds; i++ {
					if w%4 == 0 { // some take their chance and come back later
						l, wait, err := s.TryAcquire(ctx)
						if err != nil {
							t.Error(err)
							return
						}
						if l == nil {
							time.Sleep(min(wait, 2*ms))
							continue
						}
						if err := l.Hold(ctx, work); err != nil {
							t.Error(err)
						}
						continue
					}
					if err := s.Do(ctx, work); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
		wg.Wait()
		t.Logf("%d runs, at most %d at once; %.2f script calls per run (acquire, release, TryAcquire retries)",
			done.Load(), peak.Load(), float64(calls.n.Load())/float64(done.Load()))
		if got := peak.Load(); got != max {
			t.Fatalf("at most %d holders at once, want exactly max = %d", got, max)
		}
		if n := keysUnder(t, b); n != 0 {
			t.Fatalf("%d keys left after every lease was released", n)
		}
	})
}

// The kill test runs holders in child processes: this test binary again, told by
// semChildEnv to run TestSemaphoreChildProcess, which reads its orders from the
// environment and reports on stdout, one line per event:
//
//   - <id>    a worker got lease id (printed before it counts itself a holder)
//   - <id>    the worker released it
//     OVER <n>  n holders counted themselves at once, more than max
//     LOST <id> the worker's lease was lost while it held (no renewal in time: Hold
//     cancelled its work, as it must; not a failure)
//     ERR <e>   something failed
//
// A worker counts itself a holder in the set "{<prefix><key>}:holders" while it holds
// (SADD and SCARD in one script, so the count is exact at the server). The script
// first drops the members whose lease is no longer live in the semaphore's lease set
// by the server's clock: a worker whose renewal came late on a loaded machine has lost
// its lease (Hold cancels its context) before it takes itself out of the set, and its
// slot is rightly someone else's. What is counted is what the semaphore promises: at
// most max live leases at once.
const semChildEnv = "JOBTHROTTLE_SEM_CHILD"

var addHolder = redis.NewScript(`local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('SADD', KEYS[1], ARGV[1])
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  local exp = redis.call('ZSCORE', KEYS[2], id)
  if not exp or tonumber(exp) <= now then
    redis.call('SREM', KEYS[1], id)
  end
end
redis.call('PEXPIRE', KEYS[1], 60000)
return redis.call('SCARD', KEYS[1])`)

func TestSemaphoreChildProcess(t *testing.T) {
	if os.Getenv(semChildEnv) == "" {
		t.Skip("helper process of TestSemaphoreHoldersKilled")
	}
	env := func(k string) string { return os.Getenv(semChildEnv + "_" + k) }
	atoi := func(k string) int {
		n, err := strconv.Atoi(env(k))
		if err != nil {
			t.Fatalf("%s: %v", k, err)
		}
		return n
	}
	rdb := redistest.Dial(strings.Split(env("ADDRS"), ","), env("CLUSTER") != "")
	defer rdb.Close()
	prefix, key, max := env("PREFIX"), env("KEY"), atoi("MAX")
	ttl := time.Duration(atoi("TTL_MS")) * time.Millisecond
	s, err := NewSemaphore(rdb, key, max, WithKeyPrefix(prefix), WithLeaseTTL(ttl))
	if err != nil {
		t.Fatal(err)
	}
	holders := "{" + prefix + key + "}:holders"
	leases := s.t.keys[0] // the lease set: id -> expiry, µs
	var mu sync.Mutex
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(os.Stdout, format+"\n", args...)
	}
	ctx, stop := context.WithCancel(context.Background())
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); stop() }() // the parent closes stdin to stop us
	var wg sync.WaitGroup
	for w := 0; w < atoi("WORKERS"); w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewSource(int64(os.Getpid()*100 + w)))
			for ctx.Err() == nil {
				l, err := s.Acquire(ctx)
				if err != nil {
					if ctx.Err() == nil {
						say("ERR acquire: %v", err)
					}
					return
				}
				say("+ %s", l.ID())
				hold := time.Duration(5+rng.Intn(40)) * time.Millisecond
				lost := false
				err = l.Hold(ctx, func(ctx context.Context) error {
					defer func() { lost = errors.Is(context.Cause(ctx), ErrLeaseLost) }()
					n, err := addHolder.Run(ctx, rdb, []string{holders, leases}, l.ID()).Int()
					if err != nil {
						return err
					}
					if n > max {
						say("OVER %d", n)
					}
					select {
					case <-time.After(hold):
					case <-ctx.Done():
					}
					return rdb.SRem(context.WithoutCancel(ctx), holders, l.ID()).Err()
				})
				switch {
				case lost: // its renewals came too late (a starved machine): Hold stopped it
					say("LOST %s", l.ID())
				case err != nil && ctx.Err() == nil:
					say("ERR hold: %v", err)
				}
				say("- %s", l.ID())
			}
		}()
	}
	wg.Wait()
}

// child is one holder process of TestSemaphoreHoldersKilled and what it reported.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	eof   <-chan struct{} // closed when its stdout ends
	mu    sync.Mutex
	held  map[string]bool // lease ids it got and has not reported released
	got   map[string]time.Time
	bad   []string // OVER and ERR lines
}

func startChild(t *testing.T, env []string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestSemaphoreChildProcess$", "-test.count=1", "-test.timeout=60s")
	// without the race detector's 1s pause at exit (a race still fails the child)
	cmd.Env = append(os.Environ(), append(env, "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")...)
	c := &child{cmd: cmd, held: map[string]bool{}, got: map[string]time.Time{}}
	c.stdin, c.eof = startHelperProcess(t, cmd, func(line string) {
		c.mu.Lock()
		defer c.mu.Unlock()
		switch {
		case strings.HasPrefix(line, "+ "):
			c.held[line[2:]] = true
			c.got[line[2:]] = time.Now()
		case strings.HasPrefix(line, "- "):
			delete(c.held, line[2:])
		case strings.HasPrefix(line, "OVER "), strings.HasPrefix(line, "ERR "):
			c.bad = append(c.bad, line)
		}
	})
	return c
}

// Holders in several processes share one semaphore; some processes are killed (-9)
// while they hold leases. Never more than max count themselves holders (checked at the
// server by every holder, and by polling the lease set), the leases the killed held
// lapse within TTL of the kill by Redis's clock and are then taken back, and once
// Redis's clock is 2 TTL past the kill every live lease is a survivor's (a killed
// process's waiters may have been handed slots until their places lapsed, one TTL
// after the kill).
//
// Both timed checks read Redis's clock, not this process's: how late a starved machine
// runs the survivor or this test does not matter. The one tolerance, 50ms of Redis's
// clock, is for a renewal a killed process wrote just before it died that Redis reads
// after the test's TIME call. When the survivor's calls purge the dead leases is
// reported, not asserted (460ms after the kill, TTL 300ms, was seen at load 17).
func TestSemaphoreHoldersKilled(t *testing.T) {
	parallel(t)
	const (
		max      = 4
		ttl      = 300 * ms
		children = 3
		workers  = 4
	)
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		addrs, isCluster := b.Addrs()
		cluster := ""
		if isCluster {
			cluster = "1"
		}
		key := "killed"
		s, err := NewSemaphore(b.Client, key, max, WithKeyPrefix(b.Prefix), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		env := []string{
			semChildEnv + "=1",
			semChildEnv + "_ADDRS=" + strings.Join(addrs, ","),
			semChildEnv + "_CLUSTER=" + cluster,
			semChildEnv + "_PREFIX=" + b.Prefix,
			semChildEnv + "_KEY=" + key,
			semChildEnv + "_MAX=" + strconv.Itoa(max),
			semChildEnv + "_TTL_MS=" + strconv.Itoa(int(ttl/ms)),
			semChildEnv + "_WORKERS=" + strconv.Itoa(workers),
		}
		var kids []*child
		for i := 0; i < children; i++ {
			kids = append(kids, startChild(t, env))
		}

		// watch the lease set: never more than max entries, live or not yet purged
		watching, stopWatch := context.WithCancel(ctx)
		var most atomic.Int64
		watched := make(chan error, 1)
		go func() {
			for watching.Err() == nil {
				n, err := b.Client.ZCard(watching, s.t.keys[0]).Result()
				if err != nil && watching.Err() == nil {
					watched <- err
					return
				}
				if n > most.Load() {
					most.Store(n)
				}
				time.Sleep(time.Millisecond)
			}
			watched <- nil
		}()

		// let them churn for a few TTLs, every child having held a lease
		eventually(t, 20*time.Second, "every child held a lease", func() bool {
			for _, c := range kids {
				c.mu.Lock()
				n := len(c.got)
				c.mu.Unlock()
				if n == 0 {
					return false
				}
			}
			return true
		})
		time.Sleep(3 * ttl)
		eventually(t, 20*time.Second, "the processes to kill hold leases", func() bool {
			n := 0
			for _, c := range kids[:2] {
				c.mu.Lock()
				n += len(c.held)
				c.mu.Unlock()
			}
			return n >= 2
		})

		// kill two of them mid-hold
		var dead []string
		killedAt := time.Now()
		for _, c := range kids[:2] {
			if err := c.cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		for _, c := range kids[:2] {
			<-c.eof
			c.mu.Lock()
			for id := range c.held {
				dead = append(dead, id)
			}
			c.mu.Unlock()
		}
		// they no longer hold anything: take them out of the holder count
		for _, id := range dead {
			if err := b.Client.SRem(ctx, "{"+b.Prefix+key+"}:holders", id).Err(); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("killed 2 of %d processes holding %d leases", children, len(dead))
		if len(dead) == 0 {
			t.Fatal("the killed processes held no lease")
		}

		// Their leases lapse within TTL of the kill by Redis's clock: none was renewed
		// after it. killedAtServer is read after the killed processes' pipes closed, so
		// it is later than the kill; the slack is for a renewal a killed process wrote
		// just before it died that Redis reads after this TIME call.
		const inFlight = 50 * ms
		killedAtServer, err := b.Client.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range dead {
			exp, err := b.Client.ZScore(ctx, s.t.keys[0], id).Result()
			if errors.Is(err, redis.Nil) {
				continue // already taken back
			}
			if err != nil {
				t.Fatal(err)
			}
			if lapse := time.UnixMicro(int64(exp)).Sub(killedAtServer); lapse > ttl+inFlight {
				t.Errorf("lease %s of a killed holder lapses %v after the kill by Redis's clock, want within TTL %v (+%v for a renewal in flight)", id, lapse, ttl, inFlight)
			}
		}
		// and they are taken back: the survivor's calls purge them (reported, not
		// asserted: when a survivor's call lands after the expiry is scheduling; idle it
		// is within a few ms)
		for _, id := range dead {
			eventually(t, 10*time.Second, "dead lease purged", func() bool {
				_, err := b.Client.ZScore(ctx, s.t.keys[0], id).Result()
				return errors.Is(err, redis.Nil)
			})
		}
		t.Logf("the killed processes' leases were taken back %v after the kill (TTL %v)", time.Since(killedAt), ttl)

		// Once Redis's clock is 2 TTL past the kill, every live lease is a survivor's:
		// a killed process's queued places lapse within a TTL, and a lease handed to
		// one of them meanwhile lapses within another (the same in-flight slack).
		after := killedAtServer.Add(2*ttl + inFlight)
		var now time.Time
		for {
			if now, err = b.Client.Time(ctx).Result(); err != nil {
				t.Fatal(err)
			}
			if !now.Before(after) {
				break
			}
			time.Sleep(after.Sub(now))
		}
		live, err := b.Client.ZRangeByScore(ctx, s.t.keys[0], &redis.ZRangeBy{Min: "(" + strconv.FormatInt(now.UnixMicro(), 10), Max: "+inf"}).Result()
		if err != nil {
			t.Fatal(err)
		}
		// the survivor reports each lease it got through a pipe: wait for the reports
		// of these (a lease nobody alive got is never reported)
		survivor := kids[2]
		for _, id := range live {
			eventually(t, 10*time.Second, "lease "+id+", live 2 TTL after the kill, reported by the survivor", func() bool {
				survivor.mu.Lock()
				defer survivor.mu.Unlock()
				_, ok := survivor.got[id]
				return ok
			})
		}
		eventually(t, 10*time.Second, "the survivor got a lease after the killed processes' leases expired", func() bool {
			survivor.mu.Lock()
			defer survivor.mu.Unlock()
			for _, at := range survivor.got {
				if at.After(killedAt.Add(ttl)) {
					return true
				}
			}
			return false
		})

		// stop the survivor; it releases what it holds
		if err := survivor.stdin.Close(); err != nil {
			t.Fatal(err)
		}
		<-survivor.eof
		if err := survivor.cmd.Wait(); err != nil {
			t.Errorf("survivor exited: %v", err)
		}
		stopWatch()
		if err := <-watched; err != nil {
			t.Fatal(err)
		}
		if got := most.Load(); got > max {
			t.Errorf("lease set held %d entries at once, max %d", got, max)
		}
		total := 0
		for i, c := range kids {
			c.mu.Lock()
			t.Logf("child %d: %d leases", i, len(c.got))
			total += len(c.got)
			for _, line := range c.bad {
				t.Errorf("child reported: %s", line)
			}
			c.mu.Unlock()
		}
		t.Logf("%d leases granted across %d processes; lease set peaked at %d entries", total, children, most.Load())
	})
}

// A stall is Redis answering nothing for a while: miniredis behind a proxy that
// swallows every request (those it swallowed are never answered), or a real server
// running another client's long script (nothing is answered until it ends; its
// busy-reply-threshold, 5s, is never reached).
type stall struct {
	name   string
	rdb    *redis.Client                        // through the stall
	direct *redis.Client                        // past it
	start  func(t *testing.T)                   // Redis stops answering
	ended  func(t *testing.T) (time.Time, bool) // waits until it answers again: when; false if it never will
}

// stalls returns a stall of each kind, the real one for d; both stop with the test.
func stalls(t *testing.T, d time.Duration) []stall {
	b := redistest.NewMiniRealTime(t)
	proxy, err := redistest.NewProxy(b.Mini.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	hung := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { hung.Close() })
	_, real := startOwnServer(t)
	var done chan time.Time
	return []stall{
		{name: "miniredis, hung", rdb: hung, direct: b.Client.(*redis.Client),
			start: func(*testing.T) { proxy.Hang(true) },
			ended: func(*testing.T) (time.Time, bool) { return time.Time{}, false }},
		{name: "redis, another client's script", rdb: real, direct: real,
			start: func(t *testing.T) {
				done = make(chan time.Time, 1)
				spin := redis.NewClient(&redis.Options{Addr: real.Options().Addr, ReadTimeout: -1, MaxRetries: -1})
				go func() {
					_ = spin.Eval(context.Background(), `local t = redis.call('TIME'); local stop = t[1] * 1000000 + t[2] + tonumber(ARGV[1])
						repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop`, nil, d.Microseconds()).Err()
					done <- time.Now()
					spin.Close()
				}()
				probe := redis.NewClient(&redis.Options{Addr: real.Options().Addr, MaxRetries: -1, ReadTimeout: 20 * ms})
				defer probe.Close()
				for probe.Ping(context.Background()).Err() == nil { // until the server stops answering
					time.Sleep(ms)
				}
			},
			ended: func(*testing.T) (time.Time, bool) { return <-done, true }},
	}
}

// A Semaphore returns by its deadline whatever Redis does: an Acquire queued for a
// slot whose deadline passes while Redis stalls returns then, its place given back
// in the background once Redis answers; a Do whose function returns at its deadline
// while Redis stalls returns then, its lease released in the background. Asserted:
// each returns before Redis answers again (on miniredis: before its call timeout, by
// which the old synchronous give-up returned); the give-up and the release reach Redis
// once, after (on the real server), the give-up before any call this process makes on
// the key after the Acquire returned. Reported: how long past its deadline each returned.
func TestSemaphoreDeadlineWhileRedisStalls(t *testing.T) {
	const deadline, timeout = 300 * ms, 2 * time.Second
	for _, st := range stalls(t, 1500*ms) {
		t.Run(st.name, func(t *testing.T) {
			ctx := context.Background()
			var gaveUp, released, redisErrs atomic.Int64
			hooks := SemaphoreHooks{GaveUp: func(string) { gaveUp.Add(1) }, Released: func(string, time.Duration) { released.Add(1) },
				RedisError: func(string, error) { redisErrs.Add(1) }}
			s, err := NewSemaphore(st.rdb, "stall", 1, WithSemaphoreHooks(hooks), WithCallTimeout(timeout))
			if err != nil {
				t.Fatal(err)
			}
			holder := mustTry(t, s)

			// Acquire, queued, its deadline passing while Redis stalls
			actx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			dl, _ := actx.Deadline()
			type ret struct {
				at  time.Time
				err error
			}
			acquired := make(chan ret, 1)
			go func() { _, err := s.Acquire(actx); acquired <- ret{time.Now(), err} }()
			sendEventually(t, signalWait, "the Acquire queued", func() bool { return st.direct.ZCard(ctx, s.t.keys[1]).Val() == 1 })
			st.start(t)
			a := <-acquired
			answered, real := st.ended(t)
			late := a.at.Sub(dl)
			redistest.Figure(t, "%s: Acquire returned %v after its deadline (%v)", st.name, late.Round(time.Microsecond), a.err)
			if !errors.Is(a.err, context.DeadlineExceeded) {
				t.Fatalf("Acquire: got %v, want context.DeadlineExceeded", a.err)
			}
			if real && !a.at.Before(answered) || !real && late >= timeout {
				t.Fatalf("Acquire returned %v after its deadline, when Redis answered again or its give-up's call timeout passed; want before", late)
			}
			if real {
				if err := holder.Release(ctx); err != nil { // after the give-up: the slot is not handed to the place that left
					t.Fatal(err)
				}
				if gaveUp.Load() != 1 {
					t.Fatalf("GaveUp hook %d times before a call made after the Acquire returned, want once", gaveUp.Load())
				}
				mustTry(t, s).Release(ctx)
			}

			// Do, its function returning at its deadline while Redis stalls
			if !real {
				return // the proxy answers nothing more: the Do needs a lease first
			}
			dctx, cancel := context.WithTimeout(ctx, deadline)
			defer cancel()
			dl, _ = dctx.Deadline()
			releasedBefore := released.Load()
			err = s.Do(dctx, func(ctx context.Context) error {
				st.start(t)
				<-ctx.Done()
				return ctx.Err()
			})
			returned := time.Now()
			answered, _ = st.ended(t)
			late = returned.Sub(dl)
			redistest.Figure(t, "%s: Do returned %v after its deadline (%v)", st.name, late.Round(time.Microsecond), err)
			if !errors.Is(err, context.DeadlineExceeded) || !returned.Before(answered) {
				t.Fatalf("Do: got %v, %v after its deadline (Redis answered %v after it); want context.DeadlineExceeded before Redis answered",
					err, late, answered.Sub(dl))
			}
			mustTry(t, s) // after the release
			if n := released.Load() - releasedBefore; n != 1 {
				t.Fatalf("Released hook %d times for the Do's lease, want once", n)
			}
		})
	}
}

// A lease's life on the Go side counts from when the call that granted it was sent, as
// an extension's does: the server started its TTL no earlier. The reply of the
// granting call comes two seconds after it ran (the test steps the Go side's clock as
// it lands, the server's stays at t0), so the lease, which expires at t0+TTL in Redis,
// has TTL-2s left; before, Hold counted a whole TTL from the reply and would renew, and
// cancel fn once renewals failed, two seconds after the lease lapsed in Redis.
func TestSemaphoreLeaseCountsFromTheSend(t *testing.T) {
	const ttl, late = 9 * time.Second, 2 * time.Second
	for _, call := range []string{"TryAcquire", "Acquire"} {
		t.Run(call, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				tl := newTimeline(t, b)
				clk := newStepClock(tl)
				setGoClock(t, clk)
				s := tl.semaphore("from-the-send", 1, WithLeaseTTL(ttl))
				hook := &lateReply{clk: clk, by: late}
				b.Client.AddHook(hook)
				hook.armed.Store(true)
				var l *Lease
				var err error
				if call == "TryAcquire" {
					l, _, err = s.TryAcquire(context.Background())
				} else {
					l, err = s.Acquire(context.Background())
				}
				if err != nil || l == nil {
					t.Fatalf("%s: lease %v, %v; want a lease", call, l, err)
				}
				if hook.armed.Load() {
					t.Fatal("the granting call's reply was not held back: the test did not run its case")
				}
				expiry := redistest.Epoch.Add(ttl)
				if score, err := b.Client.ZScore(context.Background(), s.t.keys[0], l.ID()).Result(); err != nil || int64(score) != expiry.UnixMicro() {
					t.Fatalf("the lease's expiry in Redis: %v, %v; want t0+%v", score, err, ttl)
				}
				if left, want := l.left(), expiry.Sub(clk.Now()); left != want {
					t.Fatalf("the lease has %v left by the Go side's count once the reply came, want %v: until its expiry in Redis", left, want)
				}
			})
		})
	}
}

// lateReply steps clk by `by` as the reply of the first script call made once armed
// lands: the reply came that long after the call ran.
type lateReply struct {
	clk   *stepClock
	by    time.Duration
	armed atomic.Bool
}

func (h *lateReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *lateReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.landed([]redis.Cmder{cmd})
		return err
	}
}

func (h *lateReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.landed(cmds)
		return err
	}
}

func (h *lateReply) landed(cmds []redis.Cmder) {
	for _, c := range cmds {
		if name := c.Name(); (name == "evalsha" || name == "eval") && h.armed.CompareAndSwap(true, false) {
			h.clk.mu.Lock()
			h.clk.now = h.clk.now.Add(h.by)
			h.clk.mu.Unlock()
			return
		}
	}
}
