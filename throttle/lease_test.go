package throttle

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
)

// leaseHooks counts what a Semaphore's lease hooks report.
type leaseHooks struct {
	mu       sync.Mutex
	released []time.Duration
	lost     int
}

func (h *leaseHooks) hooks() SemaphoreHooks {
	return SemaphoreHooks{
		Released:  func(_ string, held time.Duration) { h.mu.Lock(); h.released = append(h.released, held); h.mu.Unlock() },
		LeaseLost: func(string) { h.mu.Lock(); h.lost++; h.mu.Unlock() },
	}
}

func (h *leaseHooks) counts() (released []time.Duration, lost int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]time.Duration(nil), h.released...), h.lost
}

// A lease's ID is 128 random bits as 32 lowercase hex digits, the member the script
// keeps in the set of leases.
func TestLeaseID(t *testing.T) {
	b := redistest.NewMini(t)
	tl := newTimeline(t, b)
	s := tl.semaphore("ids", 2)
	a, c := mustTry(t, s), mustTry(t, s)
	hex32 := regexp.MustCompile(`^[0-9a-f]{32}$`)
	for _, l := range []*Lease{a, c} {
		if !hex32.MatchString(l.ID()) {
			t.Fatalf("lease ID %q, want 32 lowercase hex digits", l.ID())
		}
		if _, err := b.Client.ZScore(t.Context(), s.keys[0], l.ID()).Result(); err != nil {
			t.Fatalf("lease %s is not in %s: %v", l.ID(), s.keys[0], err)
		}
	}
	if a.ID() == c.ID() {
		t.Fatalf("two leases with one ID %s", a.ID())
	}
}

// Extend moves the lease's expiry to one TTL from now (server clock), so the slot
// stays taken past the first TTL; a lease found expired is lost for good: Extend and
// Release then return ErrLeaseLost, and the LeaseLost hook runs once.
func TestLeaseExtend(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		var h leaseHooks
		const ttl = 10 * time.Second
		s := tl.semaphore("extend", 1, WithLeaseTTL(ttl), withClock(goClock{tl}), WithSemaphoreHooks(h.hooks()))
		l := mustTry(t, s)
		tl.at(8 * time.Second)
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("Extend at t0+8s: %v", err)
		}
		score, err := b.Client.ZScore(ctx, s.keys[0], l.ID()).Result()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := int64(score), redistest.Epoch.Add(18*time.Second).UnixMicro(); got != want {
			t.Fatalf("expiry after Extend at t0+8s: t0%+v, want t0+18s", time.Duration(got-redistest.Epoch.UnixMicro())*time.Microsecond)
		}
		tl.at(15 * time.Second) // past the first TTL, the slot is still taken
		wantDenied(t, s, 3*time.Second)

		tl.at(19 * time.Second) // expired at t0+18s
		if err := l.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Extend after expiry: %v, want ErrLeaseLost", err)
		}
		if err := l.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Extend of a lost lease: %v, want ErrLeaseLost", err)
		}
		if err := l.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release of a lost lease: %v, want ErrLeaseLost", err)
		}
		if released, lost := h.counts(); lost != 1 || len(released) != 0 {
			t.Fatalf("hooks: LeaseLost %d times, Released %v; want LeaseLost once, no Released", lost, released)
		}
		ran := false
		if err := l.Hold(ctx, func(context.Context) error { ran = true; return nil }); !errors.Is(err, ErrLeaseLost) || ran {
			t.Fatalf("Hold of a lost lease: %v, fn ran %v; want ErrLeaseLost and fn not run", err, ran)
		}
	})
}

