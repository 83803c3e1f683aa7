package throttle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Bookings by task (asynq's) go through internal/booking: a context carrying a
// *booking.Task makes Limiter.Reserve book for the task, and Semaphore.TryAcquire and
// Acquire queue in the task's place.

// taskCtx returns ctx carrying the task id, late use allowed within late.
func taskCtx(ctx context.Context, id string, late time.Duration) (context.Context, *booking.Task) {
	task := &booking.Task{ID: id, Late: late}
	return booking.With(ctx, task), task
}

// reserveForLate books n for the task id (late use within late) within an hour, and
// reports whether the task's booking was found rather than made; it fails the test
// unless something is booked.
func reserveForLate(t *testing.T, l *Limiter, id string, n int, late time.Duration) (*waiter.Reservation, bool) {
	t.Helper()
	ctx, task := taskCtx(context.Background(), id, late)
	r, err := l.Reserve(ctx, n, time.Hour)
	if err != nil {
		t.Fatalf("Reserve for %q (n=%d): %v", id, n, err)
	}
	if !r.OK() {
		t.Fatalf("Reserve for %q (n=%d): not booked (delay %v)", id, n, r.Delay())
	}
	return r, task.Kept
}

// reserveFor is reserveForLate without late use.
func reserveFor(t *testing.T, l *Limiter, id string, n int) (*waiter.Reservation, bool) {
	t.Helper()
	return reserveForLate(t, l, id, n, 0)
}

// bookingKey returns the name of the task id's booking record on l's key.
func (l *Limiter) bookingKey(id string) string { return keys.Name(l.t.tag, keys.Booking+id) }

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
				reserveFor(t, l, "task-d", 2)
				if _, kept := reserveFor(t, l, "task-d", 2); !kept {
					t.Fatal("d back at once: not kept")
				}
				e, kept := reserveFor(t, l, "task-e", 1)
				if kept || e.Delay() <= 0 {
					t.Fatalf("e: kept %v delay %v, want a booking ahead", kept, e.Delay())
				}
				if err := e.Cancel(ctx); err != nil {
					t.Fatal(err)
				}
				if n, err := b.Client.Exists(ctx, l.bookingKey("task-e")).Result(); err != nil || n != 0 {
					t.Fatalf("e's record after its Cancel: %d, %v; want gone", n, err)
				}
				if _, kept := reserveFor(t, l, "task-e", 1); kept {
					t.Fatal("e kept a cancelled booking")
				}
			})
		})
	}
}

