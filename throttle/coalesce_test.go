package throttle

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// held makes the limiter's client look busy, as while maxFlights round trips are in
// flight: calls made now queue up (forming one round trip) until release.
func held(t *testing.T, b *batcher) (queued func(n int), release func()) {
	t.Helper()
	if b == nil {
		t.Fatal("no coalescing")
	}
	// the round trip of a previous test may still be finishing (its callers have their
	// answers before its flusher marks the client idle): wait for it
	for deadline := time.Now().Add(10 * time.Second); ; {
		b.mu.Lock()
		if b.flying == 0 {
			b.flying = maxFlights
			b.mu.Unlock()
			break
		}
		b.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the client stays busy")
		}
		time.Sleep(100 * time.Microsecond)
	}
	queued = func(n int) {
		for deadline := time.Now().Add(10 * time.Second); ; {
			b.mu.Lock()
			q := len(b.queue)
			b.mu.Unlock()
			if q >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d calls queued, want %d", q, n)
			}
			time.Sleep(100 * time.Microsecond)
		}
	}
	release = func() { // the held round trips end at once: what queued goes in one
		b.mu.Lock()
		b.flying = 0
		b.launch()
		b.mu.Unlock()
	}
	return queued, release
}

// call is one request of a batch test: AllowN(n), or Reserve(n, maxWait) when reserve.
type call struct {
	reserve bool
	n       int
	maxWait time.Duration
}

// outcome is what a call got, comparable across limiters.
type outcome struct {
	res   Result
	ok    bool
	delay time.Duration
	err   string
	errv  error // the error itself (err is its text, comparable)
	r     *waiter.Reservation
}

func (c call) run(ctx context.Context, l *Limiter) outcome {
	if c.reserve {
		r, err := l.Reserve(ctx, c.n, c.maxWait)
		if err != nil {
			return outcome{err: err.Error(), errv: err}
		}
		return outcome{ok: r.OK(), delay: r.Delay(), r: r}
	}
	res, err := l.AllowN(ctx, c.n)
	if err != nil {
		return outcome{err: err.Error(), errv: err}
	}
	return outcome{res: res}
}

// A batch decides its requests in arrival order, each as a call of its own made at
// that instant: on a timeline (the clock stands still within a step), a forced batch
// of AllowN and Reserve calls with their own n and max waits on one key gets what the
// same calls made one by one get on another key; so do the cancels of the bookings,
// batched too, and the state they leave.
func TestCoalescedBatchDecidesAsSeparateCalls(t *testing.T) {
	calls := []call{
		{false, 1, 0}, {true, 2, 0}, {false, 3, 0}, {true, 1, time.Second},
		{false, 1, 0}, {true, 2, 300 * ms}, {true, 3, 5 * time.Second}, {false, 0, 0},
		{true, 1, 0}, {true, 2, 2 * time.Second}, {false, 2, 0}, {true, 1, time.Minute},
	}
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		for _, alg := range allAlgorithms {
			t.Run(alg.String(), func(t *testing.T) {
				tl := newTimeline(t, b)
				lim := Limit{Rate: 4, Period: time.Second, Burst: 4}
				batched := tl.limiter("batched"+alg.String(), lim, WithAlgorithm(alg), WithLimits(Limit{Rate: 10, Period: 10 * time.Second}))
				alone := tl.limiter("alone"+alg.String(), lim, WithAlgorithm(alg), WithLimits(Limit{Rate: 10, Period: 10 * time.Second}), WithCoalescing(false))
				ctx := context.Background()
				for step := range 3 {
					tl.at(time.Duration(step) * 1700 * ms)
					want := make([]outcome, len(calls))
					for i, c := range calls {
						want[i] = c.run(ctx, alone)
					}
					got := runBatch(t, batched.src.batch, len(calls), func(i int) outcome { return calls[i].run(ctx, batched) })
					for i := range calls {
						g, w := got[i], want[i]
						if g.res != w.res || g.ok != w.ok || g.delay != w.delay || g.err != w.err {
							t.Fatalf("step %d call %d %+v: batched %+v, alone %+v", step, i, calls[i], g, w)
						}
					}
					// give back every other booking: batched cancels against single ones
					for i := range want {
						if i%2 == 0 && want[i].r != nil {
							if err := want[i].r.Cancel(ctx); err != nil {
								t.Fatal(err)
							}
						}
					}
					cancels := runBatch(t, batched.src.batch, len(got), func(i int) outcome {
						if i%2 == 0 && got[i].r != nil {
							if err := got[i].r.Cancel(ctx); err != nil {
								return outcome{err: err.Error()}
							}
						}
						return outcome{}
					})
					for i, c := range cancels {
						if c.err != "" {
							t.Fatalf("step %d: cancel %d: %s", step, i, c.err)
						}
					}
					g, w := (call{false, 0, 0}).run(ctx, batched), (call{false, 0, 0}).run(ctx, alone)
					if g.res != w.res {
						t.Fatalf("step %d: state after the cancels: batched %+v, alone %+v", step, g.res, w.res)
					}
				}
			})
		}
	})
}

