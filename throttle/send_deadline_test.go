package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Every call returns by its context's end and its call timeout, whatever Redis and
// go-redis do; what a reply brings after its caller left is given back.

// sendBound starts the test's own timer of d, standing for a call's bound (its call
// timeout) that starts now, and returns how long after that timer ran the call
// returns, to call when it has: the call's watchdog and the test's timer are both
// runtime timers, which a starved process runs late alike, so that the delay is the
// call's own. It returns 0 for a call that returned before the timer ran.
func sendBound(d time.Duration) (since func() time.Duration) {
	start := time.Now()
	var fired atomic.Pointer[time.Time]
	time.AfterFunc(d, func() {
		now := time.Now()
		fired.Store(&now)
	})
	return func() time.Duration {
		returned := time.Now()
		if returned.Sub(start) < d {
			return 0
		}
		for fired.Load() == nil {
			time.Sleep(100 * time.Microsecond)
		}
		return max(0, returned.Sub(*fired.Load()))
	}
}

// sendPrompt is the most a call may take to return after its context ends, measured
// from the end as a goroutine of the test sees it (sendLeaves): the promise is 0.1s;
// the bound leaves a loaded machine room to run the goroutine, and stays below the
// 300ms by which the tests' late replies come, so a call that waited for its reply
// fails it.
const sendPrompt = 250 * time.Millisecond

// sendLeaves runs f(ctx) and returns its error and how long after ctx ended f
// returned, the end being when a goroutine started by context.AfterFunc ran: what
// the test sees of the end, not the timer's due time, which a starved runtime may
// fire late. ended is false when f returned before ctx ended (a deadline passed by
// the clock has ended it, whether its timer ran yet or not).
func sendLeaves(ctx context.Context, f func(context.Context) error) (err error, after time.Duration, ended bool) {
	var end atomic.Pointer[time.Time]
	stop := context.AfterFunc(ctx, func() {
		now := time.Now()
		end.Store(&now)
	})
	defer stop()
	err = f(ctx)
	returned := time.Now()
	if dl, ok := ctx.Deadline(); ctx.Err() == nil && (!ok || returned.Before(dl)) {
		return err, 0, false
	}
	// the AfterFunc goroutine may not have run yet: its end is no later than now
	for end.Load() == nil {
		time.Sleep(100 * time.Microsecond)
	}
	return err, max(0, returned.Sub(*end.Load())), true
}

// sendClientOption is a go-redis option set a new user might build a client with.
type sendClientOption struct {
	name string
	set  func(*redis.Options)
}

// client returns a client of addr with the option set; it closes with the test.
func (o sendClientOption) client(t *testing.T, addr string) *redis.Client {
	opts := &redis.Options{Addr: addr}
	o.set(opts)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// sendClientOptions are the option sets the deadline tests run on.
var sendClientOptions = []sendClientOption{
	{"defaults", func(*redis.Options) {}},
	{"ContextTimeoutEnabled", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
	{"no read timeout", func(o *redis.Options) { o.ReadTimeout = -1 }},
	{"no retries", func(o *redis.Options) { o.MaxRetries = -1 }},
}

// sendCallNamed makes the call named, Wait, Allow, Reserve or Pause on l, TryAcquire or
// Acquire on s, and returns its error.
func sendCallNamed(ctx context.Context, call string, l *Limiter, s *Semaphore) error {
	var err error
	switch call {
	case "Wait":
		err = l.Wait(ctx)
	case "Allow":
		_, err = l.Allow(ctx)
	case "Reserve":
		_, err = l.Reserve(ctx, 1, time.Minute)
	case "Pause":
		err = l.Pause(ctx, time.Second)
	case "TryAcquire":
		_, _, err = s.TryAcquire(ctx)
	case "Acquire":
		_, err = s.Acquire(ctx)
	default:
		panic("sendCallNamed: unknown call " + call)
	}
	return err
}

// Against a Redis that accepts connections and never answers, Wait, Allow, Reserve
// and Pause return at once when their context's deadline passes, with an error wrapping
// ErrUnavailable and context.DeadlineExceeded, whatever the client's options:
// go-redis alone, without ContextTimeoutEnabled, waits its ReadTimeout (5s) per try
// and tries 4 times.
func TestDeadlineHoldsAgainstHungRedis(t *testing.T) {
	hung := hungServer(t)
	const deadline = 300 * time.Millisecond
	var (
		mu    sync.Mutex
		worst time.Duration
	)
	// the calls of one option set at once, the sets one after the other: a crowd of
	// goroutines all woken at one deadline would measure the scheduler's queue
	for _, o := range sendClientOptions {
		var wg sync.WaitGroup
		for _, call := range []string{"Wait", "Allow", "Reserve", "Pause"} {
			wg.Add(1)
			rdb := o.client(t, hung.Addr)
			go func() {
				defer wg.Done()
				l, err := New(rdb, "hung", PerSecond(10))
				if err != nil {
					t.Error(err)
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), deadline)
				defer cancel()
				err, late, ended := sendLeaves(ctx, func(ctx context.Context) error { return sendCallNamed(ctx, call, l, nil) })
				mu.Lock()
				worst = max(worst, late)
				mu.Unlock()
				if !ended {
					t.Errorf("%s/%s returned %v before its deadline, want it to wait for it", o.name, call, err)
				}
				if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s/%s: got %v, want ErrUnavailable and context.DeadlineExceeded", o.name, call, err)
				}
				if late > sendPrompt {
					t.Errorf("%s/%s returned %v after its deadline, want at most %v", o.name, call, late, sendPrompt)
				}
			}()
		}
		wg.Wait()
	}
	redistest.Figure(t, "hung Redis, 300ms deadline, %d option sets × Wait/Allow/Reserve/Pause: latest return %v after the deadline as the test saw it (promise 100ms)",
		len(sendClientOptions), worst.Round(time.Millisecond))
}

