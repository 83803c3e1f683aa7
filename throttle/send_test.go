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
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Tests of the one send path (send.go): a batch decides its requests as separate calls
// would, in arrival order; callers that leave take nothing or give back what the reply
// brings; requests of several keys share a round trip; at most two round trips fly.

// ---- seams: the client's queue, held and released by the test

// sendHold makes c look busy, as while maxFlights round trips are in flight: requests
// made now queue (to go together in one round trip) until release. It first waits
// for what a previous step sent to land.
func sendHold(t *testing.T, c *client) (queued func(n int), release func()) {
	t.Helper()
	for deadline := time.Now().Add(signalWait); ; {
		c.mu.Lock()
		if len(c.flights) == 0 && len(c.queue) == 0 {
			for range maxFlights { // flights the watchdog never lets go
				busy := &request{due: time.Now().Add(time.Hour)}
				busy.state.Store(sent)
				c.flights = append(c.flights, &flight{reqs: []*request{busy}})
			}
			c.mu.Unlock()
			break
		}
		c.mu.Unlock()
		if time.Now().After(deadline) {
			t.Fatal("the client stays busy")
		}
		time.Sleep(100 * time.Microsecond)
	}
	queued = func(n int) {
		t.Helper()
		sendEventually(t, signalWait, fmt.Sprintf("%d requests queued", n), func() bool { return sendQueued(c) >= n })
	}
	release = func() { // the held round trips land at once: what queued goes in one
		c.mu.Lock()
		c.flights = nil
		go c.flush(c.take())
		c.mu.Unlock()
	}
	return queued, release
}

// sendQueued returns how many requests wait in c's queue.
func sendQueued(c *client) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.queue)
}

// sendEventually polls cond every millisecond for up to d, and fails the test if it
// never holds.
func sendEventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(d); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s, want it", d, what)
		}
		time.Sleep(time.Millisecond)
	}
}

// sendCall is one request of a batch test: AllowN(n), or Reserve(n, maxWait) when
// reserve.
type sendCall struct {
	reserve bool
	n       int
	maxWait time.Duration
}

// sendOutcome is what a call got, comparable across limiters.
type sendOutcome struct {
	res   Result
	ok    bool
	delay time.Duration
	err   string
	errv  error // the error itself (err is its text, comparable)
	r     *waiter.Reservation
}

func (c sendCall) run(ctx context.Context, l *Limiter) sendOutcome {
	if c.reserve {
		r, err := l.Reserve(ctx, c.n, c.maxWait)
		if err != nil {
			return sendOutcome{err: err.Error(), errv: err}
		}
		return sendOutcome{ok: r.OK(), delay: r.Delay(), r: r}
	}
	res, err := l.AllowN(ctx, c.n)
	if err != nil {
		return sendOutcome{err: err.Error(), errv: err}
	}
	return sendOutcome{res: res}
}

