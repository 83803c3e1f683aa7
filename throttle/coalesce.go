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
)

// Coalescing (group commit). Calls on one key in one process that arrive while a call
// of that key is in flight queue up; when it returns, everything queued (up to
// batchCap) goes to Redis in ONE script call, the batch form of the limiter scripts
// (lua/batch.lua), which decides the requests in arrival order, each exactly as a call
// of its own at that server instant would be. No timer: a lone caller finds nothing
// in flight and calls at once, as without coalescing; batches form only while Redis
// is busy answering, and grow with the load.
//
// Every request keeps its own semantics: its op, n and max wait; its own context (a
// caller whose context ends before its batch is sent leaves the queue and takes
// nothing; one whose context ends while the batch is in flight gets the error it would
// get alone, and a grant booked ahead for it is given back, see lateReply); its
// hooks, failure policy and StateLost check. A batch runs once (MULTI/EXEC as every
// call): a lost reply fails each request in it with ErrUnavailable, and what it
// granted stands once.

// batchCap is the most requests one batch carries: a batch of 128 single-permit
// requests keeps Redis busy for well under a millisecond.
const batchCap = 128

// batcher queues one key's calls while one is in flight. It lives in the key's shared
// state, so every Limiter of the process built alike feeds the same queue.
type batcher struct {
	mu    sync.Mutex
	busy  bool       // a call of the key is in flight (or being sent)
	queue []*pending // arrival order
}

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

// decide runs one request through the key's batcher: at once when no call of the key
// is in flight, else in the batch sent when it returns. args is the request's ARGV
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
// key idle when nothing did.
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

// flush sends batches until the queue is empty.
func (b *batcher) flush(batch []*pending) {
	for batch != nil {
		send(batch)
		b.mu.Lock()
		batch = b.take()
		if batch == nil {
			b.busy = false
		}
		b.mu.Unlock()
	}
}

// take removes the next batch from the queue (b.mu held): up to batchCap requests of
// Limiters running the same script, in arrival order, skipping those whose callers
// left; nil when none is left.
func (b *batcher) take() []*pending {
	var batch []*pending
	i := 0
	for ; i < len(b.queue) && len(batch) < batchCap; i++ {
		p := b.queue[i]
		if len(batch) > 0 && p.l.script != batch[0].l.script {
			break
		}
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
// first (as awaitReply does for a call of its own).
func (p *pending) wait() (any, error) {
	select {
	case <-p.done:
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

// send runs one batch: a batch of one in the single form, more in the batch form.
func send(batch []*pending) {
	l := batch[0].l
	ctx, cancel := batchContext(batch)
	defer cancel()
	if len(batch) == 1 {
		p := batch[0]
		args := make([]any, 3, 3+len(l.tail))
		args[0], args[1], args[2] = p.op, p.n, p.x
		args = append(args, l.tail...)
		val, err := l.execLate(ctx, l.script, l.keys, args, nil)
		p.answer(val, err)
		return
	}
	args := make([]any, 2, 2+3*len(batch)+len(l.tail))
	args[0], args[1] = lua.Batch, len(batch)
	for _, p := range batch {
		args = append(args, p.op, p.n, p.x)
	}
	args = append(args, l.tail...)
	if err := l.skip(); err != nil {
		for _, p := range batch {
			p.answer(nil, err)
		}
		return
	}
	val, err := evalOnce(ctx, l.rdb, l.script, l.keys, args)
	if err != nil {
		for _, p := range batch {
			p.answer(nil, p.l.failed(p.ctx, err))
		}
		if isUnavailable(ctx, err) {
			l.down()
		}
		return
	}
	l.succeeded()
	replies, ok := val.([]any)
	if !ok || len(replies) != len(batch) {
		err := fmt.Errorf("%w: key %q: batch of %d: %v", ErrUnexpectedReply, l.key, len(batch), val)
		for _, p := range batch {
			p.answer(nil, err)
		}
		return
	}
	for i, p := range batch {
		if msg, ok := replies[i].(string); ok {
			p.answer(nil, p.l.failed(p.ctx, batchError(msg)))
			continue
		}
		p.answer(replies[i], nil)
	}
}

// batchKey is the context key under which a batch's context holds its requests
// ([]*pending), so that a go-redis hook (the package's tests) can find each
// request's own context.
type batchKey struct{}

// batchContext is the context a batch runs under: the first request's values and the
// batch's requests (batchKey), no cancellation (a caller that leaves does not take the
// others' call with it), and the latest of their deadlines when each has one.
func batchContext(batch []*pending) (context.Context, context.CancelFunc) {
	ctx := context.WithValue(context.WithoutCancel(batch[0].ctx), batchKey{}, batch)
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
