package throttle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// Two algorithms on one key: the second gets an *AlgorithmError (ErrAlgorithmMismatch)
// and grants nothing, whichever comes first, on every backend, for a task's booking too;
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
				if r, err := a.Allow(ctx); err != nil || !r.Allowed {
					t.Fatalf("%v first: %+v %v", first, r, err)
				}
				_, err = z.Allow(ctx)
				var ae *AlgorithmError
				if !errors.Is(err, ErrAlgorithmMismatch) || !errors.As(err, &ae) || ae.Found != first || ae.Want != second || ae.Key != key {
					t.Fatalf("%v after %v: %v (%+v), want an AlgorithmError found %v want %v", second, first, err, ae, first, second)
				}
				if n := b.Client.Exists(ctx, z.stateKey()).Val(); n != 0 {
					t.Fatalf("%v after %v: the refused call wrote its state", second, first)
				}
				if _, err := z.Reserve(ctx, 1, 0); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Reserve after %v: %v", second, first, err)
				}
				if _, err := z.Reserve(booking.With(ctx, &booking.Task{ID: "task-1"}), 1, time.Minute); !errors.Is(err, ErrAlgorithmMismatch) {
					t.Fatalf("%v Reserve for a task after %v: %v", second, first, err)
				}
				if r, err := a.Allow(ctx); err != nil || !r.Allowed || r.Remaining != 8 {
					t.Fatalf("%v goes on: %+v %v", first, r, err)
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
