package throttle

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A cancelled or expired Wait returns at once, whatever Redis does; what it booked is
// given back in the background, at most once, bounded by the call timeout, and
// reported to Hooks.RedisError if that fails.

// sendTrip is a go-redis hook that calls before with each pipeline of script calls as
// it is sent and after once its replies (or error) came, while armed; it disarms
// itself after the first such pipeline.
type sendTrip struct {
	armed         atomic.Bool
	before, after func()
}

func (h *sendTrip) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *sendTrip) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *sendTrip) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		scripts := false
		for _, cmd := range cmds {
			scripts = scripts || sendIsEval(cmd)
		}
		if !scripts || !h.armed.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		if h.before != nil {
			h.before()
		}
		err := next(ctx, cmds)
		if h.after != nil {
			h.after()
		}
		return err
	}
}

// sendWatch records what a Limiter's hooks report of its give-backs and failures.
type sendWatch struct {
	cancelled atomic.Int64
	mu        sync.Mutex
	redisErrs []error
}

func (w *sendWatch) hooks() Hooks {
	return Hooks{
		Cancelled: func(string, int) { w.cancelled.Add(1) },
		RedisError: func(_ string, err error) {
			w.mu.Lock()
			w.redisErrs = append(w.redisErrs, err)
			w.mu.Unlock()
		},
	}
}

func (w *sendWatch) errs() []error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]error(nil), w.redisErrs...)
}

// sendSlowLimiter returns a limiter of limit on key through a proxy in front of the
// real server, on the fake-clock script with the server's clock standing still (so
// that a booking's wait does not depend on how late its call runs), with its hooks
// reporting to a sendWatch, and a hook on its client to arm.
func sendSlowLimiter(t *testing.T, key string, limit Limit, opts ...Option) (*Limiter, *redistest.Proxy, *sendWatch, *sendTrip, *redistest.Grants) {
	t.Helper()
	direct, proxy, rdb := redistest.NewProxied(t)
	w := &sendWatch{}
	trip := &sendTrip{}
	rdb.AddHook(trip)
	grants := redistest.RecordGrants(rdb)
	opts = append([]Option{WithKeyPrefix(direct.Prefix), WithHooks(w.hooks())}, opts...)
	l, err := New(rdb, key, limit, opts...)
	if err != nil {
		t.Fatal(err)
	}
	l.useScript(fakeClock[l.t.script])
	direct.SetTime(t, redistest.Epoch, "{"+direct.Prefix+key+"}")
	if err := rdb.ScriptLoad(context.Background(), l.t.script.src).Err(); err != nil { // one EVALSHA a call
		t.Fatal(err)
	}
	return l, proxy, w, trip, grants
}

// sendOneGiveBack waits until one give-back of the limiter's reached Redis and was
// reported, then checks that no second one follows: a round trip made after it finds
// exactly one.
func sendOneGiveBack(t *testing.T, l *Limiter, w *sendWatch, grants *redistest.Grants) {
	t.Helper()
	sendEventually(t, signalWait, "the booking given back (Cancelled hook)", func() bool { return w.cancelled.Load() > 0 })
	if _, err := l.AllowN(context.Background(), 0); err != nil {
		t.Fatal(err)
	}
	if gb := grants.GiveBacks(); len(gb) != 1 || !gb[0].OK || w.cancelled.Load() != 1 {
		t.Fatalf("give-backs: got %+v (Cancelled hook %d times), want one that gave back", gb, w.cancelled.Load())
	}
}

// With Redis stalled (a server that accepts connections and never answers), a Wait
// cancelled, or whose deadline passes, while its call is in flight returns at once,
// with context.Canceled, or with ErrUnavailable and context.DeadlineExceeded.
func TestWaitLeavesAtOnceWhileRedisStalls(t *testing.T) {
	hung := hungServer(t)
	for _, c := range []struct {
		name   string
		expire bool
	}{{"cancelled", false}, {"expired", true}} {
		t.Run(c.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: hung.Addr})
			defer rdb.Close()
			trip := &sendTrip{}
			rdb.AddHook(trip)
			l, err := New(rdb, "stalled", PerSecond(10))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if c.expire {
				ctx, cancel = context.WithTimeout(context.Background(), 200*ms)
			} else {
				trip.before = cancel // the call is in flight: its caller leaves
			}
			defer cancel()
			trip.armed.Store(true)
			err, after, ended := sendLeaves(ctx, l.Wait)
			want := errors.Is(err, context.Canceled) && !errors.Is(err, ErrUnavailable)
			if c.expire {
				want = errors.Is(err, ErrUnavailable) && errors.Is(err, context.DeadlineExceeded)
			}
			if !want || !ended || after > sendPrompt {
				t.Fatalf("Wait %s in flight: got %v, %v after its context ended (ended first: %v); want its error within %v",
					c.name, err, after, ended, sendPrompt)
			}
			redistest.Figure(t, "Wait %s while Redis stalls: returned %v after its context ended, as the test saw it", c.name, after.Round(time.Microsecond))
		})
	}
}