// sendRunBatch runs k calls (f(0) .. f(k-1)), each on a goroutine of its own, arriving
// in that order while c is held busy, so that they go in one round trip; it returns
// what each got. A call that sends nothing (a Cancel of a booking that took effect)
// does not queue, and is waited for as it is.
func sendRunBatch(t *testing.T, c *client, k int, f func(i int) sendOutcome) []sendOutcome {
	t.Helper()
	queued, release := sendHold(t, c)
	out := make([]sendOutcome, k)
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
		for { // until the call queued, or finished without Redis
			if q := sendQueued(c); q > before {
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

// sendIsEval reports whether cmd is a script call.
func sendIsEval(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

// sendRequests returns how many requests a script call carries: a limiter's, one
// ARGV after its two heads each (internal/protocol); a semaphore's, its ARGV[1].
func sendRequests(cmd redis.Cmder) int {
	a := cmd.Args() // evalsha sha numkeys keys… argv…
	nk, _ := strconv.Atoi(fmt.Sprint(a[2]))
	if len(a) <= 3+nk {
		return 0
	}
	if k, err := strconv.Atoi(fmt.Sprint(a[3+nk])); err == nil {
		return k
	}
	return len(a) - 3 - nk - 2
}

// ---- batches decide as separate calls

// A batch decides its requests in arrival order, each as a call of its own made at
// that instant: on a timeline (the clock stands still within a step), a batch of
// AllowN and Reserve calls with their own n and max waits on one key gets what the same
// calls made one by one (each a round trip of its own) get on another key; so do the
// cancels of the bookings, batched too, and the state they leave.
func TestBatchDecidesAsSeparateCalls(t *testing.T) {
	calls := []sendCall{
		{false, 1, 0}, {true, 2, 0}, {false, 3, 0}, {true, 1, time.Second},
		{false, 1, 0}, {true, 2, 300 * ms}, {true, 3, 5 * time.Second}, {false, 0, 0},
		{true, 1, 0}, {true, 2, 2 * time.Second}, {false, 2, 0}, {true, 1, time.Minute},
	}
	eachAlgorithm(t, redistest.Each, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		tl := newTimeline(t, b)
		lim := Limit{Rate: 4, Period: time.Second, Burst: 4}
		more := WithLimits(Limit{Rate: 10, Period: 10 * time.Second})
		batched := tl.limiter("batched", lim, WithAlgorithm(alg), more)
		alone := tl.limiter("alone", lim, WithAlgorithm(alg), more)
		ctx := context.Background()
		for step := range 3 {
			tl.at(time.Duration(step) * 1700 * ms)
			want := make([]sendOutcome, len(calls))
			for i, c := range calls {
				want[i] = c.run(ctx, alone)
			}
			got := sendRunBatch(t, batched.client(), len(calls), func(i int) sendOutcome { return calls[i].run(ctx, batched) })
			for i := range calls {
				g, w := got[i], want[i]
				if g.res != w.res || g.ok != w.ok || g.delay != w.delay || strings.ReplaceAll(g.err, "batched", "alone") != w.err {
					t.Fatalf("step %d call %d %+v: batched got %+v, want %+v (alone)", step, i, calls[i], g, w)
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
			cancels := sendRunBatch(t, batched.client(), len(got), func(i int) sendOutcome {
				if i%2 == 0 && got[i].r != nil {
					if err := got[i].r.Cancel(ctx); err != nil {
						return sendOutcome{err: err.Error()}
					}
				}
				return sendOutcome{}
			})
			for i, c := range cancels {
				if c.err != "" {
					t.Fatalf("step %d: cancel %d: got %s, want no error", step, i, c.err)
				}
			}
			g, w := sendCall{}.run(ctx, batched), sendCall{}.run(ctx, alone)
			if g.res != w.res {
				t.Fatalf("step %d: state after the cancels: batched got %+v, want %+v (alone)", step, g.res, w.res)
			}
		}
	})
}

// Under load requests share round trips (fewer script calls than requests) and nothing
// is over-admitted: 64 goroutines taking permits from one key get exactly the limit.
func TestBatchesUnderLoad(t *testing.T) {
	eachAlgorithm(t, redistest.EachRealTime, func(t *testing.T, alg Algorithm, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		l, err := New(b.Client, "load", PerHour(300), WithAlgorithm(alg), WithKeyPrefix(b.Prefix))
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
			t.Fatalf("%d script calls for %d requests, want fewer: no round trip was shared", c, requests.Load())
		}
		t.Logf("%d requests in %d script calls", requests.Load(), grants.Calls())
	})
}

// A caller whose context ends while its request waits in the queue leaves it: it gets
// ctx.Err(), and nothing is taken for it (the request is never sent).
func TestCallerLeavesQueue(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		l := tl.limiter("leave", PerSecond(5))
		var sent atomic.Int64
		b.Client.AddHook(sendPipeHook(func(cmds []redis.Cmder) {
			for _, cmd := range cmds {
				if sendIsEval(cmd) {
					sent.Add(int64(sendRequests(cmd)))
				}
			}
		}))
		queued, release := sendHold(t, l.client())
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() {
			_, err := l.Reserve(ctx, 2, time.Second)
			errc <- err
		}()
		queued(1)
		cancel()
		if err := <-errc; !errors.Is(err, context.Canceled) {
			t.Fatalf("Reserve whose context ended in the queue: got %v, want context.Canceled", err)
		}
		release()
		if n := sent.Load(); n != 0 {
			t.Fatalf("%d requests sent after the only caller left the queue, want 0", n)
		}
		res, err := l.AllowN(context.Background(), 0)
		if err != nil || res.Remaining != 5 {
			t.Fatalf("after the caller left: got %+v, %v; want 5 remaining", res, err)
		}
	})
}

// sendPipeHook is a go-redis hook that calls see with the commands of each pipeline
// before sending them.
type sendPipeHook func(cmds []redis.Cmder)

func (h sendPipeHook) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h sendPipeHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h sendPipeHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h(cmds)
		return next(ctx, cmds)
	}
}