// runBatch runs k calls (f(0) .. f(k-1)), each from its own goroutine, arriving in
// that order while b (the client's batcher) is held busy, so that they form one
// round trip; it returns what each got. Calls that send nothing to Redis (a Reserve's Cancel of a booking that is
// not there) do not queue, and are waited for as they are.
func runBatch(t *testing.T, b *batcher, k int, f func(i int) outcome) []outcome {
	t.Helper()
	queued, release := held(t, b)
	out := make([]outcome, k)
	var wg sync.WaitGroup
	before := 0
	for i := range k {
		wg.Add(1)
		done := make(chan struct{})
		go func() {
			defer wg.Done()
			defer close(done)
			out[i] = f(i)
		}()
		// wait until the call queued (or finished without Redis)
		for {
			b.mu.Lock()
			q := len(b.queue)
			b.mu.Unlock()
			if q > before {
				before = q
				break
			}
			select {
			case <-done:
			default:
				time.Sleep(50 * time.Microsecond)
				continue
			}
			break
		}
	}
	queued(before)
	release()
	wg.Wait()
	return out
}

// Under load, calls coalesce (fewer Redis calls than requests) and nothing is
// over-admitted: 64 goroutines taking permits from one key get exactly the limit.
func TestCoalescingUnderLoad(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		for _, alg := range allAlgorithms {
			t.Run(alg.String(), func(t *testing.T) {
				grants := redistest.RecordGrants(b.Client)
				l, err := New(b.Client, "load"+alg.String(), PerHour(300), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
				if err != nil {
					t.Fatal(err)
				}
				var allowed, requests atomic.Int64
				var wg sync.WaitGroup
				for range 64 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for range 10 {
							res, err := l.Allow(context.Background())
							if err != nil {
								t.Error(err)
								return
							}
							requests.Add(1)
							if res.Allowed {
								allowed.Add(1)
							}
						}
					}()
				}
				wg.Wait()
				if allowed.Load() != 300 {
					t.Fatalf("%d allowed of %d requests, want exactly the limit, 300", allowed.Load(), requests.Load())
				}
				if c := grants.Calls(); c >= int(requests.Load()) {
					t.Fatalf("%d Redis calls for %d requests: nothing coalesced", c, requests.Load())
				}
				t.Logf("%d requests in %d Redis calls", requests.Load(), grants.Calls())
			})
		}
	})
}

// A caller whose context ends while its request waits in the queue leaves it: it gets
// ctx.Err(), and nothing is taken for it.
func TestCoalescedCallerLeavesQueue(t *testing.T) {
	b := redistest.NewMini(t)
	tl := newTimeline(t, b)
	l := tl.limiter("leave", PerSecond(5))
	queued, release := held(t, l.src.batch)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := l.Reserve(ctx, 2, time.Second)
		errc <- err
	}()
	queued(1)
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Reserve whose context ended in the queue: %v, want context.Canceled", err)
	}
	release()
	res, err := l.AllowN(context.Background(), 0)
	if err != nil || res.Remaining != 5 {
		t.Fatalf("after the caller left: %+v, %v; want 5 remaining", res, err)
	}
}

