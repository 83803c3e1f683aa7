package throttle

import (
	"context"
	"fmt"
	"math/rand"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
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
