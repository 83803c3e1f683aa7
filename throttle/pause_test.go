package throttle

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// While a key is paused every algorithm denies with the time to the pause's end, books
// only after it, and reports nothing remaining; after it, it grants again.
func TestPauseDeniesUntilItEnds(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			l := tl.limiter("paused"+alg.String(), PerSecond(5), WithAlgorithm(alg))
			tl.at(10 * ms)
			pause := tl.script(lua.Pause, fakePause)
			if err := pause.Run(ctx, b.Client, l.keys[1:2], 300_000).Err(); err != nil {
				t.Fatal(err)
			}
			// a shorter pause keeps the longer one
			if err := pause.Run(ctx, b.Client, l.keys[1:2], 1000).Err(); err != nil {
				t.Fatal(err)
			}
			tl.at(110 * ms)
			res, err := l.Allow(ctx)
			if err != nil || res.Allowed || res.RetryAfter != 200*ms || res.Remaining != 0 {
				t.Fatalf("%v during pause: %+v, %v; want denied, RetryAfter 200ms", alg, res, err)
			}
			r, err := l.Reserve(ctx, 1, time.Second)
			if err != nil || !r.OK() || r.Delay() != 200*ms {
				t.Fatalf("%v booking during pause: %v %v %v; want booked at the pause's end", alg, r.OK(), r.Delay(), err)
			}
			tl.at(310 * ms)
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("%v after pause: %+v, %v", alg, res, err)
			}
			if ttl := b.Client.PTTL(ctx, l.keys[1]).Val(); ttl <= 0 && b.Real() {
				t.Fatalf("%v: pause key without TTL: %v", alg, ttl)
			}
		}
	})
}

// Pause holds across processes: a limiter on another client (another process, as far
// as Redis can tell) is denied until the pause ends, then allowed.
func TestPauseHoldsForOtherClients(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		a, err := New(b.Client, "shared", PerSecond(100), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		other := b.Client
		if b.Kind == redistest.Standalone {
			other = redis.NewClient(&redis.Options{Addr: b.Client.(*redis.Client).Options().Addr})
			defer other.Close()
		}
		bl, err := New(other, "shared", PerSecond(100), WithKeyPrefix(b.Prefix), WithAlgorithm(TokenBucket))
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Pause(ctx, -time.Second); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("Pause(-1s): %v", err)
		}
		start := time.Now()
		if err := a.Pause(ctx, 150*ms); err != nil {
			t.Fatal(err)
		}
		res, err := bl.Allow(ctx)
		if err != nil || res.Allowed {
			t.Fatalf("other limiter during pause: %+v, %v", res, err)
		}
		// tolerance: the pause was set at most the elapsed time ago
		if res.RetryAfter > 150*ms || res.RetryAfter < 150*ms-time.Since(start) {
			t.Fatalf("RetryAfter %v, want about 150ms", res.RetryAfter)
		}
		time.Sleep(res.RetryAfter)
		if res, err := bl.Allow(ctx); err != nil || !res.Allowed {
			t.Fatalf("other limiter after pause: %+v, %v", res, err)
		}
	})
}

// A waiter of this process that booked a slot inside a new pause gives it back and
// books again after the pause: no grant takes effect inside the paused window. No
// timing is assumed: the pause comes once the Allowed hook says all three booked, and
// the paused window counts from the time Pause was called, which is no later than
// the time its script ran, on the same clock.
func TestPauseMovesThisProcessesWaiters(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		grants := redistest.RecordGrants(b.Client)
		booked := make(chan struct{}, 64) // every grant, the bookings after the pause too
		l, err := New(b.Client, "moved", Limit{Rate: 1, Period: 100 * ms}, WithKeyPrefix(b.Prefix),
			WithHooks(Hooks{Allowed: func(string, int, time.Duration) { booked <- struct{}{} }}))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(ctx); err != nil { // the permit of this window
			t.Fatal(err)
		}
		<-booked
		var wg sync.WaitGroup
		returned := make([]time.Time, 3)
		for i := range returned {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := l.Wait(ctx); err != nil {
					t.Error(err)
				}
				returned[i] = time.Now()
			}()
		}
		for range returned { // all three have booked: +100, +200, +300ms
			<-booked
		}
		pausedAt := time.Now().Truncate(time.Microsecond) // Redis's TIME has µs
		if err := l.Pause(ctx, 250*ms); err != nil {
			t.Fatal(err)
		}
		wg.Wait()
		// A booking that came due before Pause was called (the busy machine ran this
		// goroutine late) is not the pause's: only the paused window is checked.
		inside := func(at time.Time) bool { return !at.Before(pausedAt) && at.Before(pausedAt.Add(250*ms)) }
		for i, at := range returned {
			if inside(at) {
				t.Errorf("waiter %d returned %v after the pause began, inside the 250ms pause", i, at.Sub(pausedAt))
			}
		}
		for _, g := range grants.List()[1:] {
			// the script paused at pausedAt or later, by the same machine's clock
			if inside(g.At) {
				t.Errorf("a grant took effect %v after Pause was called, inside the 250ms pause", g.At.Sub(pausedAt))
			}
		}
		if most := grants.MaxInWindow(100 * ms); most > 1 {
			t.Errorf("%d grants in one 100ms window", most)
		}
	})
}
