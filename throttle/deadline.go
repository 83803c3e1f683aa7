package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// errNoReply is why a call returned without Redis's reply.
var errNoReply = errors.New("no reply")

// awaitReply runs c, one script call on rdb (evalOnce, with a pipeline from ps), and
// returns its reply, or returns early, whatever rdb's options, once the caller cannot
// use the reply any more:
//
//   - when ctx's deadline passes, with an error wrapping ErrUnavailable (Redis did
//     not answer in time) and context.DeadlineExceeded (so a caller that stops at
//     its deadline, or hands work back when a budget ends, sees that too): a go-redis
//     client built without ContextTimeoutEnabled waits for its own ReadTimeout,
//     retries included, whatever the deadline (a 1s deadline returned after 3s, 10s
//     after 12s);
//   - when bound (if positive) has passed first, with an error wrapping
//     ErrUnavailable only: the caller's own deadline has not passed (see
//     WithCallTimeout);
//   - when ctx is cancelled, with ctx.Err().
//
// The call goes on in the background; if it then brings a reply, late is given it
// (late may be nil), so that a grant its caller never saw can be given back. A call
// that may return early runs on a call worker (see handOver) while the caller waits,
// with a timer kept for reuse; one whose context never ends and has no bound calls
// directly (and see evalOnTime: so does one that go-redis itself bounds).
//
// A call that fails on its own, once ctx's deadline has passed, also reports
// ErrUnavailable unless Redis answered with an error of its own, so a client that
// honours deadlines (ContextTimeoutEnabled) yields the same error as one that does not.
func awaitReply(ctx context.Context, bound time.Duration, rdb redis.UniversalClient, ps *pipePool, c command, late func(any)) (any, error) {
	t := boundTimer(ctx, bound)
	if ctx.Done() == nil && t == nil { // nothing to return early for
		return c.once(ctx, rdb, ps)
	}
	var expired <-chan time.Time
	if t != nil {
		expired = t.C
		defer stopTimer(t)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	p := newPendingReply(ctx, rdb, ps, c, late)
	handOver(p)
	select {
	case <-p.done:
	case <-expired:
		if p.state.CompareAndSwap(0, 2) {
			return nil, callTimedOut(bound) // p is the worker's now
		}
		<-p.done // the reply came as the bound passed: use it
	case <-ctx.Done():
		if p.state.CompareAndSwap(0, 2) { // p is the worker's now
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, noReply(ctx, nil)
			}
			return nil, ctx.Err()
		}
		<-p.done // the reply came as the context ended: use it
	}
	val, err := p.val, p.err
	p.free()
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && !isServerError(err) {
		return nil, noReply(ctx, err)
	}
	return val, err
}

// pendingReply is a call made in the background and its reply on its way to the
// caller who waits for it. Whoever is last to use it (the caller who got the reply,
// or the worker whose caller left) keeps it for the next call (pendingReplies).
type pendingReply struct {
	state atomic.Int32 // 0: the caller waits; 1: the reply was handed over; 2: the caller left
	val   any
	err   error
	done  chan struct{} // gets one value when the reply was handed over (buffered: kept for reuse)

	ctx  context.Context
	rdb  redis.UniversalClient
	ps   *pipePool
	c    command
	late func(any) // gets a reply that came after the caller left, or nil
}

// pendingReplies holds pendingReplies for reuse: one with its channel costs two
// allocations.
var pendingReplies sync.Pool

// newPendingReply returns a pendingReply for the call c (see awaitReply).
func newPendingReply(ctx context.Context, rdb redis.UniversalClient, ps *pipePool, c command, late func(any)) *pendingReply {
	p, ok := pendingReplies.Get().(*pendingReply)
	if !ok {
		p = &pendingReply{done: make(chan struct{}, 1)}
	}
	p.ctx, p.rdb, p.ps, p.c, p.late = ctx, rdb, ps, c, late
	return p
}

// free clears p, which nobody uses any more, and keeps it for reuse. Its channel is
// empty: its one value, if sent, was received.
func (p *pendingReply) free() {
	*p = pendingReply{done: p.done}
	pendingReplies.Put(p)
}

