package waiter

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
)

// fakeClock is a Clock whose time moves only when the test says; timers fire then.
type fakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer
	made   chan struct{} // receives each time a timer is made
}

type fakeTimer struct {
	clock   *fakeClock
	at      time.Time
	c       chan time.Time
	stopped bool
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), made: make(chan struct{}, 16)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) NewTimer(d time.Duration) clock.Timer {
	c.mu.Lock()
	t := &fakeTimer{clock: c, at: c.now.Add(d), c: make(chan time.Time, 1)}
	c.timers = append(c.timers, t)
	c.mu.Unlock()
	c.made <- struct{}{}
	return t
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }
func (t *fakeTimer) Stop() bool {
	t.clock.mu.Lock()
	defer t.clock.mu.Unlock()
	was := !t.stopped
	t.stopped = true
	return was
}

// advance moves the clock and fires the timers that are due.
func (c *fakeClock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for _, t := range c.timers {
		if !t.stopped && !t.at.After(c.now) {
			t.stopped = true
			t.c <- c.now
		}
	}
}

// notReturned fails the test if Wait, whose result done delivers, returns within
// 10ms; when says at what point of the test it must not have.
func notReturned(t *testing.T, done <-chan error, when string) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("Wait returned %v %s", err, when)
	case <-time.After(10 * time.Millisecond):
	}
}

type cancelCount struct {
	mu sync.Mutex
	n  int
}

func (c *cancelCount) cancel(context.Context) error {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return nil
}

func (c *cancelCount) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func TestReservationWaitsUntilDue(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	var cc cancelCount
	r := NewReservation(true, time.Second, cc.cancel)
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	<-clk.made
	clk.advance(999 * time.Millisecond)
	notReturned(t, done, "before the booking was due")
	clk.advance(time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	// used: nothing to give back any more
	if err := r.Cancel(context.Background()); err != nil || cc.count() != 0 {
		t.Fatalf("Cancel after use: %v, %d cancels", err, cc.count())
	}
}

// A Wait whose context ends returns at once, however long giving the booking back
// takes, and gives it back once, in the background.
func TestReservationGivesBackWhenCtxEnds(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	release := make(chan struct{})
	gave := make(chan struct{}, 2)
	slow := func(context.Context) error { <-release; gave <- struct{}{}; return nil }
	r := NewReservation(true, time.Second, slow)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Wait(ctx) }()
	<-clk.made
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Wait: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Wait did not return while its give-back hung")
	}
	if err := r.Cancel(context.Background()); err != nil {
		t.Fatalf("second Cancel: %v; want a no-op", err)
	}
	close(release)
	<-gave
	select {
	case <-gave:
		t.Fatal("the booking was given back twice")
	case <-time.After(10 * time.Millisecond):
	}
}

// A Wait whose booking takes effect after ctx's deadline returns an error matching
// context.DeadlineExceeded and gives the booking back, once, even if the deadline's own
// timer has not run by then (a loaded machine: the select in Wait picks either of two
// ready channels). The context stands for that timer: its deadline comes halfway
// through the second the booking is due in, and its Done never closes. A booking due
// before the deadline is used as ever.
func TestReservationWakingPastItsDeadline(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	gave := make(chan struct{}, 2)
	r := NewReservation(true, time.Second, func(context.Context) error { gave <- struct{}{}; return nil })
	ctx := &lateTimerCtx{Context: context.Background(), dl: time.Now().Add(500 * time.Millisecond)}
	done := make(chan error, 1)
	go func() { done <- r.Wait(ctx) }()
	<-clk.made
	clk.advance(time.Second)
	if err := <-done; !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait woken after its deadline: got %v, want an error matching context.DeadlineExceeded", err)
	}
	<-gave
	if err := r.Cancel(context.Background()); err != nil {
		t.Fatalf("Cancel after the give-back: %v; want a no-op", err)
	}
	select {
	case <-gave:
		t.Fatal("the booking was given back twice")
	case <-time.After(10 * time.Millisecond):
	}

	var cc cancelCount
	inTime := NewReservation(true, time.Second, cc.cancel)
	ctx = &lateTimerCtx{Context: context.Background(), dl: time.Now().Add(time.Hour)}
	go func() { done <- inTime.Wait(ctx) }()
	<-clk.made
	clk.advance(time.Second)
	if err := <-done; err != nil || cc.count() != 0 {
		t.Fatalf("Wait woken before its deadline: %v, %d give-backs; want nil, none", err, cc.count())
	}
}

// lateTimerCtx is a context whose deadline dl may have passed while its Done channel is
// not closed: its timer has not run.
type lateTimerCtx struct {
	context.Context
	dl time.Time
}

func (c *lateTimerCtx) Deadline() (time.Time, bool) { return c.dl, true }

// Delay counts from now, as golang.org/x/time/rate's does: after some work, sleeping
// Delay sleeps only the rest.
func TestReservationDelayCountsFromNow(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	r := NewReservation(true, time.Second, nil)
	if got, want := r.Delay(), time.Second; got != want {
		t.Fatalf("Delay at booking %v, want %v", got, want)
	}
	clk.advance(300 * time.Millisecond)
	if got, want := r.Delay(), 700*time.Millisecond; got != want {
		t.Fatalf("Delay 300ms later %v, want %v", got, want)
	}
	clk.advance(time.Second)
	if got := r.Delay(); got != 0 {
		t.Fatalf("Delay after due %v, want 0", got)
	}
}