// A lost batch reply fails every caller in the batch with ErrUnavailable, and what
// the batch granted stands once (it is not re-sent).
func TestCoalescedLostReply(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		l, err := New(rdb, "lost"+alg.String(), PerHour(10), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.script.Load(ctx, rdb).Err(); err != nil {
			t.Fatal(err)
		}
		proxy.DropReplyTo("exec")
		got := runBatch(t, l.src.batch, 3, func(int) outcome { return (call{false, 1, 0}).run(ctx, l) })
		for i, g := range got {
			if !strings.Contains(g.err, ErrUnavailable.Error()) {
				t.Fatalf("%v: call %d of a batch whose reply was lost: %+v, want ErrUnavailable", alg, i, g)
			}
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 7 {
			t.Fatalf("%v: after the lost batch: %+v, %v; want its 3 grants charged once (7 remaining)", alg, res, err)
		}
	}
}

// A caller whose context ends while its batch is in flight returns at once, and the
// booking the batch made for it is given back when the reply comes (as for a call of
// its own, see lateReply); the others in the batch keep theirs.
func TestCoalescedCallerLeavesInFlight(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	grants := redistest.RecordGrants(rdb)
	ctx := context.Background()
	l, err := New(rdb, "inflight", PerHour(2), WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.AllowN(ctx, 2); err != nil {
		t.Fatal(err)
	}
	proxy.Delay("evalsha", 300*ms)
	leave, cancel := context.WithCancel(ctx)
	defer cancel()
	var sent atomic.Bool
	got := runBatch(t, l.src.batch, 2, func(i int) outcome {
		if i == 0 {
			go func() { // leave once the batch is in flight
				for {
					l.src.batch.mu.Lock()
					q := len(l.src.batch.queue)
					busy := l.src.batch.flying > 0
					l.src.batch.mu.Unlock()
					if busy && q == 0 && sent.Load() {
						cancel()
						return
					}
					time.Sleep(time.Millisecond)
				}
			}()
			return (call{true, 1, 2 * time.Hour}).run(leave, l)
		}
		sent.Store(true)
		return (call{true, 1, 2 * time.Hour}).run(ctx, l)
	})
	if !strings.Contains(got[0].err, context.Canceled.Error()) {
		t.Fatalf("the caller that left: %+v, want context.Canceled", got[0])
	}
	if !got[1].ok || got[1].delay <= 0 {
		t.Fatalf("the caller that stayed: %+v, want a booking ahead", got[1])
	}
	for deadline := time.Now().Add(10 * time.Second); grants.Total() != 3; {
		if time.Now().After(deadline) {
			t.Fatalf("%d permits granted and not given back, want 3: the leaver's booking stays", grants.Total())
		}
		time.Sleep(5 * ms)
	}
}

// pipes counts the pipelines that carry script calls, and the script calls in them.
type pipes struct {
	mu           sync.Mutex
	pipes, calls int
}

func (c *pipes) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (c *pipes) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (c *pipes) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if isEval(cmd) {
				n++
			}
		}
		if n > 0 {
			c.mu.Lock()
			c.pipes++
			c.calls += n
			c.mu.Unlock()
		}
		return next(ctx, cmds)
	}
}