// A call whose context has no deadline but is cancelled returns ctx.Err() when it is,
// even on a client that never times a read out, and on one that honours deadlines
// (go-redis does not stop a read when its context is cancelled).
func TestCancelHoldsAgainstHungRedis(t *testing.T) {
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", cte), func(t *testing.T) {
			hung := hungServer(t)
			rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, ReadTimeout: -1, ContextTimeoutEnabled: cte})
			defer rdb.Close()
			l, err := New(rdb, "hung", PerSecond(10))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(300*ms, cancel)
			err, late, ended := sendLeaves(ctx, func(ctx context.Context) error {
				_, err := l.Allow(ctx)
				return err
			})
			if !ended || !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) || late > sendPrompt {
				t.Errorf("Allow cancelled after 300ms: got %v, %v after the cancel (cancelled first: %v); want context.Canceled within %v",
					err, late, ended, sendPrompt)
			}
		})
	}
}

// A booking whose reply reaches the client after its caller left (the deadline passed
// while Redis was slow) is given back: the next caller gets its slot.
func TestLateGrantGivenBack(t *testing.T) {
	sendCheckLateGrantGivenBack(t, "late", "a 100ms deadline", 100*time.Millisecond)
}

// A booking whose reply comes after its call's own bound (WithCallTimeout) passed, the
// caller's context having no deadline, is given back as after a deadline.
func TestLateGrantGivenBackAfterCallTimeout(t *testing.T) {
	sendCheckLateGrantGivenBack(t, "late-bound", "a 100ms call timeout", 0, WithCallTimeout(100*time.Millisecond))
}