func TestReservationCancel(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	var cc cancelCount
	r := NewReservation(true, time.Second, cc.cancel)
	clk.advance(time.Second) // took effect: nothing to give back
	if err := r.Cancel(context.Background()); err != nil || cc.count() != 0 {
		t.Fatalf("Cancel after due: %v, %d cancels", err, cc.count())
	}
	notOK := NewReservation(false, time.Second, cc.cancel)
	if err := notOK.Cancel(context.Background()); err != nil || cc.count() != 0 {
		t.Fatalf("Cancel of a refused booking: %v, %d cancels", err, cc.count())
	}
	if err := notOK.Wait(context.Background()); !errors.Is(err, ErrNotReserved) {
		t.Fatalf("Wait of a refused booking: %v", err)
	}
	now := NewReservation(true, 0, nil)
	if err := now.Wait(context.Background()); err != nil {
		t.Fatalf("Wait of an immediate grant: %v", err)
	}
	ahead := NewReservation(true, time.Second, cc.cancel)
	if err := ahead.Cancel(context.Background()); err != nil || cc.count() != 1 {
		t.Fatalf("Cancel ahead: %v, %d cancels; want 1", err, cc.count())
	}
	if err := ahead.Cancel(context.Background()); err != nil || cc.count() != 1 {
		t.Fatalf("Cancel twice: %v, %d cancels; want 1", err, cc.count())
	}
}

// reserver answers Reserve from a script of bookings, recording the maxWait it got.
type reserver struct {
	mu       sync.Mutex
	calls    int
	maxWaits []time.Duration
	answer   func(call int) (*Reservation, error)
}

func (r *reserver) Reserve(_ context.Context, n int, maxWait time.Duration) (*Reservation, error) {
	r.mu.Lock()
	r.calls++
	call := r.calls
	r.maxWaits = append(r.maxWaits, maxWait)
	r.mu.Unlock()
	return r.answer(call)
}

func TestWaitBooksOnceAndSleeps(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	r := &reserver{answer: func(int) (*Reservation, error) {
		return NewReservation(true, 300*time.Millisecond, nil), nil
	}}
	done := make(chan error, 1)
	go func() { done <- Wait(context.Background(), r, 2) }()
	<-clk.made
	clk.advance(300 * time.Millisecond)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.calls != 1 {
		t.Fatalf("%d Reserve calls, want 1", r.calls)
	}
	if r.maxWaits[0] < time.Duration(1<<62) {
		t.Fatalf("maxWait without a deadline: %v, want unbounded", r.maxWaits[0])
	}
}

func TestWaitDeadlines(t *testing.T) {
	clk := newFakeClock()
	defer clock.Set(clk)()
	refused := &reserver{answer: func(int) (*Reservation, error) {
		return NewReservation(false, time.Minute, nil), nil
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := Wait(ctx, refused, 1)
	if !errors.Is(err, ErrWouldExceedDeadline) {
		t.Fatalf("Wait past the deadline: %v", err)
	}
	// a loop that stops at its deadline tests for context.DeadlineExceeded alone
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		t.Fatalf("Wait past the deadline: %v; want it to match context.DeadlineExceeded only", err)
	}
	if errors.Is(context.DeadlineExceeded, ErrWouldExceedDeadline) {
		t.Fatal("context.DeadlineExceeded matches ErrWouldExceedDeadline; want only the other way")
	}
	if mw := refused.maxWaits[0]; mw > 5*time.Second || mw < 4*time.Second {
		t.Fatalf("maxWait %v, want the time to the deadline (about 5s)", mw)
	}
	done, stop := context.WithCancel(context.Background())
	stop()
	if err := Wait(done, refused, 1); !errors.Is(err, context.Canceled) || refused.calls != 1 {
		t.Fatalf("Wait on a done context: %v after %d calls; want Canceled, no call", err, refused.calls)
	}
	boom := errors.New("boom")
	failing := &reserver{answer: func(int) (*Reservation, error) { return nil, boom }}
	if err := Wait(context.Background(), failing, 1); !errors.Is(err, boom) {
		t.Fatalf("Wait with a failing Reserver: %v", err)
	}
}

// waitingReserver is a Reserver with a WaitN of its own.
type waitingReserver struct {
	reserver
	waited []int
}

func (w *waitingReserver) WaitN(_ context.Context, n int) error {
	w.waited = append(w.waited, n)
	return nil
}

// A Reserver that waits for its permits itself (a *throttle.Limiter: it follows the
// pauses and resumes of its key) is left to do so.
func TestWaitUsesWaitN(t *testing.T) {
	w := &waitingReserver{}
	if err := Wait(context.Background(), w, 3); err != nil {
		t.Fatal(err)
	}
	if len(w.waited) != 1 || w.waited[0] != 3 || w.calls != 0 {
		t.Fatalf("WaitN calls %v and %d Reserve calls; want [3] and none", w.waited, w.calls)
	}
}