// Calls on different keys of one client that queue while a call is in flight go in one
// round trip: one script call per key (each key's requests in one batch, decided as
// calls of their own), all in one pipeline (on a cluster, one transaction per key,
// sent at once). Each key keeps its own limit.
func TestCoalescedKeysShareARoundTrip(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		var c pipes
		b.Client.AddHook(&c)
		var lims []*Limiter
		for i, alg := range allAlgorithms {
			l, err := New(b.Client, fmt.Sprintf("pipe%d", i), PerHour(2), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			lims = append(lims, l)
		}
		ctx := context.Background()
		for _, l := range lims { // the server loads the scripts (NOSCRIPT costs a second trip)
			if _, err := l.AllowN(ctx, 0); err != nil {
				t.Fatal(err)
			}
		}
		c.mu.Lock()
		c.pipes, c.calls = 0, 0
		c.mu.Unlock()
		got := runBatch(t, lims[0].src.batch, 3*len(lims), func(i int) outcome {
			return (call{false, 1, 0}).run(ctx, lims[i%len(lims)])
		})
		for i, g := range got {
			want := i < 2*len(lims) // each key: 2 of its 3 requests allowed
			if g.err != "" || g.res.Allowed != want {
				t.Fatalf("request %d (key %d): %+v, want allowed %v", i, i%len(lims), g, want)
			}
		}
		wantPipes := 1
		if b.Kind == redistest.Cluster {
			wantPipes = len(lims)
		}
		if c.pipes != wantPipes || c.calls != len(lims) {
			t.Fatalf("%d requests on %d keys: %d pipelines of %d script calls, want %d of %d", len(got), len(lims), c.pipes, c.calls, wantPipes, len(lims))
		}
	})
}

// A batch's flat reply carries each failed request's own error (its text, see
// lua/batch.lua): on a key that holds another algorithm's state, the grants of a
// forced batch fail with an *AlgorithmError naming that algorithm (read from the
// text), while the batch's reads (AllowN 0, which create nothing) are answered.
func TestCoalescedBatchRequestErrors(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		ctx := context.Background()
		other := tl.limiter("mixed", PerSecond(5), WithAlgorithm(FixedWindow), WithCoalescing(false))
		if _, err := other.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		l := tl.limiter("mixed", PerSecond(5), WithAlgorithm(TokenBucket))
		ns := []int{1, 0, 2, 0, 1}
		got := runBatch(t, l.src.batch, len(ns), func(i int) outcome { return (call{false, ns[i], 0}).run(ctx, l) })
		for i, n := range ns {
			g := got[i]
			if n == 0 {
				if g.err != "" || !g.res.Allowed {
					t.Fatalf("request %d, AllowN(0): %+v, want allowed", i, g)
				}
				continue
			}
			var ae *AlgorithmError
			if !errors.As(g.errv, &ae) || ae.Found != FixedWindow || ae.Want != TokenBucket {
				t.Fatalf("request %d, AllowN(%d): %v, want an *AlgorithmError naming FixedWindow", i, n, g.errv)
			}
		}
	})
}

// gate holds each pipeline that carries a script call until the test lets it go,
// and tells the test how many requests each one carries (a batch's count, or 1).
type gate struct {
	on      atomic.Bool
	entered chan int           // a held pipeline's requests
	release chan chan struct{} // let one held pipeline go; closed when it returned
}

func newGate() *gate {
	return &gate{entered: make(chan int, 16), release: make(chan chan struct{})}
}

func (g *gate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *gate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *gate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		reqs := 0
		for _, cmd := range cmds {
			if !isEval(cmd) {
				continue
			}
			a := cmd.Args() // evalsha sha numkeys keys… ARGV…: a batch's ARGV[1] is lua.Batch, ARGV[2] its count
			nk, _ := strconv.Atoi(fmt.Sprint(a[2]))
			if len(a) > 4+nk && fmt.Sprint(a[3+nk]) == fmt.Sprint(lua.Batch) {
				n, _ := strconv.Atoi(fmt.Sprint(a[4+nk]))
				reqs += n
			} else {
				reqs++
			}
		}
		if reqs == 0 || !g.on.Load() {
			return next(ctx, cmds)
		}
		g.entered <- reqs
		done := <-g.release
		defer close(done)
		return next(ctx, cmds)
	}
}