// sendCheckLateGrantGivenBack takes the permit of this second on a limiter of one a
// second through a proxy, then books the next through it with the proxy holding
// script calls back 400ms, on a call that gives up after 100ms: by its context's
// deadline (within, when > 0) or by the limiter's options (WithCallTimeout). The
// booking the caller never saw must be given back (the Cancelled hook), once, so that
// the next Reserve gets the slot within the second rather than a second later. bound
// names the call's limit in messages.
//
// Only the delayed call goes through the limiter with opts: the calls before and
// after it use a limiter of the same key without them, since a starved machine can
// take 100ms over an undelayed call. The delayed call's reply comes 400ms after it was
// sent, whatever the load; a call that left before it was sent (its round trip had not
// gone within its 100ms) booked nothing, and the scenario runs again on a key of its
// own.
func sendCheckLateGrantGivenBack(t *testing.T, key, bound string, within time.Duration, opts ...Option) {
	t.Helper()
	b, proxy, rdb := redistest.NewProxied(t)
	trip := &sendTrip{}
	rdb.AddHook(trip)
	cancelled := make(chan string, 16)
	opts = append([]Option{WithKeyPrefix(b.Prefix), WithHooks(Hooks{Cancelled: func(key string, n int) {
		cancelled <- fmt.Sprintf("%s %d", key, n)
	}})}, opts...)
	ctx := context.Background()
	for attempt := 1; ; attempt++ {
		key := fmt.Sprint(key, attempt)
		l, err := New(rdb, key, Every(time.Second), opts...)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := New(rdb, key, Every(time.Second), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if res, err := plain.Allow(ctx); err != nil || !res.Allowed { // the permit of this second
			t.Fatalf("Allow: got %+v, %v; want allowed", res, err)
		}
		var sent atomic.Bool
		trip.before = func() { sent.Store(true) }
		trip.armed.Store(true)
		proxy.Delay("evalsha", 400*time.Millisecond)
		short, cancel := ctx, context.CancelFunc(func() {})
		if within > 0 {
			short, cancel = context.WithTimeout(ctx, within)
		}
		_, err = l.Reserve(short, 1, time.Minute)
		cancel()
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Reserve through a slow Redis with %s: got %v, want ErrUnavailable", bound, err)
		}
		// the give-back, sent when the late reply comes, is not held back
		proxy.Delay("", 0)
		// disarmed by the hook if the round trip went
		went := !trip.armed.CompareAndSwap(true, false)
		for went && !sent.Load() {
			time.Sleep(100 * time.Microsecond)
		}
		if !went {
			if attempt == 5 {
				t.Fatalf("in %d attempts the call never went before %s passed, want it in flight then", attempt, bound)
			}
			t.Logf("attempt %d: the call left before its round trip went (a loaded machine); again", attempt)
			continue
		}
		select {
		case got := <-cancelled:
			if want := key + " 1"; got != want {
				t.Fatalf("gave back %q (key, permits), want %q", got, want)
			}
		case <-time.After(signalWait):
			t.Fatalf("the booking its caller never saw was not given back within %v", signalWait)
		}
		r, err := plain.Reserve(ctx, 1, time.Minute)
		if err != nil || !r.OK() || r.Delay() > time.Second {
			t.Fatalf("Reserve after the give-back: got %v, %v; want the slot within the second (not a second later)", r, err)
		}
		select {
		case got := <-cancelled:
			t.Fatalf("a second give-back (%s), want one", got)
		default:
		}
		return
	}
}