// A lost reply fails every caller of the round trip with ErrUnavailable, and what the
// round trip granted stands once: MULTI/EXEC is never re-sent.
func TestBatchLostReply(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t)
	ctx := context.Background()
	for _, alg := range allAlgorithms {
		l, err := New(rdb, "lost"+alg.String(), PerHour(10), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := rdb.ScriptLoad(ctx, l.t.script.src).Err(); err != nil { // so the lost reply is the script's
			t.Fatal(err)
		}
		proxy.DropReplyTo("exec")
		got := sendRunBatch(t, l.client(), 3, func(int) sendOutcome { return sendCall{false, 1, 0}.run(ctx, l) })
		for i, g := range got {
			if !errors.Is(g.errv, ErrUnavailable) {
				t.Fatalf("%v: call %d of a round trip whose reply was lost: got %+v, want ErrUnavailable", alg, i, g)
			}
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 7 {
			t.Fatalf("%v: after the lost reply: got %+v, %v; want its 3 grants charged once (7 remaining)", alg, res, err)
		}
	}
	if d := proxy.Dropped(); d != len(allAlgorithms) {
		t.Fatalf("%d replies dropped, want %d", d, len(allAlgorithms))
	}
}

// A caller whose context ends while its round trip is in flight returns at once with
// ctx.Err(), and the booking the reply brings it is given back, once; the others in
// the round trip keep theirs.
func TestCallerLeavesInFlight(t *testing.T) {
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
	inFlight := make(chan struct{})
	rdb.AddHook(sendPipeHook(func(cmds []redis.Cmder) {
		for _, cmd := range cmds {
			if sendIsEval(cmd) && sendRequests(cmd) == 2 {
				close(inFlight)
			}
		}
	}))
	got := sendRunBatch(t, l.client(), 2, func(i int) sendOutcome {
		if i == 0 {
			go func() { <-inFlight; cancel() }() // leave once the round trip is sent
			return sendCall{true, 1, 2 * time.Hour}.run(leave, l)
		}
		return sendCall{true, 1, 2 * time.Hour}.run(ctx, l)
	})
	if !errors.Is(got[0].errv, context.Canceled) {
		t.Fatalf("the caller that left: got %+v, want context.Canceled", got[0])
	}
	if !got[1].ok || got[1].delay <= 0 {
		t.Fatalf("the caller that stayed: got %+v, want a booking ahead", got[1])
	}
	sendEventually(t, signalWait, "the leaver's booking given back", func() bool { return len(grants.GiveBacks()) > 0 })
	proxy.Delay("", 0)
	if _, err := l.AllowN(ctx, 0); err != nil { // a round trip after the give-back
		t.Fatal(err)
	}
	if gb := grants.GiveBacks(); len(gb) != 1 || !gb[0].OK || gb[0].N != 1 {
		t.Fatalf("give-backs: got %+v, want one of 1 permit", gb)
	}
	if n := grants.Total(); n != 3 {
		t.Fatalf("%d permits granted and not given back, want 3", n)
	}
}

// pipes counts the pipelines that carry script calls, and the script calls in them.
type sendPipes struct {
	mu           sync.Mutex
	pipes, calls int
}

func (c *sendPipes) see(cmds []redis.Cmder) {
	n := 0
	for _, cmd := range cmds {
		if sendIsEval(cmd) {
			n++
		}
	}
	if n > 0 {
		c.mu.Lock()
		c.pipes++
		c.calls += n
		c.mu.Unlock()
	}
}

// Requests on different keys of one client that queue together go in one round trip:
// one script call per key (each key's requests in one call, decided as calls of their
// own), all in one pipeline (on a cluster, one transaction per key's slot). Each key
// keeps its own limit.
func TestKeysShareARoundTrip(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		var c sendPipes
		b.Client.AddHook(sendPipeHook(c.see))
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
		got := sendRunBatch(t, lims[0].client(), 3*len(lims), func(i int) sendOutcome {
			return sendCall{false, 1, 0}.run(ctx, lims[i%len(lims)])
		})
		for i, g := range got {
			want := i < 2*len(lims) // each key: 2 of its 3 requests allowed
			if g.err != "" || g.res.Allowed != want {
				t.Fatalf("request %d (key %d): got %+v, want allowed %v", i, i%len(lims), g, want)
			}
		}
		wantPipes := 1
		if b.Kind == redistest.Cluster {
			wantPipes = len(lims)
		}
		if c.pipes != wantPipes || c.calls != len(lims) {
			t.Fatalf("%d requests on %d keys: got %d pipelines of %d script calls, want %d of %d",
				len(got), len(lims), c.pipes, c.calls, wantPipes, len(lims))
		}
	})
}