// call makes the call and hands its reply to the caller, or to late if the caller left.
func (p *pendingReply) call() {
	v, e := p.c.once(p.ctx, p.rdb, p.ps)
	if p.state.CompareAndSwap(0, 1) {
		p.val, p.err = v, e
		p.done <- struct{}{} // the caller frees p
		return
	}
	if e == nil && p.late != nil { // the caller left without it
		p.late(v)
	}
	p.free()
}

// Calls handed over (awaitReply) run on call workers: goroutines that, once a call is
// done, wait up to workerIdle for the next one (on calls) before they end. A new
// goroutine per call would start on a small stack and grow it on each call (go-redis's
// call path is deep): that copy, the goroutine's start and its end were a sixth of a
// lone Allow's CPU. A worker is handed a call only while it waits for one, so a call
// never waits for another's; when none waits, a new one starts.
var calls = make(chan *pendingReply)

// workerIdle is how long a call worker waits for its next call before it ends. Short:
// a process whose calls stop is left with no worker within a second or so.
const workerIdle = time.Second

// handOver runs p.call on a call worker: one waiting for a call, else a new one.
func handOver(p *pendingReply) {
	select {
	case calls <- p:
	default:
		go callWorker(p)
	}
}

// callWorker runs p.call, then each call it is handed while it waits for one, until
// none comes within workerIdle.
func callWorker(p *pendingReply) {
	idle := time.NewTimer(workerIdle)
	for {
		p.call()
		idle.Reset(workerIdle)
		select {
		case p = <-calls:
		case <-idle.C:
			return
		}
	}
}

// errCallTimeout is why a call returned at its own bound (WithCallTimeout).
var errCallTimeout = errors.New("within the call timeout")

// callTimedOut is the error of a call that had no reply within its bound.
func callTimedOut(bound time.Duration) error {
	return fmt.Errorf("%w: %w: %w (%v)", ErrUnavailable, errNoReply, errCallTimeout, bound)
}

// boundTimer returns a timer that fires once bound has passed, unless ctx's deadline
// comes first or bound is not positive (nil: no timer). Give it back with stopTimer.
func boundTimer(ctx context.Context, bound time.Duration) *time.Timer {
	if bound <= 0 {
		return nil
	}
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= bound {
		return nil
	}
	if t, ok := timers.Get().(*time.Timer); ok {
		t.Reset(bound)
		return t
	}
	return time.NewTimer(bound)
}

// stopTimer stops t and keeps it for the next call: since Go 1.23 (this module's
// go line is later) a stopped timer's channel holds no stale tick, so a reused one
// fires only for its new bound.
func stopTimer(t *time.Timer) {
	t.Stop()
	timers.Put(t)
}

// timers holds stopped bound timers for reuse (a timer costs two allocations).
var timers sync.Pool

// noReply is the error of a call whose context's deadline passed before Redis
// answered: it wraps ErrUnavailable and context.DeadlineExceeded, both being true.
func noReply(ctx context.Context, cause error) error {
	dl, _ := ctx.Deadline()
	if cause != nil {
		return fmt.Errorf("%w: %w before the context's deadline (%s ago, %w): %v", ErrUnavailable, errNoReply, time.Since(dl).Round(time.Millisecond), context.DeadlineExceeded, cause)
	}
	return fmt.Errorf("%w: %w before the context's deadline (%s ago, %w)", ErrUnavailable, errNoReply, time.Since(dl).Round(time.Millisecond), context.DeadlineExceeded)
}

// isServerError reports whether err is a reply of Redis's own (a script's error,
// NOSCRIPT, WRONGTYPE…) rather than a failure to get one.
func isServerError(err error) bool {
	var rerr redis.Error
	return errors.As(err, &rerr) && !errors.Is(err, context.DeadlineExceeded)
}

// evalOnTime is evalOnce of c, returning by ctx's deadline or within r.callTimeout,
// whichever comes first (see awaitReply); late, if not nil, gets a reply that came
// after its caller left.
//
// A call whose context can never end (ctx.Done() is nil: Background, TODO, WithoutCancel)
// on a client that honours deadlines (r.direct, see honoursDeadlines), and that has
// nothing to give back should its reply come after the bound (late nil: an Allow, a
// cancel, a Pause; not a booking ahead or a semaphore acquire), runs on the caller's
// goroutine (callDirect): go-redis itself then returns by the call timeout, and no
// goroutine is handed the call. Any other goes through awaitReply, whose goroutine
// still reads a reply that comes after the bound (on a client without a read timeout
// shorter than it) and gives back what it granted.
func (r *runner) evalOnTime(ctx context.Context, c command, late func(any)) (any, error) {
	if r.direct && ctx.Done() == nil && late == nil {
		if r.onPath != nil {
			r.onPath(true)
		}
		return callDirect(ctx, r.callTimeout, r.rdb, r.pipes, c)
	}
	if r.onPath != nil {
		r.onPath(false)
	}
	return awaitReply(ctx, r.callTimeout, r.rdb, r.pipes, c, late)
}

