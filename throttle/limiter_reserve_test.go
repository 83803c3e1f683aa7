package throttle

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
)

func reserve(t *testing.T, l *Limiter, n int, maxWait time.Duration) *waiter.Reservation {
	t.Helper()
	r, err := l.Reserve(context.Background(), n, maxWait)
	if err != nil {
		t.Fatalf("Reserve(%d, %v): %v", n, maxWait, err)
	}
	return r
}

func wantBooking(t *testing.T, r *waiter.Reservation, ok bool, delay time.Duration) {
	t.Helper()
	if r.OK() != ok || r.Delay() != delay {
		t.Fatalf("reservation: OK %v Delay %v, want OK %v Delay %v", r.OK(), r.Delay(), ok, delay)
	}
}

// With 2 per second used up, callers that wait are booked in arrival order at the
// exact times permits free up; a caller that would have to wait too long books nothing;
// a caller asking now queues behind the bookings.
func TestReserveBooksInArrivalOrder(t *testing.T) {
	// Every algorithm frees the two permits of t0 at t0+1s here (the token bucket with
	// Burst 1 at 2/s frees one every 500ms, so it has its own timeline below).
	for _, alg := range []Algorithm{SlidingWindow, FixedWindow, SlidingCounter} {
		t.Run(alg.String(), func(t *testing.T) {
			redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
				tl := newTimeline(t, b)
				l := tl.limiter("fifo", PerSecond(2), WithAlgorithm(alg), WithBuckets(10))
				ahead := time.Duration(0)
				if alg == SlidingCounter {
					ahead = 100 * ms // a permit holds its place up to one bucket longer
				}
				runSteps(t, tl, l, []step{{0, 2, Result{true, 0, 0, time.Second + ahead, false, false}}})
				wantBooking(t, reserve(t, l, 1, 5*time.Second), true, time.Second+ahead)
				wantBooking(t, reserve(t, l, 1, 5*time.Second), true, time.Second+ahead)
				wantBooking(t, reserve(t, l, 1, time.Second), false, 2*time.Second+2*ahead)
				third := reserve(t, l, 1, 5*time.Second)
				wantBooking(t, third, true, 2*time.Second+2*ahead)
				res, err := l.Allow(context.Background()) // queues behind all three
				if err != nil || res.Allowed || res.RetryAfter != 2*time.Second+2*ahead {
					t.Fatalf("Allow behind bookings: %+v, %v", res, err)
				}
				// give the third back: the next caller gets its slot
				if err := third.Cancel(context.Background()); err != nil {
					t.Fatal(err)
				}
				wantBooking(t, reserve(t, l, 1, 5*time.Second), true, 2*time.Second+2*ahead)
			})
		})
	}
	t.Run("TokenBucket", func(t *testing.T) {
		redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
			tl := newTimeline(t, b)
			l := tl.limiter("fifo", Limit{Rate: 2, Period: time.Second, Burst: 2}, WithAlgorithm(TokenBucket))
			runSteps(t, tl, l, []step{{0, 2, Result{true, 0, 0, time.Second, false, false}}})
			wantBooking(t, reserve(t, l, 1, 5*time.Second), true, 500*ms)
			wantBooking(t, reserve(t, l, 1, 5*time.Second), true, time.Second)
			wantBooking(t, reserve(t, l, 1, time.Second), false, 1500*ms)
			third := reserve(t, l, 1, 5*time.Second)
			wantBooking(t, third, true, 1500*ms)
			res, err := l.Allow(context.Background())
			if err != nil || res.Allowed || res.RetryAfter != 2*time.Second {
				t.Fatalf("Allow behind bookings: %+v, %v", res, err)
			}
			if err := third.Cancel(context.Background()); err != nil {
				t.Fatal(err)
			}
			wantBooking(t, reserve(t, l, 1, 5*time.Second), true, 1500*ms)
		})
	})
}

