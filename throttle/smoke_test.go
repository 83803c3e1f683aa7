package throttle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

func TestMain(m *testing.M) { redistest.Main(m) }

func TestSmoke(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, alg := range []Algorithm{SlidingWindow, TokenBucket, FixedWindow, SlidingCounter} {
			l, err := New(b.Client, "smoke"+alg.String(), PerSecond(5), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			for i := 0; i < 5; i++ {
				r, err := l.Allow(ctx)
				if err != nil || !r.Allowed {
					t.Fatalf("%v allow %d: %+v %v", alg, i, r, err)
				}
			}
			r, err := l.Allow(ctx)
			if err != nil || r.Allowed || r.RetryAfter <= 0 {
				t.Fatalf("%v 6th: %+v %v", alg, r, err)
			}
			res, err := l.Reserve(ctx, 1, 2*time.Second)
			if err != nil || !res.OK() || res.Delay() <= 0 {
				t.Fatalf("%v reserve: %v %v", alg, res, err)
			}
			if err := res.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
			st, err := l.Inspect(ctx)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%v inspect %+v", alg, st)
			if err := l.Pause(ctx, 200*time.Millisecond); err != nil {
				t.Fatal(err)
			}
			st, _ = l.Inspect(ctx)
			if st.PausedFor <= 0 {
				t.Fatalf("%v not paused: %+v", alg, st)
			}
			if err := l.Resume(ctx); err != nil {
				t.Fatal(err)
			}
			if err := l.Override(ctx, time.Minute, PerSecond(50)); err != nil {
				t.Fatal(err)
			}
			st, _ = l.Inspect(ctx)
			if st.Override <= 0 || st.Limits[0].Limit.Rate != 50 {
				t.Fatalf("%v override: %+v", alg, st)
			}
			if err := l.ClearOverride(ctx); err != nil {
				t.Fatal(err)
			}
			wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
			if err := l.Wait(wctx); err != nil {
				t.Fatalf("%v wait: %v", alg, err)
			}
			cancel()
		}
		s, err := NewSemaphore(b.Client, "smokesem", 1, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease, _, err := s.TryAcquire(ctx)
		if err != nil || lease == nil {
			t.Fatalf("try: %v %v", lease, err)
		}
		l2, wait, err := s.TryAcquire(ctx)
		if err != nil || l2 != nil || wait <= 0 {
			t.Fatalf("second try: %v %v %v", l2, wait, err)
		}
		got := make(chan error, 1)
		go func() {
			l3, err := s.Acquire(ctx)
			if err == nil {
				err = l3.Release(ctx)
			}
			got <- err
		}()
		time.Sleep(100 * time.Millisecond)
		st, err := s.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("sem %+v", st)
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-got; err != nil {
			t.Fatal(err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := New(b.Client, "", PerSecond(1)); !errors.Is(err, ErrInvalidKey) {
			t.Fatal(err)
		}
	})
}