// Release frees the slot at once and reports the time held; releasing again does
// nothing; a released lease cannot be extended or held.
func TestLeaseRelease(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		var h leaseHooks
		s := tl.semaphore("release", 1, WithLeaseTTL(time.Minute), withClock(goClock{tl}), WithSemaphoreHooks(h.hooks()))
		l := mustTry(t, s)
		wantDenied(t, s, time.Minute)
		tl.at(3 * time.Second)
		if err := l.Release(ctx); err != nil {
			t.Fatalf("Release: %v", err)
		}
		if err := l.Release(ctx); err != nil {
			t.Fatalf("second Release: %v, want nil", err)
		}
		if released, lost := h.counts(); len(released) != 1 || released[0] != 3*time.Second || lost != 0 {
			t.Fatalf("hooks: Released %v, LeaseLost %d; want Released once after 3s, no LeaseLost", released, lost)
		}
		if err := l.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Extend of a released lease: %v, want ErrLeaseLost", err)
		}
		ran := false
		if err := l.Hold(ctx, func(context.Context) error { ran = true; return nil }); !errors.Is(err, ErrLeaseLost) || ran {
			t.Fatalf("Hold of a released lease: %v, fn ran %v; want ErrLeaseLost and fn not run", err, ran)
		}
		next := mustTry(t, s) // the slot is free at once, not after the TTL

		// a lease that expired before its Release frees nothing: the slot is next's now
		tl.at(2 * time.Minute)
		other := mustTry(t, s)
		if err := next.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Release after expiry: %v, want ErrLeaseLost", err)
		}
		if _, err := b.Client.ZScore(ctx, s.keys[0], other.ID()).Result(); err != nil {
			t.Fatalf("the expired lease's Release removed the new holder's lease: %v", err)
		}
		wantDenied(t, s, time.Minute)
		if _, lost := h.counts(); lost != 1 {
			t.Fatalf("LeaseLost %d times, want once", lost)
		}
	})
}

// stepClock is a clock.Clock whose timers fire only when the test says: pending
// waits until a timer is set, fire moves the clock (and the timeline's scripts) to its
// deadline and fires it. Hold's renewals then run on the test's time, however busy the
// machine is.
type stepClock struct {
	tl     *timeline
	mu     sync.Mutex
	now    time.Time
	timers chan *stepTimer
}

type stepTimer struct {
	at time.Time
	c  chan time.Time
}

func newStepClock(tl *timeline) *stepClock {
	return &stepClock{tl: tl, now: tl.now, timers: make(chan *stepTimer, 16)}
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) NewTimer(d time.Duration) clock.Timer {
	tm := &stepTimer{at: c.Now().Add(d), c: make(chan time.Time, 1)}
	c.timers <- tm
	return tm
}

func (tm *stepTimer) C() <-chan time.Time { return tm.c }
func (tm *stepTimer) Stop() bool          { return true }

// pending returns the next timer set, waiting for it.
func (c *stepClock) pending(t *testing.T) *stepTimer {
	t.Helper()
	select {
	case tm := <-c.timers:
		return tm
	case <-time.After(signalWait):
		t.Fatalf("no timer set within %v", signalWait)
		return nil
	}
}

// fire moves the clock to tm's deadline and fires it.
func (c *stepClock) fire(tm *stepTimer) {
	c.mu.Lock()
	c.now = tm.at
	c.mu.Unlock()
	c.tl.at(tm.at.Sub(redistest.Epoch))
	tm.c <- tm.at
}