// A round trip's reply carries each failed request's own error: under an override of 1
// per second, the requests of a batch for 2 fail with ErrExceedsLimit while those for 1
// and 0 are answered, in order; on a key that holds another algorithm's state every
// request of a batch fails with an *AlgorithmError naming that algorithm, reads
// (AllowN 0) too.
func TestBatchRequestErrors(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		tl := newTimeline(t, b)
		ctx := context.Background()
		ns := []int{1, 0, 2, 0, 1}
		l := tl.limiter("exceeds", PerSecond(5))
		if err := l.Override(ctx, time.Minute, PerSecond(1)); err != nil {
			t.Fatal(err)
		}
		got := sendRunBatch(t, l.client(), len(ns), func(i int) sendOutcome { return sendCall{false, ns[i], 0}.run(ctx, l) })
		for i, want := range []bool{true, true, false, true, false} { // the first AllowN(1) takes the last one's room
			g := got[i]
			switch {
			case ns[i] == 2 && !errors.Is(g.errv, ErrExceedsLimit):
				t.Fatalf("request %d, AllowN(2) under an override of 1: got %+v, want ErrExceedsLimit", i, g)
			case ns[i] != 2 && (g.err != "" || g.res.Allowed != want):
				t.Fatalf("request %d, AllowN(%d): got %+v, want allowed %v", i, ns[i], g, want)
			}
		}

		other := tl.limiter("mixed", PerSecond(5), WithAlgorithm(FixedWindow))
		if _, err := other.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		l = tl.limiter("mixed", PerSecond(5), WithAlgorithm(TokenBucket))
		got = sendRunBatch(t, l.client(), len(ns), func(i int) sendOutcome { return sendCall{false, ns[i], 0}.run(ctx, l) })
		for i, n := range ns {
			var ae *AlgorithmError
			if g := got[i]; !errors.As(g.errv, &ae) || ae.Found != FixedWindow || ae.Want != TokenBucket {
				t.Fatalf("request %d, AllowN(%d): got %v, want an *AlgorithmError naming FixedWindow", i, n, g.errv)
			}
		}
	})
}

// sendGate holds each pipeline that carries a script call while on, until the test
// lets it go, and tells the test how many requests each carries.
type sendGate struct {
	on      atomic.Bool
	entered chan int           // a held pipeline's requests
	release chan chan struct{} // let one held pipeline go; closed when it returned
}

func newSendGate() *sendGate {
	return &sendGate{entered: make(chan int, 16), release: make(chan chan struct{})}
}