// A semaphore lease granted by a reply that reaches the client after its caller left
// is released: the slot does not stay taken for a lease TTL.
//
// The proxy holds every script call back 1s: the acquire runs 1s after the caller
// left at 100ms, and the release its late reply brings runs 1s after that, so the
// lease set is seen holding the lease (the acquire did run and grant) and then empty.
// (A call that left before its round trip went, on a loaded machine, took nothing:
// the scenario runs again, on a key of its own.)
func TestLateLeaseGivenBack(t *testing.T) {
	const slow = time.Second
	b, proxy, rdb := redistest.NewProxied(t)
	trip := &sendTrip{}
	rdb.AddHook(trip)
	for attempt := 1; ; attempt++ {
		s, err := NewSemaphore(rdb, fmt.Sprint("late-lease", attempt), 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		held := func() int64 { // leases in the lease set, read past the proxy
			n, err := b.Client.ZCard(context.Background(), s.t.keys[0]).Result()
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
		// one lease first, so the server has the script: the late call is one EVALSHA
		// (a NOSCRIPT answer would come after the caller left, and no EVAL would follow)
		if err := mustTry(t, s).Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		var sent atomic.Bool
		trip.before = func() { sent.Store(true) }
		trip.armed.Store(true)
		proxy.Delay("evalsha", slow)
		short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		l, _, err := s.TryAcquire(short)
		cancel()
		if l != nil || !errors.Is(err, ErrUnavailable) {
			t.Fatalf("TryAcquire through a slow Redis with a 100ms deadline: got %v, %v; want ErrUnavailable", l, err)
		}
		went := !trip.armed.CompareAndSwap(true, false)
		for went && !sent.Load() {
			time.Sleep(100 * time.Microsecond)
		}
		if !went {
			proxy.Delay("", 0)
			if attempt == 5 {
				t.Fatalf("in %d attempts the call never went before its deadline, want it in flight then", attempt)
			}
			t.Logf("attempt %d: the call left before its round trip went (a loaded machine); again", attempt)
			continue
		}
		sendEventually(t, signalWait, "the late acquire took the slot", func() bool { return held() == 1 })
		proxy.Delay("", 0)
		// released by the late reply's handler: well within 10s, where the TTL is a minute
		sendEventually(t, signalWait, "the late lease released", func() bool { return held() == 0 })
		return
	}
}

// WithCallTimeout bounds every call, with a context that has no deadline too, whatever
// the client's options (without read timeouts a call would otherwise wait forever):
// each returns an error wrapping ErrUnavailable, not context.DeadlineExceeded (the
// caller's context did not end).
func TestCallTimeoutHoldsAgainstHungRedis(t *testing.T) {
	hung := hungServer(t)
	const bound = 300 * time.Millisecond
	var (
		mu    sync.Mutex
		worst time.Duration
	)
	// the calls of one option set at once, the sets one after the other: a crowd of
	// goroutines all woken at one bound would measure the scheduler's queue
	for _, o := range sendClientOptions {
		var wg sync.WaitGroup
		for _, call := range []string{"Wait", "Allow", "Reserve", "Pause", "TryAcquire", "Acquire"} {
			for _, ctxKind := range []string{"Background", "1h deadline"} {
				wg.Add(1)
				rdb := o.client(t, hung.Addr)
				go func() {
					defer wg.Done()
					l, err := New(rdb, "hung", PerSecond(10), WithCallTimeout(bound))
					if err != nil {
						t.Error(err)
						return
					}
					s, err := NewSemaphore(rdb, "hung", 1, WithCallTimeout(bound))
					if err != nil {
						t.Error(err)
						return
					}
					ctx, cancel := context.Background(), context.CancelFunc(func() {})
					if ctxKind != "Background" {
						ctx, cancel = context.WithTimeout(ctx, time.Hour)
					}
					defer cancel()
					start, since := time.Now(), sendBound(bound)
					err = sendCallNamed(ctx, call, l, s)
					late, took := since(), time.Since(start)
					mu.Lock()
					worst = max(worst, late)
					mu.Unlock()
					what := o.name + "/" + call + "/" + ctxKind
					if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s after %v: got %v, want ErrUnavailable and not context.DeadlineExceeded", what, took, err)
					}
					if took < bound || late > sendPrompt {
						t.Errorf("%s returned after %v, %v after the bound as the test saw it; want %v, and at most %v after it",
							what, took, late, bound, sendPrompt)
					}
				}()
			}
		}
		wg.Wait()
	}
	redistest.Figure(t, "hung Redis, WithCallTimeout(%v), %d option sets × 6 calls × Background and a 1h deadline: latest return %v after the bound as the test saw it",
		bound, len(sendClientOptions), worst.Round(time.Millisecond))
}

// Without WithCallTimeout, a call's bound is one try of the client's own timeouts:
// DialTimeout + WriteTimeout + ReadTimeout, go-redis's defaults for those unset or
// disabled.
func TestDefaultCallTimeout(t *testing.T) {
	ms100 := 100 * time.Millisecond
	for _, c := range []struct {
		name string
		rdb  redis.UniversalClient
		set  time.Duration
		want time.Duration
	}{
		{"go-redis defaults", redis.NewClient(&redis.Options{}), 0, 15 * time.Second},
		{"set", redis.NewClient(&redis.Options{}), time.Second, time.Second},
		{"own timeouts", redis.NewClient(&redis.Options{DialTimeout: ms100, ReadTimeout: 2 * ms100, WriteTimeout: 3 * ms100}), 0, 6 * ms100},
		{"write timeout from read's", redis.NewClient(&redis.Options{DialTimeout: ms100, ReadTimeout: 2 * ms100}), 0, 5 * ms100},
		{"timeouts disabled", redis.NewClient(&redis.Options{DialTimeout: ms100, ReadTimeout: -1, WriteTimeout: -2}), 0, ms100 + 10*time.Second},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{DialTimeout: ms100, ReadTimeout: ms100, WriteTimeout: ms100}), 0, 3 * ms100},
		{"ring", redis.NewRing(&redis.RingOptions{DialTimeout: ms100, ReadTimeout: ms100, WriteTimeout: ms100}), 0, 3 * ms100},
		{"failover", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", DialTimeout: ms100, ReadTimeout: ms100}), 0, 3 * ms100},
	} {
		if got := callTimeout(c.set, c.rdb); got != c.want {
			t.Errorf("%s: got call timeout %v, want %v", c.name, got, c.want)
		}
		c.rdb.Close()
	}
	rdb := redis.NewClient(&redis.Options{})
	defer rdb.Close()
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := New(rdb, "k", PerSecond(1), WithCallTimeout(d)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("New with WithCallTimeout(%v): got %v, want ErrInvalidArgument", d, err)
		}
		if _, err := NewSemaphore(rdb, "k", 1, WithCallTimeout(d)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("NewSemaphore with WithCallTimeout(%v): got %v, want ErrInvalidArgument", d, err)
		}
	}
}

