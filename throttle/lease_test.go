package throttle

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
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
		if _, err := b.Client.ZScore(t.Context(), s.t.keys[0], l.ID()).Result(); err != nil {
			t.Fatalf("lease %s is not in %s: %v", l.ID(), s.t.keys[0], err)
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
		s := tl.semaphore("extend", 1, WithLeaseTTL(ttl), WithSemaphoreHooks(h.hooks()))
		l := mustTry(t, s)
		tl.at(8 * time.Second)
		if err := l.Extend(ctx); err != nil {
			t.Fatalf("Extend at t0+8s: %v", err)
		}
		score, err := b.Client.ZScore(ctx, s.t.keys[0], l.ID()).Result()
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
		s := tl.semaphore("release", 1, WithLeaseTTL(time.Minute), WithSemaphoreHooks(h.hooks()))
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
		if _, err := b.Client.ZScore(ctx, s.t.keys[0], other.ID()).Result(); err != nil {
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
		setGoClock(t, clock)
		const ttl = 9 * time.Second
		s := tl.semaphore("hold", 1, WithLeaseTTL(ttl))
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
			score, err := b.Client.ZScore(ctx, s.t.keys[0], l.ID()).Result()
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
		if n, _ := b.Client.ZCard(ctx, s.t.keys[0]).Result(); n != 0 {
			t.Fatalf("%d leases after Hold returned, want 0", n)
		}
		if err := l.Hold(ctx, func(context.Context) error { return nil }); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Hold of a released lease: %v, want ErrLeaseLost", err)
		}

		// a lease lost while held: fn's context ends at the next renewal
		l = mustTry(t, s)
		var cause error
		err = l.Hold(ctx, func(ctx context.Context) error {
			if err := b.Client.ZRem(ctx, s.t.keys[0], l.ID()).Err(); err != nil {
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

// A lease belongs to its holder: its member in the lease set is the holder's token
// (Lease.ID), so a stale holder's Extend or Release never acts on another's lease. A
// holder whose lease expired and whose slot went to another gets ErrLeaseLost from
// Extend and Release, and the new holder's lease stays as it was.
func TestLeaseStaleHolderLeavesTheNewOneAlone(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("stale", 1, WithLeaseTTL(10*time.Second))
		stale := mustTry(t, s)
		tl.at(11 * time.Second) // it expired unextended
		fresh := mustTry(t, s)
		members := func() []redis.Z {
			t.Helper()
			z, err := b.Client.ZRangeWithScores(ctx, s.t.keys[0], 0, -1).Result()
			if err != nil {
				t.Fatal(err)
			}
			return z
		}
		before := members()
		if len(before) != 1 || before[0].Member != fresh.ID() {
			t.Fatalf("lease set %v, want the new holder's token %s alone", before, fresh.ID())
		}
		tl.at(12 * time.Second)
		if err := stale.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("the stale holder's Extend: got %v, want ErrLeaseLost", err)
		}
		if err := stale.Release(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("the stale holder's Release: got %v, want ErrLeaseLost", err)
		}
		if after := members(); fmt.Sprint(after) != fmt.Sprint(before) {
			t.Fatalf("lease set after the stale holder's calls: %v, want %v as it was", after, before)
		}
		wantDenied(t, s, 9*time.Second) // the new holder still holds the slot
	})
}

// A task's retry (the same task, a new handler) waits in the task's place while a
// handler the task abandoned still holds the lease and renews it: at most Max holders
// run at once. The retry gets a lease of its own (its own token) only once the
// abandoned handler releases; the abandoned handler's token then acts on nothing.
// With two copies of the task waiting in its place, a slot handed to the place goes to
// one of them only.
func TestLeaseRetryWaitsForTheAbandonedHandler(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("retry", 1, WithLeaseTTL(10*time.Second))
		tctx, _ := taskCtx(ctx, "task-r", 0)
		abandoned, _, err := s.TryAcquire(tctx)
		if err != nil || abandoned == nil {
			t.Fatalf("the first handler's TryAcquire: %v, %v; want a lease", abandoned, err)
		}
		// the retry, twice, while the abandoned handler renews past several TTLs
		for i := 1; i <= 3; i++ {
			if l, wait, err := s.TryAcquire(tctx); err != nil || l != nil || wait <= 0 {
				t.Fatalf("the retry's TryAcquire while the abandoned handler holds: %v, %v, %v; want no lease", l, wait, err)
			}
			tl.at(time.Duration(i) * 8 * time.Second)
			if err := abandoned.Extend(ctx); err != nil {
				t.Fatalf("the abandoned handler's Extend %d: %v", i, err)
			}
		}
		got := make(chan *Lease, 2)
		actx, cancel := context.WithCancel(tctx)
		defer cancel()
		for range 2 { // two copies of the task wait in its place
			go func() {
				l, err := s.Acquire(actx)
				if err != nil && !errors.Is(err, context.Canceled) {
					t.Error(err)
				}
				got <- l
			}()
		}
		eventually(t, signalWait, "the copies listening in the task's place", func() bool { return ctlPlaceListening(s, "task-r") })
		select {
		case l := <-got:
			t.Fatalf("a copy got lease %v while the abandoned handler holds", l)
		case <-time.After(20 * ms):
		}
		if n, err := b.Client.ZCard(ctx, s.t.keys[0]).Result(); err != nil || n != 1 {
			t.Fatalf("%d leases, %v; want the abandoned handler's alone", n, err)
		}
		if err := abandoned.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var retry *Lease
		select {
		case retry = <-got:
		case <-time.After(signalWait):
			t.Fatalf("no copy got the lease within %v of the release", signalWait)
		}
		if retry == nil || retry.ID() == abandoned.ID() {
			t.Fatalf("the copy's lease %v, want one of its own token", retry)
		}
		cancel() // the other copy gives up waiting
		if other := <-got; other != nil {
			t.Fatalf("both copies of the task got a lease (%s and %s), Max 1", retry.ID(), other.ID())
		}
		z, err := b.Client.ZRange(ctx, s.t.keys[0], 0, -1).Result()
		if err != nil || len(z) != 1 || z[0] != retry.ID() {
			t.Fatalf("lease set %v, %v; want the copy's token %s alone", z, err, retry.ID())
		}
		if err := abandoned.Extend(ctx); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("the abandoned handler's Extend after its release: got %v, want ErrLeaseLost", err)
		}
		if err := retry.Extend(ctx); err != nil {
			t.Fatalf("the copy's Extend: %v", err)
		}
		if err := retry.Release(ctx); err != nil {
			t.Fatal(err)
		}
	})
}