// With replies 300ms late, a Wait cancelled, or whose deadline passes, while its call
// is in flight returns at once, before the reply comes; the booking the reply brings
// is given back, once. (A Wait whose 150ms deadline passed before its round trip went,
// on a loaded machine, booked nothing: the scenario runs again.)
func TestWaitLeavesAtOnceWhileRepliesAreLate(t *testing.T) {
	for _, c := range []struct {
		name   string
		expire bool
	}{{"cancelled", false}, {"expired", true}} {
		t.Run(c.name, func(t *testing.T) {
			for attempt := 1; ; attempt++ {
				// one permit per 100ms, taken: the Wait books 100ms ahead (the server's
				// clock stands still), within a 150ms deadline
				l, proxy, w, trip, grants := sendSlowLimiter(t, "late-"+c.name, Limit{Rate: 1, Period: 100 * ms})
				if res, err := l.Allow(context.Background()); err != nil || !res.Allowed {
					t.Fatalf("Allow: got %+v, %v; want allowed", res, err)
				}
				proxy.Delay("evalsha", 300*ms)
				var sent, replied atomic.Bool
				trip.before = func() { sent.Store(true) }
				trip.after = func() { replied.Store(true) }
				ctx, cancel := context.WithCancel(context.Background())
				if c.expire {
					ctx, cancel = context.WithTimeout(context.Background(), 150*ms)
				} else {
					trip.before = func() { sent.Store(true); cancel() }
				}
				trip.armed.Store(true)
				err, after, ended := sendLeaves(ctx, l.Wait)
				cancel()
				early := !replied.Load()
				went := !trip.armed.CompareAndSwap(true, false)
				for went && !sent.Load() {
					time.Sleep(100 * time.Microsecond)
				}
				if !went {
					if attempt == 5 {
						t.Fatalf("in %d attempts the Wait's call never went before its deadline, want it in flight then", attempt)
					}
					t.Logf("attempt %d: the Wait left before its round trip went (a loaded machine); again", attempt)
					continue
				}
				want := errors.Is(err, context.Canceled)
				if c.expire {
					want = errors.Is(err, ErrUnavailable) && errors.Is(err, context.DeadlineExceeded)
				}
				if !want || !ended || !early || after > sendPrompt {
					t.Fatalf("Wait %s in flight: got %v, %v after its context ended (ended first: %v, before the reply: %v); want its error within %v, before the reply",
						c.name, err, after, ended, early, sendPrompt)
				}
				redistest.Figure(t, "Wait %s with replies 300ms late: returned %v after its context ended, as the test saw it, before the reply", c.name, after.Round(time.Microsecond))
				proxy.Delay("", 0)
				sendOneGiveBack(t, l, w, grants)
				if errs := w.errs(); len(errs) != 0 {
					t.Fatalf("RedisError hook: got %v, want nothing (the give-back worked)", errs)
				}
				return
			}
		})
	}
}