// The default bound holds against a hung Redis where go-redis alone would retry: a
// client of 100ms timeouts and 10 retries returns by its 300ms bound (go-redis alone:
// 11 tries of 100ms, and backoff).
func TestDefaultCallTimeoutHoldsAgainstHungRedis(t *testing.T) {
	hung := hungServer(t)
	const bound = 300 * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, DialTimeout: bound / 3, ReadTimeout: bound / 3, WriteTimeout: bound / 3, MaxRetries: 10})
	defer rdb.Close()
	l, err := New(rdb, "hung", PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	start, since := time.Now(), sendBound(bound)
	_, err = l.Allow(context.Background())
	late, took := since(), time.Since(start)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || took < bound || late > sendPrompt {
		t.Errorf("Allow without a deadline: got %v after %v, %v after the bound as the test saw it; want ErrUnavailable after %v, at most %v after it",
			err, took, late, bound, sendPrompt)
	}
}

// Calls queued behind others (going in a later round trip) are bounded by the call
// timeout too, from when they were made.
func TestCallTimeoutHoldsForQueuedCalls(t *testing.T) {
	hung := hungServer(t)
	const bound, callers = 300 * time.Millisecond, 8
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr})
	defer rdb.Close()
	l, err := New(rdb, "hung", PerSecond(10), WithCallTimeout(bound))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start, since := time.Now(), sendBound(bound)
			_, err := l.Allow(context.Background())
			late, took := since(), time.Since(start)
			if !errors.Is(err, ErrUnavailable) || took < bound || late > sendPrompt {
				t.Errorf("Allow %d of %d at once: got %v after %v, %v after the bound as the test saw it; want ErrUnavailable after %v, at most %v after it",
					i, callers, err, took, late, bound, sendPrompt)
			}
		}()
	}
	wg.Wait()
}

// A round trip sent to a Redis that accepts connections and never answers fails each
// of its callers with an error wrapping ErrUnavailable: when the client's read timeout
// ends the round trip first (the call's bound is later), and when the call timeout
// passes first. So does one sent to a port that refuses connections.
func TestBatchHungRedis(t *testing.T) {
	hung := hungServer(t)
	const short = 200 * time.Millisecond
	for _, c := range []struct {
		name  string
		addr  string
		read  time.Duration // the client's ReadTimeout
		bound time.Duration // WithCallTimeout
	}{
		{"hung, read timeout first", hung.Addr, short, time.Hour},
		{"hung, call timeout first", hung.Addr, -1, short},
		{"refused", redistest.RefusedAddr, short, time.Hour},
	} {
		t.Run(c.name, func(t *testing.T) {
			// (one dial: go-redis's pool otherwise dials a refused port 5 times, 100ms
			// apart, 400ms in all, which is no part of what the test checks)
			rdb := redis.NewClient(&redis.Options{Addr: c.addr, ReadTimeout: c.read, MaxRetries: -1, DialTimeout: short, DialerRetries: 1})
			defer rdb.Close()
			for _, ctxKind := range []string{"Background", "1h deadline"} {
				l, err := New(rdb, "hung-batch", PerSecond(10), WithCallTimeout(c.bound))
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := context.Background(), context.CancelFunc(func() {})
				if ctxKind != "Background" {
					ctx, cancel = context.WithTimeout(ctx, time.Hour)
				}
				since := sendBound(short) // the round trip's bound starts no earlier
				got := sendRunBatch(t, l.client(), 3, func(int) sendOutcome { return sendCall{false, 1, 0}.run(ctx, l) })
				late := since()
				cancel()
				for i, g := range got {
					if !errors.Is(g.errv, ErrUnavailable) || errors.Is(g.errv, ErrUnexpectedReply) {
						t.Errorf("%s: call %d of a round trip: got %v, want ErrUnavailable", ctxKind, i, g.errv)
					}
				}
				if late > sendPrompt {
					t.Errorf("%s: the round trip's calls returned %v after %v as the test saw it, want at most %v after it", ctxKind, late, short, sendPrompt)
				}
			}
		})
	}
}