// A give-back cancels a booking only as its giver holds it. A server shut down while
// its task slept on its booking gives the booking back, and asynq puts the task back
// in the queue; its copy, run by another server, takes the booking over by task ID.
// When the give-back reaches Redis after the take-over, it must leave the booking
// alone: the copy runs on it, and a permit given back would be granted a second time
// (one more than the limit). The copy can still give it back; and a give-back that
// comes first leaves nothing for the copy to take over. Every algorithm, every
// backend, both orders.
func TestReserveForGiveBackAfterTakeOver(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		var mu sync.Mutex
		cancelled := 0
		hooks := WithHooks(Hooks{Cancelled: func(string, int) { mu.Lock(); cancelled++; mu.Unlock() }})
		l := tl.limiter("takeover", PerSecond(1), WithAlgorithm(alg), WithBuckets(10), hooks)
		cancels := func() int { mu.Lock(); defer mu.Unlock(); return cancelled }
		ctx := context.Background()
		if res, err := l.Allow(ctx); err != nil || !res.Allowed { // use up the first second
			t.Fatalf("Allow: %+v, %v", res, err)
		}
		// the stopped server's booking, and its task's copy taking it over
		stopped, kept := reserveFor(t, l, "task-a", 1)
		if kept || stopped.Delay() <= 0 {
			t.Fatalf("booking: kept %v delay %v, want a new booking ahead", kept, stopped.Delay())
		}
		cp, kept := reserveFor(t, l, "task-a", 1)
		if !kept || cp.Delay() != stopped.Delay() {
			t.Fatalf("copy: kept %v delay %v, want the booking at %v", kept, cp.Delay(), stopped.Delay())
		}
		// the stopped server's give-back arrives late: nothing given back
		if err := stopped.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		if got := cancels(); got != 0 {
			t.Fatalf("give-back after the take-over: %d cancelled, want 0", got)
		}
		// the copy's permit still counts: the next booking comes after it
		c, _ := reserveFor(t, l, "task-c", 1)
		if c.Delay() <= cp.Delay() {
			t.Fatalf("next booking at %v, not after the copy's at %v: its permit was given back", c.Delay(), cp.Delay())
		}
		if err := c.Cancel(ctx); err != nil { // the last booking: given back by every algorithm
			t.Fatal(err)
		}
		if got := cancels(); got != 1 {
			t.Fatalf("the next booking's give-back: %d cancelled, want 1", got)
		}
		// the copy gives its booking back: that works, and the record is gone (a key
		// of its own: the fixed window gives back only in the latest window)
		l = tl.limiter("takeover2", PerSecond(1), WithAlgorithm(alg), WithBuckets(10), hooks)
		if res, err := l.Allow(ctx); err != nil || !res.Allowed {
			t.Fatalf("Allow: %+v, %v", res, err)
		}
		if _, kept := reserveFor(t, l, "task-f", 1); kept {
			t.Fatal("task-f: kept a booking it never made")
		}
		cp, kept = reserveFor(t, l, "task-f", 1)
		if !kept {
			t.Fatal("task-f's copy: not kept")
		}
		if err := cp.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		if got := cancels(); got != 2 {
			t.Fatalf("the copy's give-back: %d cancelled in all, want 2", got)
		}
		if _, kept := reserveFor(t, l, "task-f", 1); kept {
			t.Fatal("task-f kept a booking its holder gave back")
		}
		// the other order: the give-back first, then the copy books anew
		d, _ := reserveFor(t, l, "task-d", 1)
		if err := d.Cancel(ctx); err != nil {
			t.Fatal(err)
		}
		if got := cancels(); got != 3 {
			t.Fatalf("give-back before the take-over: %d cancelled in all, want 3", got)
		}
		if _, kept := reserveFor(t, l, "task-d", 1); kept {
			t.Fatal("task-d's copy kept a booking given back")
		}
		// a give-back that comes twice (the first one's caller left) counts once
		e, _ := reserveFor(t, l, "task-e", 1)
		for range 2 {
			if err := e.Cancel(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := cancels(); got != 4 {
			t.Fatalf("a give-back twice: %d cancelled in all, want 4", got)
		}
	})
}

// A task's arguments are checked before anything is sent: an id empty or longer than
// booking.MaxID, a negative late use; nothing is written.
func TestReserveForArguments(t *testing.T) {
	b := redistest.NewMini(t)
	l, err := New(b.Client, "args", PerSecond(1), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSemaphore(b.Client, "args", 1, WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range []*booking.Task{{ID: ""}, {ID: strings.Repeat("x", booking.MaxID+1)}, {ID: "x", Late: -1}} {
		ctx := booking.With(context.Background(), task)
		if _, err := l.Reserve(ctx, 1, 0); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Reserve for %d-byte id, late %v: got %v, want ErrInvalidArgument", len(task.ID), task.Late, err)
		}
		if _, _, err := s.TryAcquire(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("TryAcquire for %d-byte id, late %v: got %v, want ErrInvalidArgument", len(task.ID), task.Late, err)
		}
		if _, err := s.Acquire(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("Acquire for %d-byte id, late %v: got %v, want ErrInvalidArgument", len(task.ID), task.Late, err)
		}
	}
	if _, err := l.Reserve(booking.With(context.Background(), &booking.Task{ID: "x"}), 1, -1); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("Reserve for a task, maxWait -1: got %v, want ErrInvalidArgument", err)
	}
	if n := len(b.Mini.Keys()); n != 0 {
		t.Errorf("%d keys written by refused calls, want 0", n)
	}
}