// A Wait cancelled while it sleeps on its booking returns at once; with replies 300ms
// late, its give-back reaches Redis after that, once.
func TestWaitLeavesAtOnceAsleep(t *testing.T) {
	l, proxy, w, _, grants := sendSlowLimiter(t, "asleep", Limit{Rate: 1, Period: time.Hour})
	ctx := context.Background()
	if res, err := l.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("Allow: got %+v, %v; want allowed", res, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	var err error
	var after time.Duration
	var ended bool
	go func() {
		defer close(done)
		err, after, ended = sendLeaves(wctx, l.Wait)
	}()
	sendEventually(t, signalWait, "the Wait asleep on its booking", func() bool { return grants.Total() == 2 && sendSleepers(l) == 1 })
	proxy.Delay("evalsha", 300*ms)
	cancel()
	<-done
	if !errors.Is(err, context.Canceled) || !ended || after > sendPrompt {
		t.Fatalf("Wait cancelled asleep: got %v, %v after the cancel (cancelled first: %v); want context.Canceled within %v", err, after, ended, sendPrompt)
	}
	if w.cancelled.Load() != 0 {
		t.Fatal("the give-back was done before Wait returned, want it in the background")
	}
	sendOneGiveBack(t, l, w, grants)
}

// sendSleepers returns how many Waits of the process sleep on l's key.
func sendSleepers(l *Limiter) int {
	ks := l.client().key(l.t.tag)
	ks.mu.Lock()
	defer ks.mu.Unlock()
	return len(ks.sleepers)
}

// A give-back that fails is reported to Hooks.RedisError, once, by the call timeout:
// Redis stalls once the Wait's booking came back (before the Wait goes to sleep on it,
// and subscribes to the key's wake-ups: nothing of that may hold the Wait), its
// context ends, and it returns at once; its give-back gets no reply.
func TestWaitGiveBackFailureReported(t *testing.T) {
	const bound = 300 * ms
	l, proxy, w, trip, _ := sendSlowLimiter(t, "giveback-fails", Limit{Rate: 1, Period: time.Hour}, WithCallTimeout(bound))
	ctx := context.Background()
	if res, err := l.Allow(ctx); err != nil || !res.Allowed {
		t.Fatalf("Allow: got %+v, %v; want allowed", res, err)
	}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	trip.after = func() { // the booking's reply is in: Redis stalls, the caller leaves
		proxy.Hang(true)
		cancel()
	}
	trip.armed.Store(true)
	err, after, ended := sendLeaves(wctx, l.Wait)
	if !errors.Is(err, context.Canceled) || !ended || after > sendPrompt {
		t.Fatalf("Wait cancelled as its booking came: got %v, %v after the cancel (cancelled first: %v); want context.Canceled within %v",
			err, after, ended, sendPrompt)
	}
	sendEventually(t, signalWait, "the failed give-back reported", func() bool { return len(w.errs()) > 0 })
	time.Sleep(bound) // a second report would come within another call timeout
	errs := w.errs()
	if len(errs) != 1 || !errors.Is(errs[0], ErrUnavailable) || w.cancelled.Load() != 0 {
		t.Fatalf("RedisError hook: got %v (Cancelled hook %d times), want one ErrUnavailable and no Cancelled", errs, w.cancelled.Load())
	}
}

// A semaphore call whose caller leaves before its reply comes (its reply is held until
// the caller has returned) gives back what the reply brought, once, before the
// process's next call on the key: a lease granted is released, for a caller and for a
// task (asynqmw's booking, whose call keeps its place when it leaves); a task denied
// keeps the place its call took. TryAcquire and Acquire, on every backend.
func TestSemaphoreLeaseGrantedAfterItsCallerLeft(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		trip := &sendTrip{}
		b.Client.AddHook(trip)
		tl := newTimeline(t, b)
		ctx := context.Background()
		for _, c := range []struct {
			name    string
			task    bool
			acquire bool
		}{{"TryAcquire", false, false}, {"Acquire", false, true}, {"a task's TryAcquire", true, false}, {"a task's Acquire", true, true}} {
			s := tl.semaphore(strings.ReplaceAll(c.name, " ", "-"), 1, WithLeaseTTL(time.Minute))
			// leave runs a call whose reply is held until its caller has returned
			leave := func(ctx context.Context) error {
				cctx, cancel := context.WithCancel(ctx)
				returned := make(chan struct{})
				trip.before = nil
				trip.after = func() { cancel(); <-returned }
				trip.armed.Store(true)
				var err error
				var lease *Lease
				if c.acquire {
					lease, err = s.Acquire(cctx)
				} else {
					lease, _, err = s.TryAcquire(cctx)
				}
				close(returned)
				if lease != nil {
					t.Fatalf("%s: got a lease, want its caller gone before the reply", c.name)
				}
				return err
			}
			call := ctx
			if c.task {
				call = booking.With(ctx, &booking.Task{ID: "task-" + c.name})
			}
			if err := leave(call); !errors.Is(err, context.Canceled) {
				t.Fatalf("%s, its caller leaving: %v, want context.Canceled", c.name, err)
			}
			if trip.armed.Load() {
				t.Fatalf("%s: no script call went", c.name)
			}
			if st, err := s.Inspect(ctx); err != nil || st.Held != 0 || st.Waiting != 0 {
				t.Errorf("%s: after its caller left, the next call finds %+v, %v; want no lease held, none waiting", c.name, st, err)
			}
			if !c.task || c.acquire {
				continue
			}
			// denied, a task keeps its place (TryAcquire's call takes one; Acquire's
			// first takes one only once its wake-ups are heard)
			holder := mustTry(t, s)
			if err := leave(call); !errors.Is(err, context.Canceled) {
				t.Fatalf("%s, its caller leaving: %v, want context.Canceled", c.name, err)
			}
			if st, err := s.Inspect(ctx); err != nil || st.Held != 1 || st.Waiting != 1 {
				t.Errorf("%s denied: after its caller left, the next call finds %+v, %v; want 1 held, its place kept", c.name, st, err)
			}
			if err := holder.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
	})
}
