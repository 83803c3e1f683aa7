package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// Coalescing (group commit) and pipelining. Calls of one process on one client that
// arrive while a call of that client is in flight queue up; when it returns,
// everything queued (up to pipeCap requests) goes to Redis in ONE round trip: the
// requests of each key in one script call, the batch form of the limiter scripts
// (lua/batch.lua), which decides them in arrival order, each exactly as a call of its
// own at that server instant would be; the calls of different keys in one pipeline
// (MULTI/EXEC, as every call; on a cluster, one transaction per key, sent at once). No timer: a lone caller finds nothing in flight and calls at once, as
// without coalescing; batches form only while Redis is busy answering, and grow with
// the load.
//
// Every request keeps its own semantics: its op, n and max wait; its own context (a
// caller whose context ends before its batch is sent leaves the queue and takes
// nothing; one whose context ends while the batch is in flight gets the error it would
// get alone, and a grant booked ahead for it is given back, see lateReply); its
// hooks, failure policy (each key's breaker) and StateLost check. A round trip runs
// once (MULTI/EXEC, never re-sent): a lost reply fails each request in it with
// ErrUnavailable, and what it granted stands once.

// batchCap is the most requests one script call carries: a batch of 128
// single-permit requests keeps Redis busy for well under a millisecond. pipeCap is the
// most requests one round trip carries, over every key.
const (
	batchCap = 128
	pipeCap  = 512
)

// batcher queues one client's calls while one is in flight. Every Limiter of the
// process on the client (with coalescing on) feeds the same queue (batchers).
type batcher struct {
	rdb   redis.UniversalClient
	mu    sync.Mutex
	busy  bool       // a call of the client is in flight (or being sent)
	queue []*pending // arrival order
}

// batchers holds each client's batcher while a Limiter holds it.
var batchers registry[redis.UniversalClient, batcher]

// A pending request's states.
const (
	pendQueued int32 = iota // in the queue
	pendSent                // in a batch in flight
	pendDone                // answered: val and err are set and done is closed
	pendLeft                // its caller left (its context ended)
)

// pending is one queued request.
type pending struct {
	l     *Limiter
	ctx   context.Context
	op, n int
	x     int64
	late  func(any) // what a grant made after the caller left needs (lateReply)
	state atomic.Int32
	val   any
	err   error
	done  chan struct{}
}

// decide runs one request through the client's batcher: at once when no call of the
// client is in flight, else in the round trip sent when it returns. args is the request's ARGV
// in the single form.
func (l *Limiter) decide(ctx context.Context, op, n int, x int64, args []any, late func(any)) (any, error) {
	b := l.batch
	if b == nil {
		return l.execLate(ctx, l.script, l.keys, args, late)
	}
	b.mu.Lock()
	if !b.busy {
		b.busy = true
		b.mu.Unlock()
		defer b.next()
		return l.execLate(ctx, l.script, l.keys, args, late)
	}
	p := &pending{l: l, ctx: ctx, op: op, n: n, x: x, late: late, done: make(chan struct{})}
	b.queue = append(b.queue, p)
	b.mu.Unlock()
	return p.wait()
}

// next sends what queued while a call was in flight, in the background, or marks the
// client idle when nothing did.
func (b *batcher) next() {
	b.mu.Lock()
	batch := b.take()
	if batch == nil {
		b.busy = false
	}
	b.mu.Unlock()
	if batch != nil {
		go b.flush(batch)
	}
}

// flush makes round trips until the queue is empty.
func (b *batcher) flush(batch []*pending) {
	for batch != nil {
		send(b.rdb, batch)
		b.mu.Lock()
		batch = b.take()
		if batch == nil {
			b.busy = false
		}
		b.mu.Unlock()
	}
}

