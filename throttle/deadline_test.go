package throttle

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// lateBy is the scheduling delay the deadline tests tolerate between a context's
// deadline (or the reply bound) and the call's return: the return itself is one
// channel receive after the timer fires, but on the shared 2-core machine under -race
// a goroutine can wait that long to run. The goal (deadline + 50ms) is reported as a
// figure, not asserted.
const lateBy = 250 * time.Millisecond

// clientOption is a go-redis option set a new user might build a client with.
type clientOption struct {
	name string
	set  func(*redis.Options)
}

// client returns a client of addr with the option set; it closes with the test.
func (o clientOption) client(t *testing.T, addr string) *redis.Client {
	opts := &redis.Options{Addr: addr}
	o.set(opts)
	rdb := redis.NewClient(opts)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// clientOptions are the option sets the deadline tests run on.
var clientOptions = []clientOption{
	{"defaults", func(*redis.Options) {}},
	{"ContextTimeoutEnabled", func(o *redis.Options) { o.ContextTimeoutEnabled = true }},
	{"no read timeout", func(o *redis.Options) { o.ReadTimeout = -1 }},
	{"no retries", func(o *redis.Options) { o.MaxRetries = -1 }},
}

// Against a Redis that accepts connections and never answers, Wait and Allow return
// when their context's deadline passes, with an error wrapping ErrUnavailable, whatever
// the client's options: go-redis alone, without ContextTimeoutEnabled, waits its
// ReadTimeout (3s) per try and tries 4 times.
//
// Tolerance: each call returns within lateBy (250ms) of its 1s deadline.
func TestDeadlineHoldsAgainstHungRedis(t *testing.T) {
	hung := hungServer(t)
	const deadline = time.Second
	var (
		mu    sync.Mutex
		worst time.Duration
		wg    sync.WaitGroup
	)
	// every case at once, on goroutines rather than parallel subtests (-parallel is
	// GOMAXPROCS, 2 here): the test takes one deadline, not sixteen
	for _, o := range clientOptions {
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
				start := time.Now()
				err = callNamed(ctx, call, l, nil)
				took := time.Since(start)
				dl, _ := ctx.Deadline()
				late := time.Since(dl) // not took - deadline: the deadline was set before start
				mu.Lock()
				worst = max(worst, late)
				mu.Unlock()
				if !errors.Is(err, ErrUnavailable) {
					t.Errorf("%s/%s after %v: %v, want ErrUnavailable", o.name, call, took, err)
				}
				if !errors.Is(err, context.DeadlineExceeded) {
					t.Errorf("%s/%s: %v does not match context.DeadlineExceeded; want it to (the deadline passed too)", o.name, call, err)
				}
				if late > lateBy || late < 0 {
					t.Errorf("%s/%s returned %v after its deadline (after %v), want 0 to %v", o.name, call, late, took, lateBy)
				}
			}()
		}
	}
	wg.Wait()
	redistest.Figure(t, "hung Redis, 1s deadline, %d option sets × Wait/Allow/Reserve/Pause: latest return %v after the deadline (goal 50ms)",
		len(clientOptions), worst.Round(time.Millisecond))
}

// A call whose context has no deadline but is cancelled returns ctx.Err() when it is,
// even on a client that never times a read out, and on one that honours deadlines
// (whose calls with a context that cannot end go on the caller's goroutine: a
// cancellable one must not, go-redis does not stop a read when its context is
// cancelled).
//
// Tolerance: it returns within lateBy (250ms) of the cancellation, measured from when
// cancel ran, not from when its timer was due: the timer's goroutine itself can run
// late on a starved machine (cancel due at 300ms, Allow back after 1.03s, at load 13),
// and that delay is not the call's. The call has never returned before it was
// cancelled: the hung server never answers.
func TestCancelHoldsAgainstHungRedis(t *testing.T) {
	for _, cte := range []bool{false, true} {
		t.Run(fmt.Sprint("ContextTimeoutEnabled=", cte), func(t *testing.T) { testCancelHoldsAgainstHungRedis(t, cte) })
	}
}