// callDirect runs c on the caller's goroutine under a context whose deadline is bound
// from now: on a client that honours deadlines (see honoursDeadlines) every wait of
// the call ends by it, so the call returns within bound as awaitReply's would, with
// the same error (callTimedOut, which does not match context.DeadlineExceeded: the
// caller's context has none). ctx must never end (ctx.Done() nil): nothing but the
// bound can cut the call short, and the caller always gets the reply, so no grant
// can come after its caller left.
func callDirect(ctx context.Context, bound time.Duration, rdb redis.UniversalClient, ps *pipePool, c command) (any, error) {
	bctx := newBoundCtx(ctx, bound)
	val, err := c.once(bctx, rdb, ps)
	expired := bctx.release()
	if err != nil && expired && !isServerError(err) {
		return nil, fmt.Errorf("%w: %v", callTimedOut(bound), err)
	}
	return val, err
}

// honoursDeadlines reports whether every wait of a call on rdb ends by its context's
// deadline, so that a call made directly under a deadline returns by it (callDirect):
// a plain go-redis Client built with ContextTimeoutEnabled. Such a client waits for a
// connection from its pool, for a dial, and between retries only until the context is
// done (go-redis does so whatever its options), and sets each read and write deadline
// of the connection, those of a new connection's handshake included, no later than
// the context's (only with ContextTimeoutEnabled: without it a read waits its
// ReadTimeout whatever the context, and a new connection's handshake that hangs is
// retried MaxRetries times, so that a call can take several times its bound).
// A FailoverClient (its dialer asks the sentinels), a ClusterClient and a Ring are not
// taken to be one: their redirects, slot reloads and sentinel lookups are not read
// here, and their calls keep a goroutine of their own.
func honoursDeadlines(rdb redis.UniversalClient) bool {
	c, ok := rdb.(*redis.Client)
	if !ok {
		return false
	}
	o := c.Options()
	return o.ContextTimeoutEnabled && o.Addr != failoverAddr
}

// failoverAddr is the address a go-redis FailoverClient's options hold (sentinel.go).
const failoverAddr = "FailoverClient"

// callTimeout returns the bound of each Redis call: the one set (WithCallTimeout),
// else one try of rdb's: DialTimeout + WriteTimeout + ReadTimeout, go-redis's
// defaults standing in for any unset or disabled.
func callTimeout(set time.Duration, rdb redis.UniversalClient) time.Duration {
	if set > 0 {
		return set
	}
	dial, write, read := 5*time.Second, 3*time.Second, 3*time.Second // go-redis's defaults
	or := func(v, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		return def
	}
	switch c := rdb.(type) {
	case *redis.Client: // FailoverClient's too
		o := c.Options()
		dial, write, read = or(o.DialTimeout, dial), or(o.WriteTimeout, write), or(o.ReadTimeout, read)
	case *redis.ClusterClient:
		o := c.Options()
		dial, write, read = or(o.DialTimeout, dial), or(o.WriteTimeout, write), or(o.ReadTimeout, read)
	case *redis.Ring:
		o := c.Options()
		dial, write, read = or(o.DialTimeout, dial), or(o.WriteTimeout, write), or(o.ReadTimeout, read)
	}
	return dial + write + read
}

// lateCancelTimeout bounds the call that gives back a grant whose caller had left.
const lateCancelTimeout = 2 * time.Second

// lateReply returns what awaitReply does with the reply to an acquire of n permits
// that came after its caller had left: a grant booked ahead is given back, as the
// caller would have done had it seen it. A grant that took effect at once has been
// used as far as the limit can tell (the scripts give back only bookings still
// ahead), and counts. Other operations leave nothing to give back (nil).
func (l *Limiter) lateReply(op, n int) func(any) {
	if op != opAcquire || n == 0 {
		return nil
	}
	return func(val any) {
		var v [5]int64 // {granted, remaining, wait_us, reset_us, token}
		if !int64s(val, v[:]) || v[0] != 1 || v[2] <= 0 {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), lateCancelTimeout)
		defer cancel()
		_ = l.cancel(ctx, n, v[4])
	}
}

