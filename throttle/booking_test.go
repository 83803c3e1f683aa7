package throttle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
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
		l := tl.limiter("takeover", PerSecond(1), WithAlgorithm(alg), WithBuckets(10),
			WithHooks(Hooks{Cancelled: func(string, int) { mu.Lock(); cancelled++; mu.Unlock() }}))
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
		// the copy gives its booking back: that works, and the record is gone
		// (a key of its own: the token bucket and the fixed window give back
		// only the latest booking)
		l2 := tl.limiter("takeover2", PerSecond(1), WithAlgorithm(alg), WithBuckets(10),
			WithHooks(Hooks{Cancelled: func(string, int) { mu.Lock(); cancelled++; mu.Unlock() }}))
		l = l2
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

// ReserveForLate uses a booking whose time passed within late, at once and without a
// new grant; one passed by more is booked anew, as ReserveFor does.
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
		late := func(id string, within time.Duration) (*waiter.Reservation, bool) {
			t.Helper()
			r, kept, err := l.ReserveForLate(ctx, id, 1, within)
			if err != nil || !r.OK() {
				t.Fatalf("ReserveForLate(%q): %v, %v", id, r, err)
			}
			return r, kept
		}
		a, kept := late("task-a", 500*ms)
		if kept || a.Delay() <= 0 {
			t.Fatalf("first booking of a: kept %v delay %v, want a new booking ahead", kept, a.Delay())
		}
		bb, _ := late("task-b", 500*ms)
		dA, dB := a.Delay(), bb.Delay() // from t0
		// a comes back 300ms after its slot: its booking, due at once
		tl.at(dA + 300*ms)
		if a2, kept := late("task-a", 500*ms); !kept || a2.Delay() != 0 {
			t.Fatalf("a back 300ms late within 500ms: kept %v delay %v, want its booking, now", kept, a2.Delay())
		}
		// b comes back 600ms after its slot: a new booking
		tl.at(dB + 600*ms)
		if _, kept := late("task-b", 500*ms); kept {
			t.Fatal("b back 600ms late kept a booking passed by more than 500ms")
		}
		if _, _, err := l.ReserveForLate(ctx, "task-c", 1, -1); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ReserveForLate(late -1): %v, want ErrInvalidArgument", err)
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

// Work that is away keeps its place in the semaphore's queue: places taken by
// TryAcquireFor are served in arrival order, a slot freed while the work is away is
// kept for it as a lease, which its next TryAcquireFor gets; a newcomer waits behind
// them; AcquireFor waits in the place and keeps it when its context ends.
func TestTryAcquireForKeepsThePlace(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		tl := newTimeline(t, b)
		s := tl.semaphore("place", 1, WithLeaseTTL(time.Minute))
		holder := mustTry(t, s)
		for _, id := range []string{"task-a", "task-b", "task-c"} {
			l, wait, err := s.TryAcquireFor(ctx, id)
			if err != nil || l != nil || wait <= 0 {
				t.Fatalf("TryAcquireFor(%s) on a full semaphore: %v, %v, %v; want a place and a wait", id, l, wait, err)
			}
		}
		if n := queued(t, b, s); n != 3 {
			t.Fatalf("%d places queued, want 3", n)
		}
		if _, _, err := s.TryAcquireFor(ctx, "task-b"); err != nil { // b back early: still 3 places, b's kept
			t.Fatal(err)
		}
		if n := queued(t, b, s); n != 3 {
			t.Fatalf("after b came back early: %d places queued, want 3", n)
		}
		wantDenied(t, s, time.Minute) // a newcomer goes behind them

		// The holder leaves while a, b and c are away: the slot is kept for a.
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if l, _, err := s.TryAcquireFor(ctx, "task-b"); err != nil || l != nil {
			t.Fatalf("b, back before a: %v, %v; want no lease (a's turn)", l, err)
		}
		a, _, err := s.TryAcquireFor(ctx, "task-a")
		if err != nil || a == nil {
			t.Fatalf("a, back after the release: %v, %v; want the slot kept for it", a, err)
		}

		// b waits in its place; c's AcquireFor gives up and keeps its place.
		short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		if _, err := s.AcquireFor(short, "task-c"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("AcquireFor(c) with the slot taken: %v, want DeadlineExceeded", err)
		}
		cancel()
		if n := queued(t, b, s); n != 2 {
			t.Fatalf("%d places queued after c gave up waiting, want 2 (b, c)", n)
		}
		got := make(chan *Lease, 1)
		go func() {
			l, err := s.AcquireFor(ctx, "task-b")
			if err != nil {
				t.Error(err)
			}
			got <- l
		}()
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
		cl, _, err := s.TryAcquireFor(ctx, "task-c")
		if err != nil || cl == nil {
			t.Fatalf("c, back: %v, %v; want the slot kept for it", cl, err)
		}
		if err := cl.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.TryAcquireFor(ctx, ""); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("TryAcquireFor(\"\"): %v, want ErrInvalidArgument", err)
		}
		if _, err := s.AcquireFor(ctx, strings.Repeat("x", 513)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("AcquireFor(513 bytes): %v, want ErrInvalidArgument", err)
		}
		if n := keysUnder(t, b); n != 0 {
			t.Fatalf("%d keys left after every lease was released", n)
		}
	})
}

