package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// A foreign key: one of another type, or of the right type holding what jobthrottle
// did not write. plant writes it at key, without a TTL.
type foreignForm struct {
	name  string
	plant func(ctx context.Context, c redis.UniversalClient, key string) error
}

var (
	foreignString = foreignForm{"string", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.Set(ctx, k, "not ours", 0).Err()
	}}
	foreignHash = foreignForm{"hash", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.HSet(ctx, k, "f", "v").Err()
	}}
	foreignList = foreignForm{"list", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.RPush(ctx, k, "not ours").Err()
	}}
	foreignSet = foreignForm{"set", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.SAdd(ctx, k, "m").Err()
	}}
	foreignZset = foreignForm{"zset", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.ZAdd(ctx, k, redis.Z{Score: 1, Member: "m"}).Err()
	}}
	// a string that reads almost as ours: numbers, but not of our form
	foreignNumbers = foreignForm{"numbers", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.Set(ctx, k, "1 -2", 0).Err()
	}}
	// a queue whose head is a place not ours (no ":<ttl_us>")
	foreignPlace = foreignForm{"foreign-place", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.ZAdd(ctx, k, redis.Z{Score: 1, Member: "not a place"}).Err()
	}}
)

// formsOf returns the foreign forms of a key of type typ ("string", "list", "zset").
func formsOf(typ string) []foreignForm {
	switch typ {
	case "list":
		return []foreignForm{foreignString, foreignHash, foreignZset, foreignList}
	case "zset":
		return []foreignForm{foreignString, foreignHash, foreignList, foreignSet}
	}
	return []foreignForm{foreignHash, foreignList, foreignSet, foreignString, foreignNumbers}
}

// foreignCall is one call of the API on a fresh key: setup runs before the foreign key
// is planted, call after; touches lists the keys it reads or writes.
type foreignCall struct {
	name    string
	touches []string // of "state", "control", "record", "booking"
	setup   func(ctx context.Context, l *Limiter) (*waiter.Reservation, error)
	call    func(ctx context.Context, l *Limiter, r *waiter.Reservation) error
}

func foreignLimiterCalls(alg Algorithm) []foreignCall {
	grantKeys := []string{"state", "control", "record"}
	overrideKeys := []string{"control"}
	if alg == TokenBucket { // its state is settled at a change of rates
		overrideKeys = []string{"control", "state"}
	}
	taskCtx := func(ctx context.Context) context.Context {
		return booking.With(ctx, &booking.Task{ID: "task"})
	}
	return []foreignCall{
		{"acquire", grantKeys, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			_, err := l.Allow(ctx)
			return err
		}},
		{"reserve", grantKeys, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			_, err := l.Reserve(ctx, 1, time.Hour)
			return err
		}},
		{"task-booking", append(grantKeys, "booking"), nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			_, err := l.Reserve(taskCtx(ctx), 1, time.Hour)
			return err
		}},
		{"cancel", []string{"state", "control"}, func(ctx context.Context, l *Limiter) (*waiter.Reservation, error) {
			if _, err := l.Allow(ctx); err != nil {
				return nil, err
			}
			r, err := l.Reserve(ctx, 1, time.Hour)
			if err == nil && (!r.OK() || r.Delay() <= 0) {
				err = fmt.Errorf("setup: reservation OK %v Delay %v, want a booking ahead", r.OK(), r.Delay())
			}
			return r, err
		}, func(ctx context.Context, l *Limiter, r *waiter.Reservation) error { return r.Cancel(ctx) }},
		{"task-cancel", []string{"state", "control", "booking"}, func(ctx context.Context, l *Limiter) (*waiter.Reservation, error) {
			if _, err := l.Allow(ctx); err != nil {
				return nil, err
			}
			r, err := l.Reserve(taskCtx(ctx), 1, time.Hour)
			if err == nil && (!r.OK() || r.Delay() <= 0) {
				err = fmt.Errorf("setup: reservation OK %v Delay %v, want a booking ahead", r.OK(), r.Delay())
			}
			return r, err
		}, func(ctx context.Context, l *Limiter, r *waiter.Reservation) error { return r.Cancel(ctx) }},
		{"inspect", []string{"state", "control"}, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			_, err := l.Inspect(ctx)
			return err
		}},
		{"pause", []string{"control"}, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.Pause(ctx, time.Nanosecond) // the Go side's hold ends at once
		}},
		{"resume", []string{"control"}, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.Resume(ctx)
		}},
		{"override", overrideKeys, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.Override(ctx, time.Minute, Limit{Rate: 2})
		}},
		{"clear", overrideKeys, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.ClearOverride(ctx)
		}},
	}
}

