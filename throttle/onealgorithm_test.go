package throttle

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Two algorithms on one key: the second gets an *AlgorithmError (ErrAlgorithmMismatch)
// for every call, grants nothing and leaves the state as it was, whichever comes first,
// on every backend, for a task's booking, Inspect and Override too (the one state key's
// meta names the algorithm, read by every request);
// deleting the first's state (what `jobthrottle reset` does) moves the key to the other
// algorithm, which the first then refuses. (Two algorithms each keeping their own state
// on one key would each admit up to the limit: twice the limit.)
func TestOneAlgorithmPerKey(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, first := range allAlgorithms {
			for _, second := range allAlgorithms {
				if first == second {
					continue
				}
				key := "one-" + first.String() + "-" + second.String()
				a, err := New(b.Client, key, PerMinute(10), WithAlgorithm(first), WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				z, err := New(b.Client, key, PerMinute(10), WithAlgorithm(second), WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				// the whole limit taken and a booking ahead: every form of its state's numbers
				if r, err := a.AllowN(ctx, 10); err != nil || !r.Allowed {
					t.Fatalf("%v first: %+v %v", first, r, err)
				}
				if r, err := a.Reserve(ctx, 1, time.Hour); err != nil || !r.OK() || r.Delay() <= 0 {
					t.Fatalf("%v first, a booking ahead: %v %v", first, r, err)
				}
				before := ctlSnapshot(t, b.Client, a.stateKey())
				_, err = z.Allow(ctx)
				var ae *AlgorithmError
				if !errors.Is(err, ErrAlgorithmMismatch) || !errors.As(err, &ae) || ae.Found != first || ae.Want != second || ae.Key != key {
					t.Fatalf("%v after %v: %v (%+v), want an AlgorithmError found %v want %v", second, first, err, ae, first, second)
				}
				if _, err := z.Reserve(ctx, 1, 0); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Reserve after %v: %v", second, first, err)
				}
				if _, err := z.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Minute); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Reserve for a task after %v: %v", second, first, err)
				}
				if _, err := z.Inspect(ctx); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Inspect after %v: %v", second, first, err)
				}
				if err := z.Override(ctx, time.Minute, PerMinute(20)); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Override after %v: %v", second, first, err)
				}
				ctlSameAs(t, fmt.Sprintf("%v's refused calls after %v", second, first), before, ctlSnapshot(t, b.Client, a.stateKey()), a.stateKey())
				if n := b.Client.Exists(ctx, a.bookingKey("task-1")).Val(); n != 0 {
					t.Fatalf("%v after %v: the refused task's call wrote its booking", second, first)
				}
				if r, err := a.Allow(ctx); err != nil || r.Allowed {
					t.Fatalf("%v goes on: %+v %v, want denied (its limit taken)", first, r, err)
				}
				if err := b.Client.Del(ctx, a.stateKey()).Err(); err != nil {
					t.Fatal(err)
				}
				if r, err := z.Allow(ctx); err != nil || !r.Allowed || r.Remaining != 9 {
					t.Fatalf("%v after %v's state was deleted: %+v %v", second, first, r, err)
				}
				if _, err := a.Allow(ctx); !errors.As(err, &ae) || ae.Found != second || ae.Want != first {
					t.Fatalf("%v after %v took over: %v", first, second, err)
				}
			}
		}
	})
}