// Two round trips of a client may be in flight at once, never three: of two
// concurrent calls the second goes beside the first at once; calls that come while two
// are in flight queue, and go together in one round trip (one batch) when one returns.
// Each is decided once, by its own request.
func TestCoalescedTwoRoundTripsInFlight(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		g := newGate()
		b.Client.AddHook(g)
		ctx := context.Background()
		l, err := New(b.Client, "flights", PerHour(100), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.AllowN(ctx, 0); err != nil { // the script loaded, the client idle
			t.Fatal(err)
		}
		g.on.Store(true)
		bt := l.src.batch
		results := make(chan outcome, 6)
		call := func() { results <- (call{false, 1, 0}).run(ctx, l) }
		entered := func(what string, want int) {
			t.Helper()
			select {
			case n := <-g.entered:
				if n != want {
					t.Fatalf("%s: a round trip of %d requests, want %d", what, n, want)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no round trip sent", what)
			}
		}
		go call()
		entered("the first call", 1)
		go call() // the first is still in flight
		entered("the second call", 1)
		for range 4 {
			go call()
		}
		eventually(t, 10*time.Second, "4 calls queued", func() bool {
			bt.mu.Lock()
			defer bt.mu.Unlock()
			return len(bt.queue) == 4
		})
		bt.mu.Lock()
		flying := bt.flying
		bt.mu.Unlock()
		if flying != 2 {
			t.Fatalf("%d round trips in flight, want 2", flying)
		}
		select {
		case n := <-g.entered:
			t.Fatalf("a third round trip (%d requests) while two are in flight", n)
		default:
		}
		done := make(chan struct{})
		g.release <- done // the first returns: the queue goes
		<-done
		entered("the queued calls", 4)
		for range 2 {
			done := make(chan struct{})
			g.release <- done
			<-done
		}
		g.on.Store(false)
		for i := range 6 {
			if o := <-results; o.err != "" || !o.res.Allowed {
				t.Fatalf("call %d: %+v, want allowed", i, o)
			}
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 94 {
			t.Fatalf("after 6 calls: %+v, %v; want 94 remaining (each decided once)", res, err)
		}
	})
}

// A request is kept for reuse (pendings) only once nothing may read it: a caller
// that leaves while its round trip is in flight lets go of it, but the round trip
// still holds it (its reply goes to the late path through it) until it is over. The
// hook checks, inside the round trip after its reply came, that none of its requests
// was freed since it began; then that each was freed once after it (none is lost).
func TestCoalescedPendingFreedOnlyWhenUnused(t *testing.T) {
	be := redistest.NewMini(t)
	var mu sync.Mutex
	freed := map[*pending]int{}
	free := func(p *pending) {
		mu.Lock()
		freed[p]++
		mu.Unlock()
	}
	onFree.Store(&free)
	defer onFree.Store(nil)
	h := &freeCheck{entered: make(chan struct{}, 1), proceed: make(chan struct{}), freed: func(p *pending) int {
		mu.Lock()
		defer mu.Unlock()
		return freed[p] // a pending is reused: count how often
	}}
	be.Client.AddHook(h)
	l, err := New(be.Client, "pooled", PerHour(10), WithKeyPrefix(be.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := l.AllowN(ctx, 0); err != nil { // the script loaded
		t.Fatal(err)
	}
	h.on.Store(true)
	leave, cancel := context.WithCancel(ctx)
	defer cancel()
	var left, stayed outcome
	leftDone, stayedDone := make(chan struct{}), make(chan struct{})
	queued, release := held(t, l.src.batch)
	go func() { defer close(leftDone); left = (call{true, 1, time.Hour}).run(leave, l) }()
	queued(1)
	go func() { defer close(stayedDone); stayed = (call{true, 1, time.Hour}).run(ctx, l) }()
	queued(2)
	release()
	<-h.entered // the round trip is in flight: the first caller leaves, and returns
	cancel()
	<-leftDone
	close(h.proceed)
	<-stayedDone
	if !errors.Is(left.errv, context.Canceled) {
		t.Fatalf("the caller that left: %+v, want context.Canceled", left)
	}
	if !stayed.ok {
		t.Fatalf("the caller that stayed: %+v, want its booking", stayed)
	}
	if bad := h.bad.Load(); bad != 0 {
		t.Fatalf("%d requests of a round trip in flight were freed before it was over", bad)
	}
	for deadline := time.Now().Add(10 * time.Second); ; {
		mu.Lock()
		n, twice := 0, 0
		for i, p := range h.reqs {
			if freed[p] > h.before[i] {
				n++
			}
			if freed[p] > h.before[i]+1 {
				twice++
			}
		}
		mu.Unlock()
		if twice > 0 {
			t.Fatalf("%d requests freed twice", twice)
		}
		if n == len(h.reqs) && n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the round trip's %d requests freed after it", n, len(h.reqs))
		}
		time.Sleep(time.Millisecond)
	}
}

// freeCheck holds the first coalesced round trip (on) until proceed, signalling
// entered, and counts in bad its requests that were freed by the time its reply came.
type freeCheck struct {
	on               atomic.Bool
	entered, proceed chan struct{}
	freed            func(*pending) int // how often it was freed
	reqs             []*pending
	before           []int // freed(reqs[i]) when the round trip began
	bad              atomic.Int32
}

func (h *freeCheck) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *freeCheck) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *freeCheck) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		m, ok := ctx.Value(batchKey{}).(*sync.Map)
		if !ok || !h.on.CompareAndSwap(true, false) {
			return next(ctx, cmds)
		}
		m.Range(func(_, v any) bool {
			h.reqs = append(h.reqs, v.([]*pending)...)
			return true
		})
		for _, p := range h.reqs {
			h.before = append(h.before, h.freed(p))
		}
		h.entered <- struct{}{}
		<-h.proceed
		err := next(ctx, cmds)
		for i, p := range h.reqs {
			if h.freed(p) != h.before[i] {
				h.bad.Add(1)
			}
		}
		return err
	}
}

