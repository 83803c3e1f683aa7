package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/keys"
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
	// a fair share's queue holding a member not ours (not "<units> <name>")
	foreignQueued = foreignForm{"foreign-member", func(ctx context.Context, c redis.UniversalClient, k string) error {
		return c.ZAdd(ctx, k, redis.Z{Score: 1, Member: "not a tenant"}).Err()
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
// is planted, call after; touches lists the keys it reads or writes. The calls run on
// the handle of tenant "acme" when tenant is set.
type foreignCall struct {
	name    string
	tenant  bool
	touches []string // of "state", "booking", "tenant" (the tenant's caps), "queue" (the fair share's)
	setup   func(ctx context.Context, l *Limiter) (*waiter.Reservation, error)
	call    func(ctx context.Context, l *Limiter, r *waiter.Reservation) error
}

// foreignLimiterCalls are the calls of a limiter's handles, and the keys each touches:
// every call the state (the control ops write their meta there), a task's the task's
// booking, a tenant's its caps and the fair share's queue; the limiter's Inspect reads
// the queue too (the tenants queued).
func foreignLimiterCalls() []foreignCall {
	taskCtx := func(ctx context.Context) context.Context {
		return booking.With(ctx, &booking.Task{ID: "task"})
	}
	bookAhead := func(ctx context.Context, l *Limiter) (*waiter.Reservation, error) {
		if _, err := l.Allow(ctx); err != nil {
			return nil, err
		}
		r, err := l.Reserve(ctx, 1, time.Hour)
		if err == nil && (!r.OK() || r.Delay() <= 0) {
			err = fmt.Errorf("setup: reservation OK %v Delay %v, want a booking ahead", r.OK(), r.Delay())
		}
		return r, err
	}
	allow := func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
		_, err := l.Allow(ctx)
		return err
	}
	inspect := func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
		_, err := l.Inspect(ctx)
		return err
	}
	cancel := func(ctx context.Context, l *Limiter, r *waiter.Reservation) error { return r.Cancel(ctx) }
	state, task, tenant := []string{"state"}, []string{"state", "booking"}, []string{"state", "tenant", "queue"}
	return []foreignCall{
		{"acquire", false, state, nil, allow},
		{"reserve", false, state, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			_, err := l.Reserve(ctx, 1, time.Hour)
			return err
		}},
		{"task-booking", false, task, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			_, err := l.Reserve(taskCtx(ctx), 1, time.Hour)
			return err
		}},
		{"cancel", false, state, bookAhead, cancel},
		{"task-cancel", false, task, func(ctx context.Context, l *Limiter) (*waiter.Reservation, error) {
			if _, err := l.Allow(ctx); err != nil {
				return nil, err
			}
			r, err := l.Reserve(taskCtx(ctx), 1, time.Hour)
			if err == nil && (!r.OK() || r.Delay() <= 0) {
				err = fmt.Errorf("setup: reservation OK %v Delay %v, want a booking ahead", r.OK(), r.Delay())
			}
			return r, err
		}, cancel},
		{"inspect", false, []string{"state", "queue"}, nil, inspect},
		{"pause", false, state, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.Pause(ctx, time.Nanosecond) // the Go side's hold ends at once
		}},
		{"resume", false, state, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.Resume(ctx)
		}},
		{"override", false, state, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.Override(ctx, time.Minute, Limit{Rate: 2})
		}},
		{"clear", false, state, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.ClearOverride(ctx)
		}},
		{"tenant-acquire", true, tenant, nil, allow},
		{"tenant-cancel", true, []string{"state", "tenant"}, bookAhead, cancel},
		{"tenant-inspect", true, tenant, nil, inspect},
		{"tenant-weight", true, state, nil, func(ctx context.Context, l *Limiter, _ *waiter.Reservation) error {
			return l.OverrideWeight(ctx, time.Minute, 2)
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

// Nothing lands on a key the library does not own: for every limiter call, a tenant's
// included, and every key it touches (the state, a task's booking, a tenant's caps, the
// fair share's queue), a foreign key (another type, or content not ours) is left exactly
// as it was, and so is every other key of the limiter (a call that fails writes
// nothing), and the call returns ErrCorruptState. A foreign key the call does not touch
// is left as it was too, and the call succeeds.
func TestForeignKeysAreLeftAlone(t *testing.T) {
	parallel(t)
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		n := 0
		for _, alg := range allAlgorithms {
			stateType := "string"
			if alg == SlidingWindow || alg == SlidingCounter {
				stateType = "list"
			}
			for _, c := range foreignLimiterCalls() {
				for _, target := range []string{"state", "booking", "tenant"} {
					typ := "string"
					switch target {
					case "state", "tenant":
						typ = stateType
					case "queue":
						typ = "zset"
					}
					forms := formsOf(typ)
					if target == "queue" {
						forms = append(forms, foreignQueued)
					}
					for _, form := range forms {
						n++
						what := fmt.Sprintf("%v %s, foreign %s (%s)", alg, c.name, target, form.name)
						minute := Limit{Rate: 1, Period: time.Minute}
						l, err := New(b.Client, fmt.Sprintf("foreign-%d", n), minute, WithKeyPrefix(b.Prefix), WithAlgorithm(alg),
							WithTenantLimits(minute))
						if err != nil {
							t.Fatal(err)
						}
						keyOf := map[string]string{"state": l.stateKey(), "booking": l.bookingKey("task"),
							"tenant": keys.Name(l.t.tag, keys.Tenant+"acme"), "queue": keys.Name(l.t.tag, keys.FairQueue)}
						all := []string{keyOf["state"], keyOf["booking"], keyOf["tenant"], keyOf["queue"]}
						if c.tenant {
							l = l.Tenant("acme")
						}
						var r *waiter.Reservation
						if c.setup != nil {
							if r, err = c.setup(ctx, l); err != nil {
								t.Fatalf("%s: setup: %v", what, err)
							}
						}
						key := keyOf[target]
						if form.name != foreignQueued.name {
							if err := b.Client.Del(ctx, key).Err(); err != nil {
								t.Fatal(err)
							}
						}
						if err := form.plant(ctx, b.Client, key); err != nil {
							t.Fatal(err)
						}
						before := ctlSnapshot(t, b.Client, all...)
						err = c.call(ctx, l, r)
						after := ctlSnapshot(t, b.Client, all...)
						ctlSameAs(t, what, before, after, key)
						if slices.Contains(c.touches, target) {
							if !errors.Is(err, ErrCorruptState) {
								t.Fatalf("%s: got %v, want ErrCorruptState", what, err)
							}
							ctlSameAs(t, what+" (the call failed: it writes nothing)", before, after, all...)
						} else if err != nil {
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