// take removes the next round trip's requests from the queue (b.mu held): up to
// pipeCap, in arrival order, skipping those whose callers left; nil when none is left.
func (b *batcher) take() []*pending {
	var batch []*pending
	i := 0
	for ; i < len(b.queue) && len(batch) < pipeCap; i++ {
		p := b.queue[i]
		if p.state.CompareAndSwap(pendQueued, pendSent) {
			batch = append(batch, p)
		}
	}
	clear(b.queue[:i])
	b.queue = b.queue[i:]
	if len(b.queue) == 0 {
		b.queue = b.queue[:0:0] // let the old array go
	}
	return batch
}

// wait returns the request's reply, or what its caller gets when its context ends
// or its call timeout passes first (as awaitReply does for a call of its own).
func (p *pending) wait() (any, error) {
	expired, stop := boundTimer(p.ctx, p.l.callTimeout)
	defer stop()
	select {
	case <-p.done:
	case <-expired:
		if p.state.CompareAndSwap(pendQueued, pendLeft) || p.state.CompareAndSwap(pendSent, pendLeft) {
			return nil, callTimedOut(p.l.callTimeout)
		}
		<-p.done // answered as the bound passed: use it
	case <-p.ctx.Done():
		if p.state.CompareAndSwap(pendQueued, pendLeft) || p.state.CompareAndSwap(pendSent, pendLeft) {
			if errors.Is(p.ctx.Err(), context.DeadlineExceeded) {
				return nil, noReply(p.ctx, nil)
			}
			return nil, p.ctx.Err()
		}
		<-p.done // answered as the context ended: use it
	}
	if p.err != nil && errors.Is(p.ctx.Err(), context.DeadlineExceeded) && errors.Is(p.err, ErrUnavailable) &&
		!errors.Is(p.err, errRecentlyDown) {
		return nil, noReply(p.ctx, p.err)
	}
	return p.val, p.err
}

// answer hands a request its reply, or, when its caller has left, gives late the
// reply (a grant booked ahead goes back) in a goroutine of its own: late calls on
// the key, which would queue behind the batch being answered.
func (p *pending) answer(val any, err error) {
	if p.state.CompareAndSwap(pendSent, pendDone) {
		p.val, p.err = val, err
		close(p.done)
		return
	}
	if err == nil && p.late != nil {
		go p.late(val)
	}
}

// group is the requests of one round trip that go in one script call: one key (one
// shared state) and script, in arrival order, at most batchCap.
type group struct {
	l    *Limiter // the first request's: its script, keys, ARGV tail and breaker
	reqs []*pending
	cmd  *redis.Cmd
}

// groups splits a round trip's requests into script calls, in the order each first
// appears.
func groups(batch []*pending) []*group {
	type gk struct {
		shared *limiterState
		script *redis.Script
	}
	open := map[gk]*group{}
	var out []*group
	for _, p := range batch {
		k := gk{p.l.shared, p.l.script}
		g := open[k]
		if g == nil || len(g.reqs) == batchCap {
			g = &group{l: p.l}
			open[k] = g
			out = append(out, g)
		}
		g.reqs = append(g.reqs, p)
	}
	return out
}

// args is the group's ARGV: the single form for one request, else the batch form.
func (g *group) args() []any {
	l := g.l
	if len(g.reqs) == 1 {
		p := g.reqs[0]
		args := make([]any, 3, 3+len(l.tail))
		args[0], args[1], args[2] = p.op, p.n, p.x
		return append(args, l.tail...)
	}
	args := make([]any, 2, 2+3*len(g.reqs)+len(l.tail))
	args[0], args[1] = lua.Batch, len(g.reqs)
	for _, p := range g.reqs {
		args = append(args, p.op, p.n, p.x)
	}
	return append(args, l.tail...)
}

// send makes one round trip for batch: each key's requests in one script call, the
// calls in one pipeline.
func send(rdb redis.UniversalClient, batch []*pending) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var live []*group
	for _, g := range groups(batch) {
		if err := g.l.skip(); err != nil { // this key's breaker is open
			for _, p := range g.reqs {
				p.answer(nil, err)
			}
			continue
		}
		live = append(live, g)
	}
	if len(live) == 0 {
		return
	}
	if len(live) == 1 && len(live[0].reqs) == 1 { // one call: as a call of its own
		g := live[0]
		val, err := g.l.execLate(ctx, g.l.script, g.l.keys, g.args(), nil)
		g.reqs[0].answer(val, err)
		return
	}
	pipeline(ctx, rdb, live, false)
	var again []*group // the server did not have the script: send it (EVAL)
	for _, g := range live {
		if err := g.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			again = append(again, g)
		}
	}
	if again != nil {
		pipeline(ctx, rdb, again, true)
	}
	for _, g := range live {
		g.deliver(ctx)
	}
}