// A call left without a reply by its bound (its deadline, its call timeout) counts as
// Redis unreachable for the failure policy, as any failed call does: under FailOpen,
// against a Redis that stopped answering, it opens the key's breaker, so that the
// calls after it within the quiet time are granted at once rather than each waiting
// for its own bound.
func TestNoReplyOpensTheBreaker(t *testing.T) {
	hung := hungServer(t)
	for _, c := range []struct {
		name     string
		deadline bool
	}{{"deadline", true}, {"call timeout", false}} {
		t.Run(c.name, func(t *testing.T) {
			rdb := redis.NewClient(&redis.Options{Addr: hung.Addr})
			defer rdb.Close()
			l, err := New(rdb, "breaker", PerSecond(10), WithFailurePolicy(FailOpen), WithCallTimeout(200*ms))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if c.deadline {
				ctx, cancel = context.WithTimeout(ctx, 100*ms)
			}
			defer cancel()
			start := time.Now()
			res, err := l.Allow(ctx)
			if took := time.Since(start); err != nil || !res.Allowed || took < 100*ms {
				t.Fatalf("the first Allow: got %+v, %v after %v; want granted by FailOpen once its bound passed", res, err, took)
			}
			b := &l.client().key(l.t.tag).breaker
			b.mu.Lock()
			opened := !b.downUntil.IsZero()
			b.mu.Unlock()
			if !opened {
				t.Fatal("the breaker is closed after a call got no reply by its bound, want it open")
			}
		})
	}
}

// What a call costs against a refused port and a hung server, with go-redis's defaults
// and with the options the README recommends for limiters. Figures only: the durations
// depend on go-redis's retry and backoff settings and on the call timeout
// (WithCallTimeout). The hung server without a deadline or a call timeout set (15s,
// the default call timeout) runs with JOBTHROTTLE_LONG set.
func TestUnavailableCostFigures(t *testing.T) {
	parallel(t)
	if testing.Short() {
		t.Skip("figures only")
	}
	hung := hungServer(t)
	recommended := func(o *redis.Options) {
		o.ContextTimeoutEnabled = true
		o.DialTimeout = time.Second
		o.ReadTimeout = 500 * time.Millisecond
		o.WriteTimeout = 500 * time.Millisecond
		o.DialerRetries = 1
		o.MaxRetries = 1
	}
	type costCase struct {
		name, addr string
		set        func(*redis.Options)
		deadline   time.Duration // 0: none
		opts       []Option
	}
	var long []costCase
	if longFaultTests() { // 15s: the default call timeout, one try of go-redis's defaults (5s + 5s + 5s)
		long = append(long,
			costCase{"hung server, go-redis defaults, no deadline", hung.Addr, func(*redis.Options) {}, 0, nil},
			costCase{"hung server, no read timeout, no deadline", hung.Addr, func(o *redis.Options) { o.ReadTimeout = -1 }, 0, nil})
	}
	var wg sync.WaitGroup
	for _, c := range append([]costCase{
		{"refused port, go-redis defaults, no deadline", redistest.RefusedAddr, func(*redis.Options) {}, 0, nil},
		{"refused port, recommended options, no deadline", redistest.RefusedAddr, recommended, 0, nil},
		{"hung server, recommended options, no deadline", hung.Addr, recommended, 0, nil},
		{"hung server, go-redis defaults, 1s deadline", hung.Addr, func(*redis.Options) {}, time.Second, nil},
		{"refused port, recommended options and MaxRetries -1, no deadline", redistest.RefusedAddr, func(o *redis.Options) {
			recommended(o)
			o.MaxRetries = -1
		}, 0, nil},
		{"hung server, go-redis defaults, WithCallTimeout(1s), no deadline", hung.Addr, func(*redis.Options) {}, 0, []Option{WithCallTimeout(time.Second)}},
	}, long...) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			opts := &redis.Options{Addr: c.addr}
			c.set(opts)
			rdb := redis.NewClient(opts)
			defer rdb.Close()
			l, err := New(rdb, "cost", PerSecond(10), c.opts...)
			if err != nil {
				t.Error(err)
				return
			}
			ctx, cancel := context.Background(), context.CancelFunc(func() {})
			if c.deadline > 0 {
				ctx, cancel = context.WithTimeout(ctx, c.deadline)
			}
			defer cancel()
			start := time.Now()
			_, err = l.Allow(ctx)
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) {
				t.Errorf("%s: Allow: got %v, want ErrUnavailable", c.name, err)
			}
			redistest.Figure(t, "%s: Allow took %v", c.name, took.Round(time.Millisecond))
		}()
	}
	wg.Wait()
}
