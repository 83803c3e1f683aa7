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
	var cc cancelCount
	r := NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Clock: clk})
	if got, want := r.Due(), clk.Now().Add(time.Second); !got.Equal(want) {
		t.Fatalf("Due %v, want %v", got, want)
	}
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

func TestReservationGivesBackWhenCtxEnds(t *testing.T) {
	clk := newFakeClock()
	var cc cancelCount
	r := NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Clock: clk})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Wait(ctx) }()
	<-clk.made
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait: %v, want context.Canceled", err)
	}
	if cc.count() != 1 {
		t.Fatalf("%d cancels, want 1", cc.count())
	}
	if err := r.Cancel(context.Background()); err != nil || cc.count() != 1 {
		t.Fatalf("second Cancel: %v, %d cancels; want a no-op", err, cc.count())
	}
}

func TestReservationMoved(t *testing.T) {
	clk := newFakeClock()
	var cc cancelCount
	moved := make(chan struct{})
	r := NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Moved: moved, Clock: clk})
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	<-clk.made
	close(moved)
	if err := <-done; !errors.Is(err, ErrMoved) || cc.count() != 1 {
		t.Fatalf("Wait after a move: %v, %d cancels; want ErrMoved, 1", err, cc.count())
	}
}

// Delay counts from now, as golang.org/x/time/rate's does: after some work, sleeping
// Delay sleeps only the rest.
func TestReservationDelayCountsFromNow(t *testing.T) {
	clk := newFakeClock()
	r := NewReservation(Booking{OK: true, Delay: time.Second, Clock: clk})
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

// A moved booking is given back, and Wait books again through Again once Pass lets
// it, then waits for the new booking: the caller does not loop.
func TestReservationMovedBooksAgain(t *testing.T) {
	clk := newFakeClock()
	var cc cancelCount
	moved := make(chan struct{})
	var passes, agains int
	var mu sync.Mutex
	pass := func(context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		passes++
		return false, nil
	}
	again := func(_ context.Context, maxWait time.Duration) (*Reservation, error) {
		mu.Lock()
		agains++
		mu.Unlock()
		return NewReservation(Booking{OK: true, Delay: 2 * time.Second, Clock: clk}), nil
	}
	r := NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Moved: moved, Pass: pass, Again: again, Clock: clk})
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	<-clk.made
	close(moved)
	<-clk.made // the new booking's timer
	if cc.count() != 1 {
		t.Fatalf("%d cancels of the moved booking, want 1", cc.count())
	}
	clk.advance(time.Second) // the old booking's time: nothing happens
	notReturned(t, done, "at the moved booking's time")
	clk.advance(time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if passes != 1 || agains != 1 {
		t.Fatalf("%d passes (the hold before booking again), %d bookings again; want 1, 1", passes, agains)
	}
}

// Permits that took effect inside a hold (Pass reports held) are not used: Wait
// books again.
func TestReservationHeldBooksAgain(t *testing.T) {
	clk := newFakeClock()
	held := true
	agains := 0
	pass := func(context.Context) (bool, error) { h := held; held = false; return h, nil }
	again := func(context.Context, time.Duration) (*Reservation, error) {
		agains++
		return NewReservation(Booking{OK: true, Clock: clk}), nil
	}
	r := NewReservation(Booking{OK: true, Pass: pass, Again: again, Clock: clk})
	if err := r.Wait(context.Background()); err != nil || agains != 1 {
		t.Fatalf("Wait: %v after %d bookings again; want nil after 1", err, agains)
	}
	notAgain := NewReservation(Booking{OK: true, Pass: func(context.Context) (bool, error) { return true, nil }, Clock: clk})
	if err := notAgain.Wait(context.Background()); !errors.Is(err, ErrMoved) {
		t.Fatalf("Wait without Again, held: %v, want ErrMoved", err)
	}
}

func TestReservationCancel(t *testing.T) {
	clk := newFakeClock()
	var cc cancelCount
	r := NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Clock: clk})
	clk.advance(time.Second) // took effect: nothing to give back
	if err := r.Cancel(context.Background()); err != nil || cc.count() != 0 {
		t.Fatalf("Cancel after due: %v, %d cancels", err, cc.count())
	}
	notOK := NewReservation(Booking{OK: false, Delay: time.Second, Cancel: cc.cancel, Clock: clk})
	if err := notOK.Cancel(context.Background()); err != nil || cc.count() != 0 {
		t.Fatalf("Cancel of a refused booking: %v, %d cancels", err, cc.count())
	}
	if err := notOK.Wait(context.Background()); !errors.Is(err, ErrNotReserved) {
		t.Fatalf("Wait of a refused booking: %v", err)
	}
	now := NewReservation(Booking{OK: true, Clock: clk})
	if err := now.Wait(context.Background()); err != nil {
		t.Fatalf("Wait of an immediate grant: %v", err)
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
	r := &reserver{answer: func(int) (*Reservation, error) {
		return NewReservation(Booking{OK: true, Delay: 300 * time.Millisecond, Clock: clk}), nil
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
	refused := &reserver{answer: func(int) (*Reservation, error) {
		return NewReservation(Booking{OK: false, Delay: time.Minute, Clock: clk}), nil
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

// A moved booking is given back and booked again.
func TestWaitRebooksWhenMoved(t *testing.T) {
	clk := newFakeClock()
	var cc cancelCount
	moved := make(chan struct{})
	r := &reserver{answer: func(call int) (*Reservation, error) {
		if call == 1 {
			return NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Moved: moved, Clock: clk}), nil
		}
		return NewReservation(Booking{OK: true, Delay: 2 * time.Second, Clock: clk}), nil
	}}
	done := make(chan error, 1)
	go func() { done <- Wait(context.Background(), r, 1) }()
	<-clk.made
	close(moved)
	<-clk.made // the second booking's timer
	clk.advance(2 * time.Second)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if r.calls != 2 || cc.count() != 1 {
		t.Fatalf("%d bookings, %d cancels; want 2, 1", r.calls, cc.count())
	}
}

// A move that arrives once the booking is due changes nothing: the permit has taken
// effect and is used, not given back and booked again.
func TestReservationMovedWhenDue(t *testing.T) {
	clk := newFakeClock()
	var cc cancelCount
	moved := make(chan struct{})
	r := NewReservation(Booking{OK: true, Delay: time.Second, Cancel: cc.cancel, Moved: moved, Clock: clk})
	done := make(chan error, 1)
	go func() { done <- r.Wait(context.Background()) }()
	<-clk.made
	clk.mu.Lock()
	clk.now = clk.now.Add(time.Second) // due, but the timer has not fired yet
	clk.mu.Unlock()
	close(moved)
	if err := <-done; err != nil || cc.count() != 0 {
		t.Fatalf("Wait: %v with %d cancels; want nil, none", err, cc.count())
	}
}