// A lease FailLocal granted is kept in the process for as long as it lives: extended
// locally after the key's state stopped mattering by the grant alone (its TTL and the
// breaker's quiet time over, by the real clock), the client's sweeps still keep it, so
// another caller of the process finds the share taken and the lease's Release frees it.
// (Before, the sweep forgot the key with the lease in it: a second lease beyond the
// share of 1, and the first one's Release or Hold's next extension ErrLeaseLost.) The
// Go side's clock stands, so the local leases never lapse; a round whose sweeps come a
// whole TTL after the extension (a busy machine) proves nothing and goes again.
func TestLeaseLocalKeptThroughTheSweep(t *testing.T) {
	setGoClock(t, stillClock{redistest.Epoch})
	ctx := context.Background()
	const ttl = 500 * ms
	for round := 0; ; round++ {
		if round == 20 {
			t.Fatalf("20 rounds whose sweeps came %v after the extension", ttl)
		}
		s, err := NewSemaphore(downClient(t), "swept", 1, WithFailurePolicy(FailLocal(1)), WithLeaseTTL(ttl))
		if err != nil {
			t.Fatal(err)
		}
		a := mustTry(t, s)
		c := s.client()
		sendEventually(t, signalWait, "the key's state idle by the grant alone", func() bool {
			v, ok := c.keys.Load(s.t.tag)
			return ok && v.(*keyState).idle(time.Now())
		})
		extended := time.Now()
		if err := a.Extend(ctx); err != nil {
			t.Fatalf("Extend of the local lease: %v", err)
		}
		sendSweep(c)
		sendSweep(c)
		if time.Since(extended) >= ttl {
			continue
		}
		if b, _, err := s.TryAcquire(ctx); err != nil || b != nil {
			t.Fatalf("TryAcquire after the sweeps: %v, %v; want none (the share of 1 is the live local lease's)", b, err)
		}
		if err := a.Release(ctx); err != nil {
			t.Fatalf("Release of the live local lease after the sweeps: %v, want nil", err)
		}
		return
	}
}