// A coalesced Allow allocates nothing of its own: what a round trip allocates (its
// slices, go-redis's commands, the reply) is per round trip, not per request, so a
// round trip of 64 Allows allocates about as much as one of 8. Against a real
// redis-server (miniredis runs in the process: its allocations would count).
func TestCoalescedAllowAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts mean nothing with -race")
	}
	if _, err := redistest.StandaloneAddr(); err != nil {
		t.Skipf("no real redis-server: %v", err)
	}
	be := redistest.NewStandalone(t)
	l, err := New(be.Client, "allocs", Limit{Rate: 1_000_000_000, Period: time.Second}, WithKeyPrefix(be.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	b := l.src.batch
	// workers, started before counting: worker i calls Allow on start[i], answers on done
	const most = 64
	start := make([]chan struct{}, most)
	done := make(chan error, most)
	for i := range start {
		start[i] = make(chan struct{})
		go func() {
			for range start[i] {
				_, err := l.Allow(ctx)
				done <- err
			}
		}()
	}
	defer func() {
		for _, c := range start {
			close(c)
		}
	}()
	roundTrip := func(k int) { // k Allows queued while the client is held, then sent in one
		queued, release := held(t, b)
		for i := range k {
			start[i] <- struct{}{}
			queued(i + 1)
		}
		release()
		for range k {
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	roundTrip(most) // the script loaded, the pools filled
	a8 := testing.AllocsPerRun(20, func() { roundTrip(8) })
	a64 := testing.AllocsPerRun(20, func() { roundTrip(most) })
	t.Logf("allocations per round trip: %.1f with 8 Allows, %.1f with 64", a8, a64)
	if per := (a64 - a8) / (most - 8); per > 0.1 {
		t.Fatalf("%.2f allocations per coalesced Allow (%.1f per round trip of 8, %.1f of 64), want none", per, a8, a64)
	}
}