func testCancelHoldsAgainstHungRedis(t *testing.T, cte bool) {
	hung := hungServer(t)
	const after = 300 * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, ReadTimeout: -1, ContextTimeoutEnabled: cte})
	defer rdb.Close()
	l, err := New(rdb, "hung", PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancelled := make(chan time.Time, 1)
	time.AfterFunc(after, func() {
		cancelled <- time.Now()
		cancel()
	})
	start := time.Now()
	_, err = l.Allow(ctx)
	returned := time.Now()
	var late time.Duration
	select {
	case at := <-cancelled:
		late = returned.Sub(at)
	default:
		t.Fatalf("Allow returned %v after %v, before it was cancelled", err, returned.Sub(start))
	}
	if !errors.Is(err, context.Canceled) || errors.Is(err, ErrUnavailable) || late > lateBy {
		t.Errorf("Allow cancelled after %v: %v, returned %v after cancel ran (after %v); want context.Canceled within %v",
			after, err, late, returned.Sub(start), lateBy)
	}
}

// A booking whose reply reaches the client after its caller left (the deadline passed
// while Redis was slow) is given back: the next caller gets its slot.
func TestLateGrantGivenBack(t *testing.T) {
	checkLateGrantGivenBack(t, "late", "a 100ms deadline", 100*time.Millisecond)
}