// ctlSnapshot reads keys, failing the test on an error.
func ctlSnapshot(t *testing.T, c redis.UniversalClient, keys ...string) redistest.Snapshot {
	t.Helper()
	s, err := redistest.Read(context.Background(), c, keys...)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// ctlSameAs fails the test unless after holds what before does, for each key of keys:
// the same type and value, and no TTL where there was none (a key with a TTL counts
// down on a real server).
func ctlSameAs(t *testing.T, what string, before, after redistest.Snapshot, keys ...string) {
	t.Helper()
	for _, k := range keys {
		b, a := before[k], after[k]
		if !a.Same(b) || (b.TTL < 0) != (a.TTL < 0) {
			t.Fatalf("%s: key %s changed: got %v, want %v as it was", what, k, a, b)
		}
	}
}

// Nothing lands on a key the library does not own: for every limiter call and every
// key it touches (the state, the control key, the record, a task's booking), a foreign
// key (another type, or text not ours) is left exactly as it was, and so is every
// other key of the limiter (a call that fails writes nothing, the record included),
// and the call returns ErrCorruptState; a foreign record is left alone silently (the
// call succeeds). A foreign key the call does not touch is left as it was too.
func TestForeignKeysAreLeftAlone(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		n := 0
		for _, alg := range allAlgorithms {
			stateType := "string"
			if alg == SlidingWindow || alg == SlidingCounter {
				stateType = "list"
			}
			for _, c := range foreignLimiterCalls(alg) {
				for _, target := range []string{"state", "control", "record", "booking"} {
					typ := "string"
					if target == "state" {
						typ = stateType
					}
					for _, form := range formsOf(typ) {
						n++
						what := fmt.Sprintf("%v %s, foreign %s (%s)", alg, c.name, target, form.name)
						l, err := New(b.Client, fmt.Sprintf("foreign-%d", n), Limit{Rate: 1, Period: time.Minute}, WithKeyPrefix(b.Prefix), WithAlgorithm(alg))
						if err != nil {
							t.Fatal(err)
						}
						keyOf := map[string]string{"state": l.t.keys[0], "control": l.t.keys[1], "record": l.t.keys[2], "booking": l.bookingKey("task")}
						all := []string{keyOf["state"], keyOf["control"], keyOf["record"], keyOf["booking"]}
						var r *waiter.Reservation
						if c.setup != nil {
							if r, err = c.setup(ctx, l); err != nil {
								t.Fatalf("%s: setup: %v", what, err)
							}
						}
						key := keyOf[target]
						if err := b.Client.Del(ctx, key).Err(); err != nil {
							t.Fatal(err)
						}
						if err := form.plant(ctx, b.Client, key); err != nil {
							t.Fatal(err)
						}
						before := ctlSnapshot(t, b.Client, all...)
						err = c.call(ctx, l, r)
						after := ctlSnapshot(t, b.Client, all...)
						ctlSameAs(t, what, before, after, key)
						touched := false
						for _, k := range c.touches {
							touched = touched || k == target
						}
						switch {
						case touched && target != "record":
							if !errors.Is(err, ErrCorruptState) {
								t.Fatalf("%s: got %v, want ErrCorruptState", what, err)
							}
							ctlSameAs(t, what+" (the call failed: it writes nothing)", before, after, all...)
						case err != nil:
							t.Fatalf("%s: got %v, want the call to succeed (the key is not one it needs)", what, err)
						}
					}
				}
			}
		}
		t.Logf("%d limiter calls with a foreign key", n)
	})
}

// The same for every semaphore call (acquire, extend, release, inspect) and each of its
// keys: the leases, the queue, the queue's expiries and the control key. A queue whose
// head, which a call's hand-off would reach, is a place not ours is foreign too.
func TestForeignSemaphoreKeysAreLeftAlone(t *testing.T) {
	type semCall struct {
		name  string
		lease bool // the call needs a lease, taken before the foreign key is planted
		call  func(ctx context.Context, s *Semaphore, l *Lease) error
	}
	calls := []semCall{
		{"acquire", false, func(ctx context.Context, s *Semaphore, _ *Lease) error {
			_, _, err := s.TryAcquire(ctx)
			return err
		}},
		{"task-acquire", false, func(ctx context.Context, s *Semaphore, _ *Lease) error {
			_, _, err := s.TryAcquire(booking.With(ctx, &booking.Task{ID: "task"}))
			return err
		}},
		{"extend", true, func(ctx context.Context, _ *Semaphore, l *Lease) error { return l.Extend(ctx) }},
		{"release", true, func(ctx context.Context, _ *Semaphore, l *Lease) error { return l.Release(ctx) }},
		{"inspect", false, func(ctx context.Context, s *Semaphore, _ *Lease) error {
			_, err := s.Inspect(ctx)
			return err
		}},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		n := 0
		for _, c := range calls {
			for target := range 4 {
				forms := formsOf("zset")
				if target == 3 {
					forms = formsOf("string")
				}
				if target == 1 && c.name != "extend" && c.name != "inspect" {
					forms = append(forms, foreignPlace) // reached by the hand-off of a free slot
				}
				for _, form := range forms {
					n++
					s, err := NewSemaphore(b.Client, fmt.Sprintf("foreign-sem-%d", n), 2, WithKeyPrefix(b.Prefix))
					if err != nil {
						t.Fatal(err)
					}
					key := s.t.keys[target]
					what := fmt.Sprintf("%s, foreign %s (%s)", c.name, key[strings.LastIndex(key, ":")+1:], form.name)
					var lease *Lease
					if c.lease {
						lease = mustTry(t, s)
					}
					if form.name != foreignPlace.name {
						if err := b.Client.Del(ctx, key).Err(); err != nil {
							t.Fatal(err)
						}
					}
					if err := form.plant(ctx, b.Client, key); err != nil {
						t.Fatal(err)
					}
					before := ctlSnapshot(t, b.Client, s.t.keys...)
					err = c.call(ctx, s, lease)
					after := ctlSnapshot(t, b.Client, s.t.keys...)
					if !errors.Is(err, ErrCorruptState) {
						t.Fatalf("%s: got %v, want ErrCorruptState", what, err)
					}
					ctlSameAs(t, what, before, after, s.t.keys...)
				}
			}
		}
		t.Logf("%d semaphore calls with a foreign key", n)
	})
}