// A task's booking whose time passed within Late is used at once and without a new
// grant; one passed by more is booked anew.
func TestReserveForLate(t *testing.T) {
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("late", PerSecond(2), WithAlgorithm(alg), WithBuckets(10))
		ctx := context.Background()
		for range 2 { // use up the first second
			if res, err := l.Allow(ctx); err != nil || !res.Allowed {
				t.Fatalf("Allow: %+v, %v", res, err)
			}
		}
		a, kept := reserveForLate(t, l, "task-a", 1, 500*ms)
		if kept || a.Delay() <= 0 {
			t.Fatalf("first booking of a: kept %v delay %v, want a new booking ahead", kept, a.Delay())
		}
		bb, _ := reserveForLate(t, l, "task-b", 1, 500*ms)
		dA, dB := a.Delay(), bb.Delay() // from t0
		// a comes back 300ms after its slot: its booking, due at once
		tl.at(dA + 300*ms)
		if a2, kept := reserveForLate(t, l, "task-a", 1, 500*ms); !kept || a2.Delay() != 0 {
			t.Fatalf("a back 300ms late within 500ms: kept %v delay %v, want its booking, now", kept, a2.Delay())
		}
		// b comes back 600ms after its slot: a new booking
		tl.at(dB + 600*ms)
		if _, kept := reserveForLate(t, l, "task-b", 1, 500*ms); kept {
			t.Fatal("b back 600ms late kept a booking passed by more than 500ms")
		}
	})
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
	record := l.bookingKey("gone")
	if !b.Mini.Exists(record) {
		t.Fatalf("keys after a booking: %v, want %s among them", b.Mini.Keys(), record)
	}
	tl.at(r.Delay() + 2*time.Second)
	if n := keysUnder(t, b); n != 0 {
		t.Fatalf("%d keys left after the booking's time (%v), want none: the booking and the state gone", n, b.Mini.Keys())
	}
}

// Work that is away keeps its place in the semaphore's queue: places taken by a task's
// TryAcquire are served in arrival order, a slot freed while the work is away is kept
// for it as a lease, which its next TryAcquire gets; a newcomer waits behind them; a
// task's Acquire waits in the place and keeps it when its context ends.
func TestTryAcquireForKeepsThePlace(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("place", 1, WithLeaseTTL(time.Minute))
		tryFor := func(id string) (*Lease, time.Duration, error) {
			tctx, _ := taskCtx(ctx, id, 0)
			return s.TryAcquire(tctx)
		}
		holder := mustTry(t, s)
		for _, id := range []string{"task-a", "task-b", "task-c"} {
			l, wait, err := tryFor(id)
			if err != nil || l != nil || wait <= 0 {
				t.Fatalf("TryAcquire for %s on a full semaphore: %v, %v, %v; want a place and a wait", id, l, wait, err)
			}
		}
		if n := placesQueued(t, b, s); n != 3 {
			t.Fatalf("%d places queued, want 3", n)
		}
		if _, _, err := tryFor("task-b"); err != nil { // b back early: still 3 places, b's kept
			t.Fatal(err)
		}
		if n := placesQueued(t, b, s); n != 3 {
			t.Fatalf("after b came back early: %d places queued, want 3", n)
		}
		wantDenied(t, s, time.Minute) // a newcomer goes behind them

		// The holder leaves while a, b and c are away: the slot is kept for a.
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if l, _, err := tryFor("task-b"); err != nil || l != nil {
			t.Fatalf("b, back before a: %v, %v; want no lease (a's turn)", l, err)
		}
		a, _, err := tryFor("task-a")
		if err != nil || a == nil {
			t.Fatalf("a, back after the release: %v, %v; want the slot kept for it", a, err)
		}

		// b waits in its place; c's Acquire gives up and keeps its place.
		short, cancel := context.WithTimeout(ctx, 100*ms)
		cctx, _ := taskCtx(short, "task-c", 0)
		if _, err := s.Acquire(cctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Acquire for c with the slot taken: %v, want DeadlineExceeded", err)
		}
		cancel()
		if n := placesQueued(t, b, s); n != 2 {
			t.Fatalf("%d places queued after c gave up waiting, want 2 (b, c)", n)
		}
		got := make(chan *Lease, 1)
		go func() {
			bctx, _ := taskCtx(ctx, "task-b", 0)
			l, err := s.Acquire(bctx)
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
		eventually(t, signalWait, "b's Acquire listening for its place", func() bool { return ctlPlaceListening(s, "task-b") })
		if err := a.Release(ctx); err != nil {
			t.Fatal(err)
		}
		bl := <-got
		if bl == nil {
			t.Fatal("b got no lease")
		}
		if err := bl.Release(ctx); err != nil { // c's turn, c is away: kept for c
			t.Fatal(err)
		}
		wantDenied(t, s, time.Minute)
		cl, _, err := tryFor("task-c")
		if err != nil || cl == nil {
			t.Fatalf("c, back: %v, %v; want the slot kept for it", cl, err)
		}
		if err := cl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := keysUnder(t, b); n != 0 {
			t.Fatalf("%d keys left after every lease was released", n)
		}
	})
}