// pipeline runs the groups' script calls in one round trip (see evalOnce: MULTI/EXEC
// unless the client never re-sends), by EVALSHA or, when eval, EVAL. On a cluster a
// transaction must keep to one hash slot: each group (one key) goes in a transaction
// of its own, all at once.
func pipeline(ctx context.Context, rdb redis.UniversalClient, gs []*group, eval bool) {
	if _, ok := rdb.(*redis.ClusterClient); ok && len(gs) > 1 {
		var wg sync.WaitGroup
		for _, g := range gs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pipeline(ctx, rdb, []*group{g}, eval)
			}()
		}
		wg.Wait()
		return
	}
	var pipe redis.Pipeliner
	if neverResends(rdb) {
		pipe = rdb.Pipeline()
	} else {
		pipe = rdb.TxPipeline()
	}
	cmds := ctx.Value(batchKey{}).(*sync.Map)
	for _, g := range gs {
		if eval {
			g.cmd = g.l.script.Eval(ctx, pipe, g.l.keys, g.args()...)
		} else {
			g.cmd = g.l.script.EvalSha(ctx, pipe, g.l.keys, g.args()...)
		}
		cmds.Store(g.cmd, g.reqs)
	}
	_, _ = pipe.Exec(ctx) // each command holds its own reply or error
}

// deliver answers the group's requests from its command's reply.
func (g *group) deliver(ctx context.Context) {
	l := g.l
	val, err := g.cmd.Val(), g.cmd.Err()
	if err != nil {
		for _, p := range g.reqs {
			p.answer(nil, p.l.failed(p.ctx, err))
		}
		if isUnavailable(ctx, err) {
			l.down()
		}
		return
	}
	l.succeeded()
	if len(g.reqs) == 1 {
		g.reqs[0].answer(val, nil)
		return
	}
	replies, ok := val.([]any)
	if !ok || len(replies) != len(g.reqs) {
		err := fmt.Errorf("%w: key %q: batch of %d: %v", ErrUnexpectedReply, l.key, len(g.reqs), val)
		for _, p := range g.reqs {
			p.answer(nil, err)
		}
		return
	}
	for i, p := range g.reqs {
		if msg, ok := replies[i].(string); ok {
			p.answer(nil, p.l.failed(p.ctx, batchError(msg)))
			continue
		}
		p.answer(replies[i], nil)
	}
}

// batchKey is the context key under which a round trip's context maps each script
// call (*redis.Cmd) to its requests (a *sync.Map of []*pending), so that a go-redis
// hook (the package's tests) can find each request's own context.
type batchKey struct{}

// batchContext is the context a round trip runs under: the first request's values and
// the map of batchKey, no cancellation (a caller that leaves does not take the
// others' call with it), and the latest of the requests' deadlines when each has one.
func batchContext(batch []*pending) (context.Context, context.CancelFunc) {
	ctx := context.WithValue(context.WithoutCancel(batch[0].ctx), batchKey{}, &sync.Map{})
	var last time.Time
	for _, p := range batch {
		dl, ok := p.ctx.Deadline()
		if !ok {
			return ctx, func() {}
		}
		if dl.After(last) {
			last = dl
		}
	}
	return context.WithDeadline(ctx, last)
}

// batchError is the error one request of a batch got (a reply element of text): what
// Redis would have answered to that request alone, as a Redis error.
type batchError string

func (e batchError) Error() string { return strings.TrimSpace(string(e)) }

// RedisError marks it as a reply of Redis's own (go-redis's redis.Error).
func (batchError) RedisError() {}