// heldReply holds the reply of the next script call once armed, until released: a
// renewal that ran on the server and answers late.
type heldReply struct {
	armed         atomic.Bool
	ran, released chan struct{}
}

func (h *heldReply) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *heldReply) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.hold()
		return err
	}
}

func (h *heldReply) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.hold()
		return err
	}
}

func (h *heldReply) hold() {
	if h.armed.CompareAndSwap(true, false) {
		close(h.ran)
		<-h.released
	}
}

// Hold cancels fn's context once the lease may have lapsed: a whole TTL after the last
// renewal that succeeded was sent, not after its reply came, and at that time, not at
// the next of the TTL/3 ticks. The renewal at t0+3s runs on the server (the lease now
// expires at t0+12s) but answers at t0+5s; Redis then refuses every call. fn's context
// must be cancelled by t0+12s on the Go side's clock (the test steps it and the server's
// together); before, Hold counted the TTL from the reply and cancelled at its next tick,
// t0+14s, two seconds in which fn ran without the lease and its slot could be another's.
func TestLeaseHoldCancelsWhenTheLeaseLapses(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	tl := newTimeline(t, b)
	clk := newStepClock(tl)
	setGoClock(t, clk)
	var h leaseHooks
	const ttl = 9 * time.Second
	s := tl.semaphore("lapse", 1, WithLeaseTTL(ttl), WithSemaphoreHooks(h.hooks()))
	late := &heldReply{ran: make(chan struct{}), released: make(chan struct{})}
	b.Client.AddHook(late)
	defer b.SetError("")
	l := mustTry(t, s)
	expiry := redistest.Epoch.Add(3*time.Second + ttl)
	var cancelledAt time.Time
	err := l.Hold(ctx, func(ctx context.Context) error {
		tm := clk.pending(t)
		clk.mu.Lock()
		clk.now = tm.at
		clk.mu.Unlock()
		tl.at(tm.at.Sub(redistest.Epoch))
		late.armed.Store(true)
		tm.c <- tm.at // t0+3s: the renewal runs; its reply is held
		select {
		case <-late.ran:
		case <-time.After(signalWait):
			return fmt.Errorf("no renewal within %v", signalWait)
		}
		if score, err := b.Client.ZScore(ctx, s.t.keys[0], l.ID()).Result(); err != nil || int64(score) != expiry.UnixMicro() {
			return fmt.Errorf("lease expiry after the renewal: %v, %v; want t0+12s", score, err)
		}
		clk.fire(&stepTimer{at: redistest.Epoch.Add(5 * time.Second), c: make(chan time.Time, 1)}) // the reply comes at t0+5s
		b.SetError("LOADING Redis is loading the dataset in memory")
		close(late.released)
		for {
			select {
			case <-ctx.Done():
				cancelledAt = clk.Now()
				return nil
			case tm := <-clk.timers:
				if tm.at.After(expiry) {
					return fmt.Errorf("next renewal set for t0+%v, after the lease lapsed (t0+12s), fn's context live", tm.at.Sub(redistest.Epoch))
				}
				clk.mu.Lock() // the Go side's only: Redis refuses the server clock's setting too
				clk.now = tm.at
				clk.mu.Unlock()
				tm.c <- tm.at
			case <-time.After(signalWait):
				return fmt.Errorf("neither a cancel nor a renewal within %v", signalWait)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if cancelledAt.After(expiry) || cancelledAt.Before(expiry) {
		t.Fatalf("fn's context cancelled at t0+%v, want t0+12s, when the lease lapsed", cancelledAt.Sub(redistest.Epoch))
	}
	if _, lost := h.counts(); lost != 1 {
		t.Fatalf("LeaseLost %d times, want once", lost)
	}
}