func (g *sendGate) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (g *sendGate) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (g *sendGate) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		reqs := 0
		for _, cmd := range cmds {
			if sendIsEval(cmd) {
				reqs += sendRequests(cmd)
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

// Two round trips of a client may be in flight at once, never three: of two calls at
// once the second goes beside the first at once; calls that come while two are in
// flight queue, and go together in one round trip when one lands. Each is decided
// once, by its own request.
func TestTwoRoundTripsInFlight(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		g := newSendGate()
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
		results := make(chan sendOutcome, 6)
		call := func() { results <- sendCall{false, 1, 0}.run(ctx, l) }
		entered := func(what string, want int) {
			t.Helper()
			select {
			case n := <-g.entered:
				if n != want {
					t.Fatalf("%s: got a round trip of %d requests, want %d", what, n, want)
				}
			case <-time.After(signalWait):
				t.Fatalf("%s: no round trip sent within %v", what, signalWait)
			}
		}
		go call()
		entered("the first call", 1)
		go call() // the first is still in flight
		entered("the second call", 1)
		for range 4 {
			go call()
		}
		sendEventually(t, signalWait, "4 calls queued", func() bool { return sendQueued(l.client()) == 4 })
		l.client().mu.Lock()
		flying := len(l.client().flights)
		l.client().mu.Unlock()
		if flying != 2 {
			t.Fatalf("%d round trips in flight, want 2", flying)
		}
		select {
		case n := <-g.entered:
			t.Fatalf("a third round trip (%d requests) while two are in flight, want none", n)
		default:
		}
		done := make(chan struct{})
		g.release <- done // the first lands: the queue goes
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
				t.Fatalf("call %d: got %+v, want allowed", i, o)
			}
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 94 {
			t.Fatalf("after 6 calls: got %+v, %v; want 94 remaining (each decided once)", res, err)
		}
	})
}

// sendHoldKey is a go-redis hook that holds each pipeline carrying a script call on
// key until release is closed.
type sendHoldKey struct {
	key     string
	held    chan struct{} // closed when a pipeline of key is held
	release chan struct{}
	once    sync.Once
}

func (h *sendHoldKey) DialHook(next redis.DialHook) redis.DialHook          { return next }
func (h *sendHoldKey) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (h *sendHoldKey) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if sendIsEval(cmd) && strings.Contains(fmt.Sprint(cmd.Args()[3]), h.key) {
				h.once.Do(func() { close(h.held) })
				<-h.release
			}
		}
		return next(ctx, cmds)
	}
}