// Hold extends the lease while fn runs, well past one TTL, and releases it after; a
// lease lost meanwhile cancels fn's context with ErrLeaseLost. The renewals run on a
// clock the test steps (TTL 9s: one every 3s of the test's time).
func TestLeaseHoldRenews(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		clock := newStepClock(tl)
		const ttl = 9 * time.Second
		s := tl.semaphore("hold", 1, WithLeaseTTL(ttl), withClock(clock))
		l := mustTry(t, s)
		err := l.Hold(ctx, func(ctx context.Context) error {
			for i := 1; i <= 12; i++ { // 4 TTLs
				tm := clock.pending(t)
				if want := redistest.Epoch.Add(time.Duration(i) * ttl / 3); tm.at != want {
					return fmt.Errorf("renewal %d set for t0%+v, want every TTL/3", i, tm.at.Sub(redistest.Epoch))
				}
				clock.fire(tm)
			}
			clock.pending(t) // set once the 12th renewal is done; never fired
			if ctx.Err() != nil {
				return context.Cause(ctx)
			}
			score, err := b.Client.ZScore(ctx, s.keys[0], l.ID()).Result()
			if err != nil {
				return fmt.Errorf("lease gone after 4 TTLs of holding: %v", err)
			}
			if got, want := int64(score), redistest.Epoch.Add(4*ttl+ttl).UnixMicro(); got != want {
				return fmt.Errorf("lease expires at t0%+v, want one TTL after the 12th renewal (t0+45s)",
					time.Duration(got-redistest.Epoch.UnixMicro())*time.Microsecond)
			}
			if other, _, err := s.TryAcquire(ctx); other != nil || err != nil {
				return fmt.Errorf("TryAcquire while held: %v, %v", other, err)
			}
			return errors.New("fn's error")
		})
		if err == nil || err.Error() != "fn's error" {
			t.Fatalf("Hold = %v, want fn's error", err)
		}
		if n, _ := b.Client.ZCard(ctx, s.keys[0]).Result(); n != 0 {
			t.Fatalf("%d leases after Hold returned, want 0", n)
		}
		if err := l.Hold(ctx, func(context.Context) error { return nil }); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Hold of a released lease: %v, want ErrLeaseLost", err)
		}

		// a lease lost while held: fn's context ends at the next renewal
		l = mustTry(t, s)
		var cause error
		err = l.Hold(ctx, func(ctx context.Context) error {
			if err := b.Client.ZRem(ctx, s.keys[0], l.ID()).Err(); err != nil {
				return err
			}
			tm := clock.pending(t)
			clock.fire(tm)
			select {
			case <-ctx.Done():
				cause = context.Cause(ctx)
			case <-time.After(signalWait):
			}
			return nil
		})
		if err != nil || !errors.Is(cause, ErrLeaseLost) {
			t.Fatalf("Hold after the lease was lost: %v, cause %v; want nil and ErrLeaseLost", err, cause)
		}
	})
}

// When no extension succeeds for a whole TTL (Redis unreachable), Hold gives the
// lease up: fn's context ends with a cause wrapping ErrLeaseLost, and the LeaseLost
// hook runs, once (the final Release that finds the lease expired does not report it
// again). The lease TTL is 150ms on the real clock; fn waits up
// to 10s for the cancel, so a busy machine only makes the test slower.
func TestLeaseHoldGivesUpWithoutRedis(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	var h leaseHooks
	const ttl = 150 * ms
	s, err := NewSemaphore(b.Client, "unreachable", 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(ttl), WithSemaphoreHooks(h.hooks()))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now() // before the grant, which is what a TTL without renewal counts from
	l := mustTry(t, s)
	var cause error
	err = l.Hold(ctx, func(ctx context.Context) error {
		b.SetError("LOADING Redis is loading the dataset in memory")
		defer b.SetError("")
		select {
		case <-ctx.Done():
			cause = context.Cause(ctx)
		case <-time.After(10 * time.Second):
		}
		return nil
	})
	if err != nil {
		t.Fatalf("Hold = %v, want fn's nil", err)
	}
	if !errors.Is(cause, ErrLeaseLost) {
		t.Fatalf("fn's context cause %v, want one wrapping ErrLeaseLost", cause)
	}
	if held := time.Since(start); held < ttl {
		t.Fatalf("gave the lease up after %v, before a whole TTL (%v) without renewal", held, ttl)
	}
	if _, lost := h.counts(); lost != 1 {
		t.Fatalf("LeaseLost %d times, want once", lost)
	}
}

// A holder whose function panics still releases its lease: the panic goes on, the slot
// comes back at once.
func TestLeaseHoldReleasesOnPanic(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	sem, err := NewSemaphore(b.Client, "panicky", 1, WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	l, _, err := sem.TryAcquire(ctx)
	if err != nil || l == nil {
		t.Fatalf("TryAcquire: %v %v", l, err)
	}
	func() {
		defer func() {
			if r := recover(); r != "boom" {
				t.Fatalf("recovered %v, want the handler's panic", r)
			}
		}()
		_ = l.Hold(ctx, func(context.Context) error { panic("boom") })
	}()
	if next, _, err := sem.TryAcquire(ctx); err != nil || next == nil {
		t.Fatalf("slot after a panicking holder: %v %v; want it free", next, err)
	}
}