// A kept place outlives a call whose reply comes after its caller left: AcquireFor
// with a deadline shorter than Redis's answer returns DeadlineExceeded and the place
// stays for the next call with the id (a late reply to a plain Acquire gives its place
// back; to AcquireFor it must not). Seen under load in TestTryAcquireForKeepsThePlace,
// where the 100ms deadline passed while the queuing call was in flight.
//
// The call's reply is held back 300ms by the proxy; the test waits until the client
// has read it (a hook says so) and then up to 1s for a release of the id, which
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
	lid, err := leaseIDFor("task-c")
	if err != nil {
		t.Fatal(err)
	}
	calls := &idCalls{id: lid}
	rdb.AddHook(calls)
	ctx := context.Background()
	s, err := NewSemaphore(rdb, "late-place", 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	holder := mustTry(t, s)
	defer holder.Release(ctx)
	if l, wait, err := s.TryAcquireFor(ctx, "task-c"); err != nil || l != nil || wait <= 0 {
		t.Fatalf("TryAcquireFor(c) on a full semaphore: %v, %v, %v; want a place", l, wait, err)
	}
	proxy.Delay(lid, 300*ms)
	short, cancel := context.WithTimeout(ctx, 50*ms)
	_, err = s.AcquireFor(short, "task-c")
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("AcquireFor(c) through a slow Redis: %v, want DeadlineExceeded", err)
	}
	proxy.Delay("", 0)
	eventually(t, signalWait, "the held-back reply read", func() bool { return calls.done(semAcquire) >= 2 })
	for end := time.Now().Add(time.Second); time.Now().Before(end); time.Sleep(5 * ms) {
		if n := calls.sent(semRelease); n > 0 {
			t.Fatalf("the late reply to AcquireFor gave the kept place back (%d releases of the id)", n)
		}
	}
	if n := queued(t, b, s); n != 1 {
		t.Fatalf("%d places queued after the late reply, want 1 (c's)", n)
	}
}

// idCalls counts the semaphore script calls for one lease id, by operation: sent,
// and done (reply read).
type idCalls struct {
	id             string
	mu             sync.Mutex
	sentBy, doneBy map[int]int
}

func (c *idCalls) op(cmd redis.Cmder) (int, bool) {
	args := cmd.Args()
	if len(args) < 3 {
		return 0, false
	}
	nkeys, ok := args[2].(int)
	if !ok || len(args) < 3+nkeys+2 || args[3+nkeys+1] != c.id {
		return 0, false
	}
	op, ok := args[3+nkeys].(int)
	return op, ok
}

func (c *idCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *idCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		var ops []int
		if op, ok := c.op(cmd); ok {
			ops = append(ops, op)
		}
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
			if op, ok := c.op(cmd); ok {
				ops = append(ops, op)
			}
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