// checkLateGrantGivenBack takes the permit of this second on a limiter of one a second
// through a proxy, then books the next through it with the proxy holding transactions
// back 400ms, on a call that gives up after 100ms: by its context's deadline (within,
// when > 0) or by the limiter's options (WithCallTimeout). The booking the caller
// never saw must be given back (the Cancelled hook, within 5s), so that the next
// Reserve gets the slot within the second rather than a second later. bound names the
// call's limit in messages.
//
// Only the delayed call goes through the limiter with opts: the calls before and
// after it use a limiter of the same key without them, since a starved machine can
// take 100ms over an undelayed call (seen at load 17 with WithCallTimeout(100ms)). The
// delayed call's reply comes 400ms after it was sent, whatever the load.
func checkLateGrantGivenBack(t *testing.T, key, bound string, within time.Duration, opts ...Option) {
	t.Helper()
	b, proxy, rdb := redistest.NewProxied(t)
	cancelled := make(chan int, 4)
	opts = append([]Option{WithKeyPrefix(b.Prefix), WithHooks(Hooks{Cancelled: func(_ string, n int) { cancelled <- n }})}, opts...)
	l, err := New(rdb, key, Every(time.Second), opts...)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := New(rdb, key, Every(time.Second), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if res, err := plain.Allow(ctx); err != nil || !res.Allowed { // the permit of this second
		t.Fatalf("Allow: %+v, %v", res, err)
	}
	proxy.Delay("exec", 400*time.Millisecond)
	short, cancel := ctx, context.CancelFunc(func() {})
	if within > 0 {
		short, cancel = context.WithTimeout(ctx, within)
	}
	defer cancel()
	if _, err := l.Reserve(short, 1, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Reserve through a slow Redis with %s: %v, want ErrUnavailable", bound, err)
	}
	proxy.Delay("", 0)
	select {
	case n := <-cancelled:
		if n != 1 {
			t.Fatalf("gave back %d permits, want 1", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the booking its caller never saw was not given back within 5s")
	}
	r, err := plain.Reserve(ctx, 1, time.Minute)
	if err != nil || !r.OK() || r.Delay() > time.Second {
		t.Fatalf("Reserve after the give-back: %v, %v; want the slot within the second (not a second later)", r, err)
	}
}

// callNamed makes the call named, Wait, Allow, Reserve or Pause on l, TryAcquire or
// Acquire on s, and returns its error.
func callNamed(ctx context.Context, call string, l *Limiter, s *Semaphore) error {
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
		panic("callNamed: unknown call " + call)
	}
	return err
}

// What a call costs against a refused port and a hung server, with go-redis's defaults
// and with the options the README recommends for limiters. Figures only: the
// durations depend on go-redis's retry and backoff settings and on the call timeout
// (WithCallTimeout). The hung server without a deadline or a call timeout set (11s,
// the default call timeout) runs with JOBTHROTTLE_LONG set.
func TestUnavailableCostFigures(t *testing.T) {
	if testing.Short() {
		t.Skip("figures only")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := ln.Addr().String()
	ln.Close() // nothing listens there now: connections are refused
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
	if longFaultTests() { // 11s: the default call timeout, one try of go-redis's defaults (5s + 3s + 3s)
		long = append(long,
			costCase{"hung server, go-redis defaults, no deadline", hung.Addr, func(*redis.Options) {}, 0, nil},
			costCase{"hung server, no read timeout, no deadline", hung.Addr, func(o *redis.Options) { o.ReadTimeout = -1 }, 0, nil})
	}
	var wg sync.WaitGroup
	for _, c := range append([]costCase{
		{"refused port, go-redis defaults, no deadline", refused, func(*redis.Options) {}, 0, nil},
		{"refused port, recommended options, no deadline", refused, recommended, 0, nil},
		{"hung server, recommended options, no deadline", hung.Addr, recommended, 0, nil},
		{"hung server, go-redis defaults, 1s deadline", hung.Addr, func(*redis.Options) {}, time.Second, nil},
		{"refused port, recommended options and MaxRetries -1, no deadline", refused, func(o *redis.Options) {
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
				t.Errorf("%s: Allow: %v, want ErrUnavailable", c.name, err)
			}
			redistest.Figure(t, "%s: Allow took %v", c.name, took.Round(time.Millisecond))
		}()
	}
	wg.Wait()
}

// BenchmarkAllowDeadline is Allow on the allowed path with a context that has a
// deadline (a goroutine per call waits for the reply, see awaitReply) and with one
// that never ends (a direct call), to show what returning on time costs.
func BenchmarkAllowDeadline(b *testing.B) {
	be := benchBackend(b)
	for _, c := range []struct {
		name string
		ctx  func() (context.Context, context.CancelFunc)
	}{
		{"background", func() (context.Context, context.CancelFunc) { return context.Background(), func() {} }},
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), time.Hour)
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			l, err := New(be.Client, "deadline-"+c.name, PerSecond(1_000_000_000), WithKeyPrefix(be.Prefix))
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := c.ctx()
			defer cancel()
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				if _, err := l.Allow(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// A semaphore lease granted by a reply that reaches the client after its caller left
// is released: the slot does not stay taken for a lease TTL.
//
// The proxy holds every transaction back 1s: the acquire runs 1s after the caller
// left at 100ms, and the release its late reply brings runs 1s after that, so the
// lease set is seen holding the lease (the acquire did run and grant) and then empty.
func TestLateLeaseGivenBack(t *testing.T) {
	const slow = time.Second
	b, proxy, rdb := redistest.NewProxied(t)
	s, err := NewSemaphore(rdb, "late-lease", 1, WithKeyPrefix(b.Prefix), WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	held := func() int64 { // leases in the lease set, read past the proxy
		n, err := b.Client.ZCard(context.Background(), s.keys[0]).Result()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	// one lease first, so the server has the script: the late call is one EVALSHA
	// (a NOSCRIPT answer would come after the caller left, and no EVAL would follow)
	if l, _, err := s.TryAcquire(context.Background()); err != nil || l == nil {
		t.Fatalf("TryAcquire: %v, %v", l, err)
	} else if err := l.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	proxy.Delay("exec", slow)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if l, _, err := s.TryAcquire(short); l != nil || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryAcquire through a slow Redis with a 100ms deadline: %v, %v; want ErrUnavailable", l, err)
	}
	eventually(t, 5*time.Second, "the late acquire took the slot", func() bool { return held() == 1 })
	proxy.Delay("", 0)
	// released by the late reply's handler: well within 10s, where the TTL is a minute
	eventually(t, 10*time.Second, "the late lease released", func() bool { return held() == 0 })
}

// WithCallTimeout bounds every call, with a context that has no deadline too, whatever
// the client's options (without read timeouts a call would otherwise wait forever):
// each returns an error wrapping ErrUnavailable, not context.DeadlineExceeded (the
// caller's context did not end).
//
// Tolerance: each call returns within lateBy (250ms) of its 300ms bound.
func TestCallTimeoutHoldsAgainstHungRedis(t *testing.T) {
	hung := hungServer(t)
	const bound = 300 * time.Millisecond
	var (
		mu    sync.Mutex
		worst time.Duration
		wg    sync.WaitGroup
	)
	for _, o := range clientOptions {
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
					start := time.Now()
					err = callNamed(ctx, call, l, s)
					took := time.Since(start)
					mu.Lock()
					worst = max(worst, took-bound)
					mu.Unlock()
					what := o.name + "/" + call + "/" + ctxKind
					if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("%s after %v: %v, want ErrUnavailable and not context.DeadlineExceeded", what, took, err)
					}
					if took < bound || took > bound+lateBy {
						t.Errorf("%s returned after %v, want %v (+ up to %v)", what, took, bound, lateBy)
					}
				}()
			}
		}
	}
	wg.Wait()
	redistest.Figure(t, "hung Redis, WithCallTimeout(%v), %d option sets × 6 calls × Background and a 1h deadline: latest return %v after the bound",
		bound, len(clientOptions), worst.Round(time.Millisecond))
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
		{"go-redis defaults", redis.NewClient(&redis.Options{}), 0, 11 * time.Second},
		{"set", redis.NewClient(&redis.Options{}), time.Second, time.Second},
		{"own timeouts", redis.NewClient(&redis.Options{DialTimeout: ms100, ReadTimeout: 2 * ms100, WriteTimeout: 3 * ms100}), 0, 6 * ms100},
		{"write timeout from read's", redis.NewClient(&redis.Options{DialTimeout: ms100, ReadTimeout: 2 * ms100}), 0, 5 * ms100},
		{"timeouts disabled", redis.NewClient(&redis.Options{DialTimeout: ms100, ReadTimeout: -1, WriteTimeout: -2}), 0, ms100 + 6*time.Second},
		{"cluster", redis.NewClusterClient(&redis.ClusterOptions{DialTimeout: ms100, ReadTimeout: ms100, WriteTimeout: ms100}), 0, 3 * ms100},
		{"ring", redis.NewRing(&redis.RingOptions{DialTimeout: ms100, ReadTimeout: ms100, WriteTimeout: ms100}), 0, 3 * ms100},
		{"failover", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", DialTimeout: ms100, ReadTimeout: ms100}), 0, 3 * ms100},
	} {
		if got := callTimeout(c.set, c.rdb); got != c.want {
			t.Errorf("%s: call timeout %v, want %v", c.name, got, c.want)
		}
		c.rdb.Close()
	}
	rdb := redis.NewClient(&redis.Options{})
	defer rdb.Close()
	for _, d := range []time.Duration{0, -time.Second} {
		if _, err := New(rdb, "k", PerSecond(1), WithCallTimeout(d)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("New with WithCallTimeout(%v): %v, want ErrInvalidArgument", d, err)
		}
		if _, err := NewSemaphore(rdb, "k", 1, WithCallTimeout(d)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("NewSemaphore with WithCallTimeout(%v): %v, want ErrInvalidArgument", d, err)
		}
	}
}

// The default bound holds against a hung Redis where go-redis alone would retry: a
// client of 100ms timeouts and 10 retries returns by its 300ms bound (go-redis alone:
// 11 tries of 100ms, and backoff).
//
// Tolerance: it returns within lateBy (250ms) of the bound.
func TestDefaultCallTimeoutHoldsAgainstHungRedis(t *testing.T) {
	hung := hungServer(t)
	const bound = 300 * time.Millisecond
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, DialTimeout: bound / 3, ReadTimeout: bound / 3, WriteTimeout: bound / 3, MaxRetries: 10})
	defer rdb.Close()
	l, err := New(rdb, "hung", PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Allow(context.Background())
	took := time.Since(start)
	if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || took < bound || took > bound+lateBy {
		t.Errorf("Allow without a deadline: %v after %v; want ErrUnavailable after %v (+ up to %v)", err, took, bound, lateBy)
	}
}

// A booking whose reply comes after its call's own bound (WithCallTimeout) passed, the
// caller's context having no deadline, is given back as after a deadline.
func TestLateGrantGivenBackAfterCallTimeout(t *testing.T) {
	checkLateGrantGivenBack(t, "late-bound", "a 100ms call timeout", 0, WithCallTimeout(100*time.Millisecond))
}

// Calls queued behind another on one key (coalesced into the next round trip) are
// bounded by the call timeout too, from when they were made.
//
// Tolerance: each returns within lateBy (250ms) of its 300ms bound.
func TestCallTimeoutHoldsForCoalescedCalls(t *testing.T) {
	hung := hungServer(t)
	const bound, callers = 300 * time.Millisecond, 8
	rdb := redis.NewClient(&redis.Options{Addr: hung.Addr})
	defer rdb.Close()
	l, err := New(rdb, "hung", PerSecond(10), WithCallTimeout(bound))
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := l.Allow(context.Background())
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) || took < bound || took > bound+lateBy {
				t.Errorf("Allow %d of %d at once: %v after %v; want ErrUnavailable after %v (+ up to %v)", i, callers, err, took, bound, lateBy)
			}
		}()
	}
	wg.Wait()
}