// On a cluster a round trip's keys go as transactions of their own, and each key's
// callers are answered as its transaction lands: a node slow to answer holds back only
// its own keys' callers.
func TestClusterKeysLandOnTheirOwn(t *testing.T) {
	b := redistest.NewCluster(t)
	ctx := context.Background()
	slow, err := New(b.Client, "slow-key", PerHour(10), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	quick, err := New(b.Client, "quick-key", PerHour(10), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range []*Limiter{slow, quick} { // the scripts loaded
		if _, err := l.AllowN(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	h := &sendHoldKey{key: "slow-key", held: make(chan struct{}), release: make(chan struct{})}
	b.Client.AddHook(h)
	defer close(h.release)
	queued, release := sendHold(t, slow.client())
	slowDone, quickDone := make(chan error, 1), make(chan error, 1)
	go func() { _, err := slow.Allow(ctx); slowDone <- err }()
	queued(1)
	go func() { _, err := quick.Allow(ctx); quickDone <- err }()
	queued(2)
	release() // one round trip of both keys
	<-h.held
	select {
	case err := <-quickDone:
		if err != nil {
			t.Fatalf("the quick key's Allow: got %v, want a grant", err)
		}
	case <-time.After(signalWait):
		t.Fatalf("the quick key's caller is still waiting after %v while the slow key's transaction is held, want it answered", signalWait)
	}
	select {
	case err := <-slowDone:
		t.Fatalf("the slow key's Allow returned (%v) while its transaction is held, want it waiting", err)
	default:
	}
}

// ---- how a round trip is sent: EVALSHA, EVAL once after NOSCRIPT, MULTI/EXEC unless
// the client never re-sends; a reply the scripts never give (TestLostReplyChargesOnce
// and TestLostReplySemaphoreAndPauseOnce, in send_lostreply_test.go, check at-most-once on a
// real server through a proxy that drops replies)

// A script that answers what the scripts never do (a reply too short for its requests,
// an error's text out of the reply's bounds) fails each of its requests with
// ErrUnexpectedReply, and so does one whose reply is no array of integers. (A nil in
// place of one of the integers is not seen: go-redis reads it as 0.)
func TestUnexpectedReply(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, c := range []struct {
			name, src string
			want      error
		}{
			{"too short", "return {1, 0, 0, 0, 0, 0}", ErrUnexpectedReply},
			{"error text out of bounds", "return {-1, 1, 50, 3, 0, 0, 0}", ErrUnexpectedReply},
			{"error text of negative length", "return {-1, 1, 8, -1, 0, 0, 0}", ErrUnexpectedReply},
			{"error text inside the requests' integers", "return {-1, 1, 2, 3, 0, 0, 0}", ErrUnexpectedReply},
			{"not integers", "return {1, 'x', 0, 0, 0, 0, 0}", ErrUnexpectedReply},
			{"a nil", "return false", ErrUnexpectedReply},
		} {
			l, err := New(b.Client, "odd", PerSecond(5), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			l.useScript(scriptOf("local t = redis.call('TIME') " + c.src))
			_, err = l.Allow(ctx)
			if err == nil || c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("%s: got %v, want %v", c.name, err, c.want)
			}
			t.Logf("%s: %v", c.name, err)
		}
	})
}

// A script the server does not have (a restart or SCRIPT FLUSH lost it) runs by EVAL,
// once, then by EVALSHA again; a script's own errors come back mapped.
func TestNoScriptRunsEvalOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		l, err := New(b.Client, "once", PerHour(10), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := scriptFlush(ctx, b.Client); err != nil {
			t.Fatal(err)
		}
		var evals sendScriptCalls // EVALs sent, answered or not
		b.Client.AddHook(sendPipeHook(func(cmds []redis.Cmder) {
			for _, cmd := range cmds {
				if cmd.Name() == "eval" {
					evals.n.Add(1)
				}
			}
		}))
		for want := 9; want >= 8; want-- { // the first by EVAL, the second by EVALSHA
			res, err := l.Allow(ctx)
			if err != nil || res.Remaining != want {
				t.Fatalf("Allow #%d: got %+v, %v; want %d remaining (run once)", 10-want, res, err, want)
			}
			if got := evals.n.Load(); got != 1 {
				t.Fatalf("after Allow #%d: %d calls by EVAL, want 1 (the first, after NOSCRIPT)", 10-want, got)
			}
		}
		fail, err := New(b.Client, "once-fails", PerHour(10), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		fail.useScript(scriptOf("local t = redis.call('TIME') return redis.error_reply('JTARG test')"))
		if _, err := fail.Allow(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a script that fails: got %v, want its JTARG reply as ErrInvalidArgument", err)
		}
		if got := evals.n.Load(); got != 2 {
			t.Fatalf("%d calls by EVAL, want 2 (the failing script, new to the server, once)", got)
		}
	})
}

// sendTxCount counts the script calls sent in a transaction (MULTI/EXEC) and those sent
// as plain commands.
type sendTxCount struct {
	mu        sync.Mutex
	tx, plain int
}

func (c *sendTxCount) see(cmds []redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	multi := false
	for _, cmd := range cmds {
		switch {
		case cmd.Name() == "multi":
			multi = true
		case sendIsEval(cmd) && multi:
			c.tx++
		case sendIsEval(cmd):
			c.plain++
		}
	}
}

func (c *sendTxCount) get() (tx, plain int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tx, c.plain
}

// A client that never re-sends (MaxRetries < 0) gets plain EVALSHA, no MULTI/EXEC, and
// a reply it loses still charges once and fails with ErrUnavailable; a client with
// go-redis's default retries keeps the transaction.
func TestNeverResendingClientSkipsTheTransaction(t *testing.T) {
	direct, proxy, _ := redistest.NewProxied(t)
	ctx := context.Background()
	for _, retries := range []int{-1, 0} {
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: retries})
		defer rdb.Close()
		var c sendTxCount
		rdb.AddHook(sendPipeHook(c.see))
		l, err := New(rdb, fmt.Sprint("plain", retries), PerHour(10), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := direct.Client.ScriptLoad(ctx, l.t.script.src).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		tx, plain := c.get()
		if wantTx := retries >= 0; (tx == 1) != wantTx || (plain == 1) == wantTx {
			t.Fatalf("MaxRetries %d: got %d transactions, %d plain calls; want a transaction %v", retries, tx, plain, wantTx)
		}
		if retries >= 0 {
			continue
		}
		proxy.DropReplyTo("evalsha")
		if _, err := l.Allow(ctx); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("MaxRetries %d, reply lost: got %v, want ErrUnavailable", retries, err)
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 8 { // 10 less the call above and the lost one
			t.Fatalf("MaxRetries %d, after a lost reply: got %+v, %v; want 8 remaining (charged once)", retries, res, err)
		}
	}
}