// ctlPlaceListening reports whether an Acquire of s waits in the task id's place with its
// subscription confirmed, so that a hand-off to the place reaches it.
func ctlPlaceListening(s *Semaphore, id string) bool {
	place := (&booking.Task{ID: id}).Place()
	h := s.client().hub
	h.mu.Lock()
	defer h.mu.Unlock()
	ch := h.chans[s.channel]
	if ch == nil || !ch.live {
		return false
	}
	for l := range ch.listeners {
		if l.place == place {
			return true
		}
	}
	return false
}

// A kept place outlives a call whose reply comes after its caller left: a task's
// Acquire whose context ends while Redis's answer is held back returns the context's
// error and the place stays for the task's next call (a late reply to a plain Acquire
// gives its place back; to a task's it must not).
//
// The call's reply is held back 300ms by the proxy; the test waits until the client
// has read it (a hook says so) and then up to 1s for a release of the place, which
// correct code never sends: a starved machine can only make a wrong release come too
// late to be seen, not make the test fail.
func TestAcquireForKeepsThePlaceOnALateReply(t *testing.T) {
	b := redistest.NewStandalone(t)
	proxy, err := redistest.NewProxy(b.Client.(*redis.Client).Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr})
	defer rdb.Close()
	place := (&booking.Task{ID: "task-c"}).Place()
	calls := &idCalls{id: place}
	rdb.AddHook(calls)
	ctx := context.Background()
	s, err := NewSemaphore(rdb, "late-place", 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	holder := mustTry(t, s)
	defer holder.Release(ctx)
	cctx, _ := taskCtx(ctx, "task-c", 0)
	if l, wait, err := s.TryAcquire(cctx); err != nil || l != nil || wait <= 0 {
		t.Fatalf("TryAcquire for c on a full semaphore: %v, %v, %v; want a place", l, wait, err)
	}
	proxy.Delay(place, 300*ms)
	short, cancel := context.WithCancel(cctx)
	go func() { // the caller leaves once its call is on its way
		for calls.sent(semAcquire) < 2 {
			time.Sleep(ms)
		}
		cancel()
	}()
	_, err = s.Acquire(short)
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Acquire for c through a slow Redis, left while its call was in flight: %v, want context.Canceled", err)
	}
	proxy.Delay("", 0)
	eventually(t, signalWait, "the held-back reply read", func() bool { return calls.done(semAcquire) >= 2 })
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * ms) {
		if n := calls.sent(semRelease); n > 0 {
			t.Fatalf("the late reply to the task's Acquire gave the kept place back (%d releases of the place)", n)
		}
	}
	if n := placesQueued(t, b, s); n != 1 {
		t.Fatalf("%d places queued after the late reply, want 1 (c's)", n)
	}
}

// idCalls counts the semaphore script calls for one place, by operation: sent, and done
// (reply read). A script call carries requests of four fields (op, token, place, join).
type idCalls struct {
	id             string
	mu             sync.Mutex
	sentBy, doneBy map[int]int
}

func (c *idCalls) ops(cmd redis.Cmder) []int {
	args := cmd.Args()
	if len(args) < 4 {
		return nil
	}
	nkeys, ok := args[2].(int)
	if !ok || len(args) < 4+nkeys {
		return nil
	}
	argv := args[3+nkeys:]
	k, ok := argv[0].(int)
	if !ok || len(argv) < 1+4*k {
		return nil
	}
	var ops []int
	for r := range k {
		if argv[1+4*r+2] == c.id {
			if op, ok := argv[1+4*r].(int); ok {
				ops = append(ops, op)
			}
		}
	}
	return ops
}

func (c *idCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *idCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		ops := c.ops(cmd)
		c.count(ops, true)
		err := next(ctx, cmd)
		c.count(ops, false)
		return err
	}
}

func (c *idCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { // a script call runs in MULTI/EXEC
		var ops []int
		for _, cmd := range cmds {
			ops = append(ops, c.ops(cmd)...)
		}
		c.count(ops, true)
		err := next(ctx, cmds)
		c.count(ops, false)
		return err
	}
}

func (c *idCalls) count(ops []int, sent bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sentBy == nil {
		c.sentBy, c.doneBy = map[int]int{}, map[int]int{}
	}
	for _, op := range ops {
		if sent {
			c.sentBy[op]++
		} else {
			c.doneBy[op]++
		}
	}
}

func (c *idCalls) sent(op int) int { c.mu.Lock(); defer c.mu.Unlock(); return c.sentBy[op] }
func (c *idCalls) done(op int) int { c.mu.Lock(); defer c.mu.Unlock(); return c.doneBy[op] }
