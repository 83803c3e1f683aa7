package throttle

import (
	"context"
	"fmt"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// StateLost fires when the key's state is deleted while its permits are still in
// their window, once, at the next grant; and never while the state is intact, however
// other limiters on the key grant, book and cancel meanwhile.
func TestStateLostHook(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			var lost []string
			key := "lost" + alg.String()
			l := tl.limiter(key, Limit{Rate: 10, Period: time.Second}, WithAlgorithm(alg),
				WithHooks(Hooks{StateLost: func(k string) { lost = append(lost, k) }}))
			other := tl.limiter(key, Limit{Rate: 10, Period: time.Second}, WithAlgorithm(alg))

			// intact: our grants, another process's grants, bookings and cancels
			rng := rand.New(rand.NewSource(int64(alg)))
			var at time.Duration
			for i := 0; i < 120; i++ {
				at += time.Duration(rng.Intn(60)) * ms
				tl.at(at)
				switch rng.Intn(4) {
				case 0, 1:
					if _, err := l.Allow(ctx); err != nil {
						t.Fatal(err)
					}
				case 2:
					if _, err := other.AllowN(ctx, 1+rng.Intn(2)); err != nil {
						t.Fatal(err)
					}
				case 3:
					r, err := other.Reserve(ctx, 1+rng.Intn(2), time.Second)
					if err != nil {
						t.Fatal(err)
					}
					if rng.Intn(2) == 0 {
						if err := r.Cancel(ctx); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			if len(lost) != 0 {
				t.Fatalf("%v: StateLost called %d times while the state was intact", alg, len(lost))
			}

			// the state vanishes while our permits are in the window
			at += 2 * time.Second // everything has left its window
			tl.at(at)
			for i := 0; i < 3; i++ {
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if err := b.Client.Del(ctx, l.stateKey()).Err(); err != nil {
				t.Fatal(err)
			}
			tl.at(at + 10*ms)
			res, err := l.Allow(ctx)
			if err != nil || !res.Allowed {
				t.Fatalf("%v: Allow after the state vanished: %+v, %v", alg, res, err)
			}
			if len(lost) != 1 || lost[0] != key {
				t.Fatalf("%v: StateLost calls %q after the key was deleted, want one for %q", alg, lost, key)
			}
			for i := 0; i < 3; i++ { // the new state is ours: no more alarms
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
			}
			if len(lost) != 1 {
				t.Fatalf("%v: StateLost called %d times, want once", alg, len(lost))
			}
			t.Logf("%v: state deleted after 3 grants: StateLost at the next grant (Remaining %d)", alg, res.Remaining)
		}
	})
}

// What StateLost cannot see, stated as tests so the README's list stays true: a loss
// after our permits left their window (nothing of ours was there to lose), a loss met
// by a denial or a read, or one hidden by other processes' grants since.
func TestStateLostLimits(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		run  func(tl *timeline, l, other *Limiter, del func())
	}{
		{"our permits had left the window", func(tl *timeline, l, _ *Limiter, del func()) {
			l.Allow(ctx)
			tl.at(1100 * ms)
			del()
			l.Allow(ctx)
		}},
		{"a read after the loss", func(tl *timeline, l, _ *Limiter, del func()) {
			l.Allow(ctx)
			del()
			l.AllowN(ctx, 0)
		}},
		{"others refilled the new state first", func(tl *timeline, l, other *Limiter, del func()) {
			l.AllowN(ctx, 2)
			del()
			other.AllowN(ctx, 3)
			l.Allow(ctx)
		}},
	} {
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			lost := 0
			key := fmt.Sprintf("limits%d%v", len(c.name), alg)
			l := tl.limiter(key, PerSecond(10), WithAlgorithm(alg), WithHooks(Hooks{StateLost: func(string) { lost++ }}))
			other := tl.limiter(key, PerSecond(10), WithAlgorithm(alg))
			c.run(tl, l, other, func() { b.Client.Del(ctx, l.stateKey()) })
			if lost != 0 {
				t.Errorf("%v, %s: StateLost called; this case is documented as not seen", alg, c.name)
			}
		}
	}
}

// A Limiter built per task compares with the grants of the ones built before it on the
// same client and key (they share what the process knows of the key): the loss shows at
// the first grant of a fresh Limiter.
func TestStateLostAcrossLimitersBuiltPerTask(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range allAlgorithms {
			tl := newTimeline(t, b)
			lost := 0
			key := "lost-per-task" + alg.String()
			build := func() *Limiter {
				return tl.limiter(key, PerSecond(10), WithAlgorithm(alg), WithHooks(Hooks{StateLost: func(string) { lost++ }}))
			}
			for i := 0; i < 3; i++ {
				if _, err := build().Allow(ctx); err != nil {
					t.Fatal(err)
				}
			}
			l := build()
			if err := b.Client.Del(ctx, l.stateKey()).Err(); err != nil {
				t.Fatal(err)
			}
			tl.at(10 * ms)
			if _, err := l.Allow(ctx); err != nil {
				t.Fatal(err)
			}
			if lost != 1 {
				t.Fatalf("%v: StateLost called %d times at a fresh Limiter's first grant after the loss, want once", alg, lost)
			}
		}
	})
}

