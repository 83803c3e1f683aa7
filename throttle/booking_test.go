package throttle

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
)

func reserveFor(t *testing.T, l *Limiter, id string, n int) (*waiter.Reservation, bool) {
	t.Helper()
	r, kept, err := l.ReserveFor(context.Background(), id, n, time.Hour)
	if err != nil {
		t.Fatalf("ReserveFor(%q, %d): %v", id, n, err)
	}
	if !r.OK() {
		t.Fatalf("ReserveFor(%q, %d): not booked (delay %v)", id, n, r.Delay())
	}
	return r, kept
}

// A task that comes back finds its own booking, from the same place in line; one that
// comes back after its slot is moved to the earliest slot free then; a cancelled
// booking is gone. Every algorithm, and a limiter with two limits, on every backend.
func TestReserveForKeepsThePlace(t *testing.T) {
	type variant struct {
		name string
		opts []Option
	}
	var variants []variant
	for _, alg := range allAlgorithms {
		variants = append(variants, variant{alg.String(), []Option{WithAlgorithm(alg), WithBuckets(10)}})
	}
	variants = append(variants, variant{"TwoLimits", []Option{WithLimits(PerMinute(100))}})
	for _, v := range variants {
		t.Run(v.name, func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				tl := newTimeline(t, b)
				l := tl.limiter("bk", PerSecond(2), v.opts...)
				ctx := context.Background()
				for range 2 { // use up the first second
					if res, err := l.Allow(ctx); err != nil || !res.Allowed {
						t.Fatalf("Allow: %+v, %v", res, err)
					}
				}
				a, kept := reserveFor(t, l, "task-a", 1)
				if kept || a.Delay() <= 0 {
					t.Fatalf("first booking of a: kept %v delay %v, want a new booking ahead", kept, a.Delay())
				}
				bb, _ := reserveFor(t, l, "task-b", 1)
				if bb.Delay() < a.Delay() {
					t.Fatalf("b booked at %v, before a at %v", bb.Delay(), a.Delay())
				}
				// a comes back 100ms before its slot: the same booking, no new grant
				tl.at(a.Delay() - 100*ms)
				a2, kept := reserveFor(t, l, "task-a", 1)
				if !kept || a2.Delay() != 100*ms {
					t.Fatalf("a back early: kept %v delay %v, want its booking, 100ms ahead", kept, a2.Delay())
				}
				// the next booking comes after b's: a's return booked nothing
				c, _ := reserveFor(t, l, "task-c", 1)
				if got := c.Delay() + a.Delay() - 100*ms; got < bb.Delay() {
					t.Fatalf("c booked at %v from t0, before b's %v", got, bb.Delay())
				}
				// another n is another booking
				if _, kept := reserveFor(t, l, "task-a", 2); kept {
					t.Fatal("a with n=2 kept the booking of n=1")
				}
				// b comes back late, after everything booked so far: a new slot, not the
				// passed one
				late := c.Delay() + a.Delay() - 100*ms + 10*time.Second
				tl.at(late)
				b2, kept := reserveFor(t, l, "task-b", 1)
				if kept || b2.Delay() != 0 {
					t.Fatalf("b back late to an idle limiter: kept %v delay %v, want a new grant now", kept, b2.Delay())
				}
				// a cancelled booking is given back and forgotten
				d, _ := reserveFor(t, l, "task-d", 2)
				d, _ = reserveFor(t, l, "task-d", 2)
				_ = d
				e, kept := reserveFor(t, l, "task-e", 1)
				if kept || e.Delay() <= 0 {
					t.Fatalf("e: kept %v delay %v, want a booking ahead", kept, e.Delay())
				}
				if err := e.Cancel(ctx); err != nil {
					t.Fatal(err)
				}
				if _, kept := reserveFor(t, l, "task-e", 1); kept {
					t.Fatal("e kept a cancelled booking")
				}
			})
		})
	}
}

// The booking op's argument checks: ids, and ops 2 and 3 without their key.
func TestReserveForArguments(t *testing.T) {
	b := redistest.NewMini(t)
	l, err := New(b.Client, "args", PerSecond(1), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"", strings.Repeat("x", 513)} {
		if _, _, err := l.ReserveFor(ctx, id, 1, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ReserveFor(id of %d bytes): %v, want ErrInvalidArgument", len(id), err)
		}
	}
	if _, _, err := l.ReserveFor(ctx, "x", 1, -1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("ReserveFor(maxWait -1): %v, want ErrInvalidArgument", err)
	}
	// ops 2 and 3 with two keys only are refused before any write
	if _, err := l.run(ctx, opAcquireFor, 1, 0); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("op 2 without a booking key: %v, want ErrInvalidArgument", err)
	}
	if n := len(b.Mini.Keys()); n != 0 {
		t.Errorf("%d keys written by refused calls", n)
	}
}

// A booking nobody comes back for leaves nothing behind once its time has passed.
func TestReserveForRecordExpires(t *testing.T) {
	b := redistest.NewMini(t)
	tl := newTimeline(t, b)
	l := tl.limiter("exp", PerSecond(1))
	ctx := context.Background()
	if _, err := l.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	r, _ := reserveFor(t, l, "gone", 1)
	record := "{" + b.Prefix + "exp}:bk:gone"
	if !b.Mini.Exists(record) {
		t.Fatalf("keys after a booking: %v, want %s among them", b.Mini.Keys(), record)
	}
	b.Mini.FastForward(r.Delay() + 2*time.Second)
	for _, k := range b.Mini.Keys() {
		if strings.HasSuffix(k, ":bk:gone") || strings.HasSuffix(k, ":sw") {
			t.Fatalf("key %s left after the booking's time", k)
		}
	}
}