// lateFor is lateReply for a call with ARGV args ({op, n, waitOrToken, ...}). An
// acquire whose longest wait is 0 (Allow, AllowN) cannot book ahead: what it grants
// takes effect at once, so it has nothing to give back (nil).
func (l *Limiter) lateFor(_ context.Context, args []any) func(any) {
	op, _ := args[0].(int)
	n, _ := args[1].(int)
	if x, _ := args[2].(int64); op == opAcquire && x == 0 {
		return nil
	}
	if op == opAcquire && n == 1 {
		return l.late1
	}
	return l.lateReply(op, n)
}

// lateFor is lateAcquire for a call with ARGV args ({op, id, ...}); a call made for a
// place that is kept (ctx has keepPlace: TryAcquireFor, AcquireFor) keeps it.
func (s *Semaphore) lateFor(ctx context.Context, args []any) func(any) {
	op, _ := args[0].(int)
	id, _ := args[1].(string)
	return s.lateAcquire(op, id, ctx.Value(keepPlace{}) != nil)
}

// keepPlace marks the context of a semaphore call whose id keeps its place in the
// queue when its caller leaves (see Semaphore.call).
type keepPlace struct{}

// lateAcquire returns what awaitReply does with the reply to a semaphore acquire for
// lease id that came after its caller had left: the lease it may have granted, or the
// place in the queue it may have taken, is given back (a release of id; one that
// holds nothing frees nothing). Other operations, and an id whose place is kept when
// its caller leaves (keep: TryAcquireFor, AcquireFor), need nothing (nil): the place,
// and a slot handed to it, wait for the next call with the id.
func (s *Semaphore) lateAcquire(op int, id string, keep bool) func(any) {
	if op != semAcquire || keep {
		return nil
	}
	return func(any) {
		ctx, cancel := context.WithTimeout(context.Background(), lateCancelTimeout)
		defer cancel()
		_, _ = s.run(ctx, semRelease, id, false, false)
	}
}

// boundCtx is the context of a direct call (callDirect): its parent's values, and a
// deadline bound from when it was made, its Done channel closed by a timer then. The
// parent never ends (its Done is nil). One that was released before its timer fired
// is kept for the next call (boundCtxs), channel and timer included: a call made this
// way allocates nothing for its deadline. go-redis keeps no context past the call's
// return (its background dials use their own).
type boundCtx struct {
	context.Context // the parent
	deadline        time.Time
	done            chan struct{}
	timer           *time.Timer
	fired           atomic.Bool
}

// boundCtxs holds released boundCtxs whose timers never fired.
var boundCtxs sync.Pool

// newBoundCtx returns a boundCtx of parent (whose Done is nil) with a deadline bound
// from now. Release it with release once the call returned.
func newBoundCtx(parent context.Context, bound time.Duration) *boundCtx {
	b, ok := boundCtxs.Get().(*boundCtx)
	if !ok {
		b = &boundCtx{done: make(chan struct{})}
		b.timer = time.AfterFunc(time.Hour, b.expire)
		b.timer.Stop()
	}
	b.Context = parent
	b.deadline = time.Now().Add(bound)
	b.timer.Reset(bound)
	return b
}

// expire ends b at its deadline.
func (b *boundCtx) expire() {
	b.fired.Store(true)
	close(b.done)
}

// release stops b's timer and reports whether its deadline had passed (its timer
// fired, or is firing, or the deadline is behind us: the connection's read deadline,
// set to the same instant, may end the call before a late timer runs); b must not be
// used after. One whose timer never fired is kept for reuse.
func (b *boundCtx) release() (expired bool) {
	if b.timer.Stop() {
		expired = !time.Now().Before(b.deadline)
		b.Context = nil
		boundCtxs.Put(b)
		return expired
	}
	return true // fired: its channel is closed, or about to be; it is not reused
}

func (b *boundCtx) Deadline() (time.Time, bool) { return b.deadline, true }
func (b *boundCtx) Done() <-chan struct{}       { return b.done }
func (b *boundCtx) Err() error {
	if b.fired.Load() {
		return context.DeadlineExceeded
	}
	return nil
}