// An override that raises the rates raises Remaining past what the callers' limits
// allow, as a lost state would: no StateLost follows, whether this process set it or
// another did (a second Redis client stands for it: a read of the key finds it). Once
// this process clears it, a lost state is reported again.
func TestStateLostNotAfterOverride(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		addrs, cluster := b.Addrs()
		otherClient := redistest.Dial(addrs, cluster)
		defer otherClient.Close()
		for _, alg := range allAlgorithms {
			for _, by := range []string{"this process", "another process"} {
				tl := newTimeline(t, b)
				var lost atomic.Int64
				key := "lost-override-" + alg.String() + "-" + by[:4]
				l := tl.limiter(key, PerSecond(10), WithAlgorithm(alg), WithHooks(Hooks{StateLost: func(string) { lost.Add(1) }}))
				setter := l
				if by == "another process" {
					o, err := New(otherClient, key, PerSecond(10), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
					if err != nil {
						t.Fatal(err)
					}
					if b.Real() {
						o.useScript(fakeClock[o.t.script])
					}
					setter = o
				}
				for range 3 {
					if _, err := l.Allow(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if err := setter.Override(ctx, time.Minute, PerSecond(100)); err != nil {
					t.Fatal(err)
				}
				for i := range 5 {
					tl.at(time.Duration(i+1) * 10 * ms)
					if _, err := l.Allow(ctx); err != nil {
						t.Fatal(err)
					}
				}
				if n := lost.Load(); n != 0 {
					t.Fatalf("%v, override by %s: StateLost called %d times while the state held every permit", alg, by, n)
				}
				if by == "another process" {
					continue
				}
				if err := l.ClearOverride(ctx); err != nil {
					t.Fatal(err)
				}
				tl.at(100 * ms)
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
				if err := b.Client.Del(ctx, l.stateKey()).Err(); err != nil {
					t.Fatal(err)
				}
				tl.at(110 * ms)
				if _, err := l.Allow(ctx); err != nil {
					t.Fatal(err)
				}
				if n := lost.Load(); n != 1 {
					t.Fatalf("%v: StateLost called %d times at the first grant after a loss, the override cleared; want once", alg, n)
				}
			}
		}
	})
}

// An empty restart (a Redis without persistence killed and started again; on
// miniredis, FLUSHALL) forgets every grant and booking: a process's waiters asleep on
// bookings keep their slots, which Redis no longer counts, and other callers get a full
// limit at once, so a window can hold the limit, the grants made before the restart
// and the lost bookings; StateLost fires at the process's next grant once its waiters
// went (made here before the other callers fill the new state). Asserted: no window of
// the period holds more than that sum; StateLost fires. Reported: the most permits in
// one window, against the limit.
func TestEmptyRestart(t *testing.T) {
	parallel(t)
	const rate, booked = 10, 5
	for _, kind := range []string{"miniredis, FLUSHALL", "redis, killed and restarted"} {
		t.Run(kind, func(t *testing.T) {
			ctx := context.Background()
			var rdb, other redis.UniversalClient
			var restart func()
			if kind == "miniredis, FLUSHALL" {
				b := redistest.NewMiniRealTime(t)
				rdb = b.Client
				other = redistest.Dial([]string{b.Mini.Addr()}, false)
				restart = b.Mini.FlushAll
			} else {
				s, c := startOwnServer(t)
				rdb = c
				other = redistest.Dial([]string{s.Addr}, false)
				restart = func() {
					s.Kill()
					if err := s.Restart(); err != nil {
						t.Fatal(err)
					}
				}
			}
			defer other.Close()
			var lost atomic.Int64
			var mu sync.Mutex
			var took []time.Time // when each permit took effect, as its caller saw it
			note := func() {
				mu.Lock()
				took = append(took, time.Now())
				mu.Unlock()
			}
			l, err := New(rdb, "restart", PerSecond(rate), WithHooks(Hooks{StateLost: func(string) { lost.Add(1) }}))
			if err != nil {
				t.Fatal(err)
			}
			for range rate {
				if res, err := l.Allow(ctx); err != nil || !res.Allowed {
					t.Fatalf("Allow: %+v, %v", res, err)
				}
				note()
			}
			var wg sync.WaitGroup
			var woke atomic.Int32
			for range booked { // asleep on bookings a second ahead
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := l.Wait(ctx); err == nil {
						note()
						woke.Add(1)
					}
				}()
			}
			// every waiter booked: asleep, or (the Allows ran slowly, so the slots came
			// soon) gone at its slot already
			asleep := 0
			sendEventually(t, signalWait, "the waiters booked", func() bool {
				asleep = sendSleepers(l)
				return asleep+int(woke.Load()) == booked
			})
			restart()
			wg.Wait() // the waiters went at their slots, which Redis forgot
			// the process's next grant
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("Allow after the restart: %+v, %v", res, err)
			}
			note()
			o, err := New(other, "restart", PerSecond(rate))
			if err != nil {
				t.Fatal(err)
			}
			for range 2 * rate { // another process, finding the limit all but full
				if res, err := o.Allow(ctx); err == nil && res.Allowed {
					note()
				}
			}
			mu.Lock()
			most := 0
			for i := range took {
				n := 0
				for _, at := range took[i:] {
					if at.Sub(took[i]) < time.Second {
						n++
					}
				}
				most = max(most, n)
			}
			mu.Unlock()
			redistest.Figure(t, "%s: at most %d permits in one second (limit %d, %d granted and %d booked before the restart, %d of them asleep at it); StateLost called %d times",
				kind, most, rate, rate, booked, asleep, lost.Load())
			if most > 2*rate+booked {
				t.Errorf("%d permits in one second, want at most %d", most, 2*rate+booked)
			}
			if lost.Load() == 0 {
				t.Error("StateLost not called after the empty restart")
			}
		})
	}
}