// A booking that has taken effect cannot be given back: cancelling it, or cancelling
// twice, changes nothing.
func TestCancelAfterEffectIsNoOp(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("late", PerSecond(1), WithAlgorithm(alg), WithBuckets(10))
		runSteps(t, tl, l, []step{{0, 1, Result{true, 0, 0, l.fullReset(), false, false}}})
		r := reserve(t, l, 1, 5*time.Second)
		if !r.OK() || r.Delay() <= 0 {
			t.Fatalf("booking: OK %v Delay %v", r.OK(), r.Delay())
		}
		tl.at(r.Delay()) // it takes effect now
		before, err := l.AllowN(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 2; i++ {
			if err := r.Cancel(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		after, err := l.AllowN(context.Background(), 0)
		if err != nil {
			t.Fatal(err)
		}
		if after != before {
			t.Fatalf("cancel after effect changed the state: %+v -> %+v", before, after)
		}
		// and the cancel went to Redis only if the clock said it was still due
		if before.Remaining != 0 {
			t.Fatalf("booked permit not counted: %+v", before)
		}
	})
}

// fullReset is the ResetAfter right after taking the whole first limit at t0.
func (l *Limiter) fullReset() time.Duration {
	p := l.limits[0].Period
	if l.alg == SlidingCounter {
		p += p / time.Duration(defaultBuckets) * 5 // WithBuckets(10)
	}
	return p
}

func TestReserveErrors(t *testing.T) {
	b := redistest.NewMini(t)
	l, err := New(b.Client, "errs", PerSecond(3))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.Reserve(ctx, 4, time.Second); !errors.Is(err, ErrExceedsLimit) {
		t.Errorf("Reserve(4) of 3/s: %v, want ErrExceedsLimit", err)
	}
	if _, err := l.Reserve(ctx, -1, time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Reserve(-1): %v, want ErrInvalidArgument", err)
	}
	if _, err := l.Reserve(ctx, 1, -time.Second); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Reserve(maxWait<0): %v, want ErrInvalidArgument", err)
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Reserve(done, 1, time.Second); !errors.Is(err, context.Canceled) {
		t.Errorf("Reserve(done ctx): %v, want context.Canceled", err)
	}
	if err := l.WaitN(done, 1); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitN(done ctx): %v, want context.Canceled", err)
	}
	if err := l.WaitN(ctx, 4); !errors.Is(err, ErrExceedsLimit) {
		t.Errorf("WaitN(4): %v, want ErrExceedsLimit", err)
	}
	if n := len(b.Mini.Keys()); n != 0 {
		t.Errorf("bad calls wrote %d keys", n)
	}
}

// Waiters are served in arrival order: each caller that queues after another gets
// its permit after it, on the real clock and the production scripts.
//
// The order is read from the grants the script made (their server times, against the
// order the calls were sent), not from the order the waiters woke: wake-ups 20ms
// apart can swap on a busy machine without the limiter doing anything wrong.
func TestWaitersAreServedInArrivalOrder(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		grants := redistest.RecordGrants(b.Client)
		l, err := New(b.Client, "order", Limit{Rate: 1, Period: 20 * ms}, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		const waiters = 8
		var booked, done sync.WaitGroup
		for i := 0; i < waiters; i++ {
			booked.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				r, err := l.Reserve(ctx, 1, time.Second)
				booked.Done()
				if err != nil || !r.OK() {
					t.Errorf("waiter %d: %v %v", i, r, err)
					return
				}
				if err := r.Wait(ctx); err != nil {
					t.Error(err)
				}
			}()
			booked.Wait() // the next one arrives after this one has booked
		}
		done.Wait()
		list := grants.List() // by the time each grant takes effect
		if got, want := len(list), waiters+1; got != want {
			t.Fatalf("%d grants, want %d", got, want)
		}
		for i := 1; i < len(list); i++ {
			if !list[i].Sent.After(list[i-1].Sent) || !list[i].At.After(list[i-1].At) {
				t.Fatalf("grant %d (sent %v after the first, takes effect %v after it) does not follow grant %d (sent %v, %v): not in arrival order",
					i, list[i].Sent.Sub(list[0].Sent), list[i].At.Sub(list[0].At), i-1, list[i-1].Sent.Sub(list[0].Sent), list[i-1].At.Sub(list[0].At))
			}
		}
	})
}