// BenchmarkAllowContextTimeout is BenchmarkAllow on a client built with
// ContextTimeoutEnabled, whose calls with a context that never ends go on the caller's
// goroutine (see evalOnTime); BenchmarkAllow's client hands each call to a call worker.
func BenchmarkAllowContextTimeout(b *testing.B) {
	be := benchBackend(b)
	o := be.Client.(*redis.Client).Options()
	rdb := redis.NewClient(&redis.Options{Addr: o.Addr, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true})
	defer rdb.Close()
	benchAllow(b, rdb, be.Prefix, "allowcte-")
}

// contextTimeoutClient returns a client of b's server(s) built with
// ContextTimeoutEnabled (a cluster client for the cluster); it closes with the test.
func contextTimeoutClient(t *testing.T, b *redistest.Backend) redis.UniversalClient {
	t.Helper()
	var rdb redis.UniversalClient
	switch c := b.Client.(type) {
	case *redis.Client:
		o := c.Options()
		rdb = redis.NewClient(&redis.Options{Addr: o.Addr, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true})
	case *redis.ClusterClient:
		o := c.Options()
		rdb = redis.NewClusterClient(&redis.ClusterOptions{Addrs: o.Addrs, ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, ContextTimeoutEnabled: true})
	default:
		t.Fatalf("client %T", b.Client)
	}
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// pathCount counts the calls of a Limiter or Semaphore by the way they went (see
// evalOnTime): on the caller's goroutine (direct) or through awaitReply's goroutine.
type pathCount struct{ direct, handed atomic.Int64 }

func (p *pathCount) see(direct bool) {
	if direct {
		p.direct.Add(1)
	} else {
		p.handed.Add(1)
	}
}

// A call goes on its caller's goroutine exactly when its context can never end, the
// client honours deadlines (a plain Client with ContextTimeoutEnabled) and the call has
// nothing to give back should its reply come late (Allow, Pause): a context that can
// be cancelled or has a deadline, a client without ContextTimeoutEnabled, a cluster
// client, a failover client or a ring keeps the goroutine, which returns when the
// context ends whatever go-redis is waiting for, and so do a booking (Wait, Reserve)
// and a semaphore acquire, whose late reply the goroutine reads and gives back. Each
// call is counted by the way it went (and is answered: the path changes nothing else).
func TestCallPath(t *testing.T) {
	for _, k := range []redistest.Kind{redistest.Mini, redistest.Standalone, redistest.Cluster} {
		t.Run(string(k), func(t *testing.T) {
			b := redistest.New(t, k)
			cte := contextTimeoutClient(t, b)
			cancelled, cancel := context.WithCancel(context.Background())
			defer cancel()
			withDeadline, cancel2 := context.WithTimeout(context.Background(), time.Hour)
			defer cancel2()
			for _, c := range []struct {
				name   string
				rdb    redis.UniversalClient
				ctx    context.Context
				direct bool
			}{
				{"ContextTimeoutEnabled/Background", cte, context.Background(), k != redistest.Cluster},
				{"ContextTimeoutEnabled/WithoutCancel", cte, context.WithoutCancel(cancelled), k != redistest.Cluster},
				{"ContextTimeoutEnabled/cancellable", cte, cancelled, false},
				{"ContextTimeoutEnabled/1h deadline", cte, withDeadline, false},
				{"own client/Background", b.Client, context.Background(), false},
			} {
				for _, coalesce := range []bool{true, false} {
					var seen pathCount
					key := fmt.Sprint("path-", c.name, coalesce) // a key of its own: the pause below holds its key a while
					l, err := New(c.rdb, key, PerSecond(1000), WithKeyPrefix(b.Prefix), WithCoalescing(coalesce))
					if err != nil {
						t.Fatal(err)
					}
					s, err := NewSemaphore(c.rdb, key, 2, WithKeyPrefix(b.Prefix), WithCoalescing(coalesce))
					if err != nil {
						t.Fatal(err)
					}
					l.onPath, s.onPath = seen.see, seen.see
					for _, call := range []string{"Allow", "Wait", "Reserve", "TryAcquire", "Pause"} {
						seen.direct.Store(0)
						seen.handed.Store(0)
						err := callNamed(c.ctx, call, l, s)
						if call == "Pause" && err == nil {
							err = l.Resume(c.ctx)
						}
						if err != nil {
							t.Fatalf("%s/%s: %v", c.name, call, err)
						}
						want := c.direct && (call == "Allow" || call == "Pause")
						direct, handed := seen.direct.Load(), seen.handed.Load()
						if direct+handed == 0 || (want && handed != 0) || (!want && direct != 0) {
							t.Errorf("%s/%s (coalescing %v): %d calls direct, %d through a goroutine; want all %s",
								c.name, call, coalesce, direct, handed, map[bool]string{true: "direct", false: "through a goroutine"}[want])
						}
					}
				}
			}
		})
	}
	for _, c := range []struct {
		name string
		rdb  redis.UniversalClient
		want bool
	}{
		{"Client", redis.NewClient(&redis.Options{}), false},
		{"Client, ContextTimeoutEnabled", redis.NewClient(&redis.Options{ContextTimeoutEnabled: true}), true},
		{"FailoverClient, ContextTimeoutEnabled", redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", ContextTimeoutEnabled: true}), false},
		{"ClusterClient, ContextTimeoutEnabled", redis.NewClusterClient(&redis.ClusterOptions{ContextTimeoutEnabled: true}), false},
		{"Ring, ContextTimeoutEnabled", redis.NewRing(&redis.RingOptions{ContextTimeoutEnabled: true}), false},
	} {
		if got := honoursDeadlines(c.rdb); got != c.want {
			t.Errorf("honoursDeadlines(%s) = %v, want %v", c.name, got, c.want)
		}
		c.rdb.Close()
	}
}

// Why a direct call needs a client that honours deadlines: against a hung Redis, with
// a call timeout (300ms) below the client's ReadTimeout (1s), a call made on the
// caller's goroutine by a client without ContextTimeoutEnabled returns only when its
// read times out, past the bound, although go-redis gets a context with the bound as
// its deadline; with ContextTimeoutEnabled it returns by the bound, with the error of
// a call timeout (ErrUnavailable, not context.DeadlineExceeded). Limiters on either
// client return by the bound (the first through a goroutine, see TestCallPath).
//
// Tolerance: a call that should return by the bound does so within lateBy (250ms) of
// it; the one that should not takes at least the 1s ReadTimeout, which a busy machine
// only lengthens.
func TestDirectCallNeedsContextTimeout(t *testing.T) {
	hung := hungServer(t)
	const bound, read = 300 * time.Millisecond, time.Second
	client := func(cte bool) *redis.Client {
		rdb := redis.NewClient(&redis.Options{Addr: hung.Addr, ReadTimeout: read, WriteTimeout: read, MaxRetries: -1, ContextTimeoutEnabled: cte})
		t.Cleanup(func() { rdb.Close() })
		return rdb
	}
	c := newCommand(lua.GCRA.Script(), []string{"{direct}:tb", "{direct}:pause"}, []any{opAcquire, 1, int64(0)})
	var wg sync.WaitGroup
	for _, cte := range []bool{false, true} {
		wg.Add(2)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := callDirect(context.Background(), bound, client(cte), nil, c)
			took := time.Since(start)
			switch {
			case !errors.Is(err, ErrUnavailable) && cte:
				t.Errorf("direct call, ContextTimeoutEnabled: %v, want ErrUnavailable", err)
			case errors.Is(err, context.DeadlineExceeded):
				t.Errorf("direct call, ContextTimeoutEnabled %v: %v matches context.DeadlineExceeded; the caller's context has no deadline", cte, err)
			case cte && (took < bound || took > bound+lateBy):
				t.Errorf("direct call, ContextTimeoutEnabled: returned after %v, want %v (+ up to %v)", took, bound, lateBy)
			case !cte && took < read:
				t.Errorf("direct call without ContextTimeoutEnabled returned after %v: %v; the premise (a read waits its ReadTimeout, %v) is gone", took, err, read)
			}
		}()
		go func() {
			defer wg.Done()
			l, err := New(client(cte), "direct", PerSecond(10), WithCallTimeout(bound))
			if err != nil {
				t.Error(err)
				return
			}
			var seen pathCount
			l.onPath = seen.see
			start := time.Now()
			_, err = l.Allow(context.Background())
			took := time.Since(start)
			if !errors.Is(err, ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) || took < bound || took > bound+lateBy {
				t.Errorf("Allow, ContextTimeoutEnabled %v: %v after %v; want ErrUnavailable after %v (+ up to %v)", cte, err, took, bound, lateBy)
			}
			if seen.direct.Load() == 1 != cte {
				t.Errorf("Allow, ContextTimeoutEnabled %v: %d calls direct, %d through a goroutine", cte, seen.direct.Load(), seen.handed.Load())
			}
		}()
	}
	wg.Wait()
}

// A direct call runs at most once too: its reply lost after the script ran (the proxy
// drops the connection), Allow fails with ErrUnavailable and the permit is charged
// once, for every algorithm (TestLostReplyChargesOnce on a client that honours
// deadlines, whose calls go on the caller's goroutine).
func TestDirectCallLostReplyChargesOnce(t *testing.T) {
	direct, proxy, _ := redistest.NewProxied(t)
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true}) // 3 retries
	defer rdb.Close()
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		l, err := New(rdb, "direct-once"+alg.String(), PerMinute(10), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		var seen pathCount
		l.onPath = seen.see
		if err := l.script.Load(ctx, rdb).Err(); err != nil { // so the lost reply is the script's
			t.Fatal(err)
		}
		proxy.DropReplyTo("exec")
		if _, err := l.Allow(ctx); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v: Allow with its reply lost: %v, want ErrUnavailable", alg, err)
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != 9 {
			t.Errorf("%v: %d permits remain after one lost call, want 9 (charged once)", alg, res.Remaining)
		}
		if seen.handed.Load() != 0 || seen.direct.Load() != 2 {
			t.Errorf("%v: %d calls direct, %d through a goroutine; want 2 direct", alg, seen.direct.Load(), seen.handed.Load())
		}
	}
}

// A direct call's bound counts as passed when its deadline is behind us even if the
// bound's timer has not run yet: the connection's read deadline, the same instant,
// can end the call first (a CI run at load ~5: "i/o timeout, want ErrUnavailable").
// The late timer is stood in for by a deadline set back while the timer still waits.
func TestBoundCtxExpiredBeforeItsTimer(t *testing.T) {
	b := newBoundCtx(context.Background(), time.Hour)
	if b.release() {
		t.Fatal("release right after newBoundCtx reported the bound passed")
	}
	b = newBoundCtx(context.Background(), time.Hour)
	b.deadline = time.Now().Add(-time.Millisecond) // passed; the timer has not run
	if !b.release() {
		t.Error("release with the deadline passed and the timer not run reported the bound not passed")
	}
}
