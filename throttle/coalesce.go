package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// Coalescing (group commit) and pipelining. Calls of one process on one client that
// arrive while its round trips are in flight queue up; when one returns, everything
// queued (up to pipeCap requests) goes to Redis in ONE round trip: the requests of
// each key in one script call, the batch form of the script (the limiter scripts'
// lua/batch.lua, the semaphore's lua/semaphore_batch.lua), which decides them in
// arrival order, each exactly as a call of its own at that server instant would be;
// the calls of different keys in one pipeline (MULTI/EXEC, as every call; on a
// cluster, one transaction per key, sent at once). No timer: a lone caller finds
// nothing in flight and calls at once, as without coalescing; batches form only while
// Redis is busy answering, and grow with the load.
//
// Up to maxFlights (2) round trips of a client are in flight at once, so that the
// client (waking the callers of one, decoding its reply, building the next) and Redis
// (running the other) work at the same time instead of by turns. The queue goes in a
// second round trip once it holds half the calls under way (see ready): the two then
// carry about half each, and of two concurrent calls the second goes at once beside
// the first, as it would with coalescing off.
//
// A key's requests may be in both round trips, and the later one may run first (it
// may be written first, on another connection): requests of two round trips in flight
// at once are concurrent calls (neither's caller had its answer when the other's
// called), which two goroutines calling without coalescing, each on a connection of
// its own, are as well, and whose order at Redis nothing decides either. What the
// package promises holds: within a round trip a key's requests are decided in arrival
// order, one script call at one server instant; a call made after another returned
// goes to Redis after it (in a later round trip), so it is booked after it, as
// Redis's FIFO booking orders every call that reaches it (across processes as
// within one).
//
// Every request keeps its own semantics: its op and arguments (a Limiter's n and max
// wait, a Semaphore's lease id and queueing); its own context (a caller whose context
// ends before its batch is sent leaves the queue and takes nothing; one whose context
// ends, or whose call timeout passes, while the batch is in flight gets the error it
// would get alone, and what the batch granted it is given back: see lateReply and
// lateAcquire); its hooks, failure policy (each key's breaker) and StateLost check. A
// round trip runs once (MULTI/EXEC, never re-sent): a lost reply fails each request
// in it with ErrUnavailable, and what it granted stands once.

// batchCap is the most requests one script call carries: a batch of 128
// single-permit requests keeps Redis busy for well under a millisecond. pipeCap is the
// most requests one round trip carries, over every key.
const (
	batchCap = 128
	pipeCap  = 512
)

// maxFlights is the most round trips one client's batcher has in flight at once. Two
// keep both sides busy: Redis runs one script at a time, so a third would only split
// the same requests into smaller round trips, each paying its MULTI/EXEC and its
// round trip's share of Redis's CPU (12–14 µs, as much as 5–6 requests' scripts in a
// batch), without more of the work overlapping. The go-redis pool (10 connections per
// CPU by default) has room for them beside the lone calls of limiters with coalescing
// off.
const maxFlights = 2

// batcher queues one client's calls while its round trips are in flight. Every
// Limiter and Semaphore of the process on the client (with coalescing on) feeds the
// same queue (batchers).
//
// A caller that queues waits for its answer on a channel of its own, and nothing
// else: its call timeout (WithCallTimeout) is kept by the batcher's one watchdog
// timer, not by a timer per call. The watchdog also lets go of a round trip that
// nobody waits for any more (a Redis that stopped answering): it no longer counts as
// in flight, the queue goes on in another (on another connection), and the abandoned
// one, if its reply ever comes, still gives back what it granted to callers who left
// (lateReply).
type batcher struct {
	rdb     redis.UniversalClient
	mu      sync.Mutex
	flying  int          // round trips in flight (lone calls and flights), at most maxFlights
	calls   atomic.Int32 // calls under way: in flight, queued, or answered and not yet returned
	queue   []*pending   // arrival order
	flights []*flight    // the flushers' round trips in flight, those let go excepted

	watch   *time.Timer // the watchdog: runs expire at watchAt
	watchAt time.Time   // zero: not armed

	pipes pipePool // the round trips' pipelines, kept for reuse
}

// flight is one flusher's round trip in flight: its requests, and whether the watchdog
// let it go (see expire).
type flight struct {
	sent []*pending
	gone bool
}

// batchers holds each client's batcher while a Limiter or Semaphore holds it.
var batchers registry[redis.UniversalClient, batcher]

// A pending request's states.
const (
	pendQueued int32 = iota // in the queue
	pendSent                // in a batch in flight
	pendDone                // answered: val, ints and err are set, and sent on done
	pendLeft                // its caller left (its context ended or its call timeout passed)
)

// pending is one queued request.
type pending struct {
	src   *source
	ctx   context.Context
	cmd   command   // its call in the single form (read only: it may be shared)
	due   time.Time // when its call timeout passes
	state atomic.Int32
	val   any
	ints  []int64 // its reply within a batch's flat reply (val nil), read only
	err   error
	// done gets one value when the request is answered (answer, timeout): buffered, so
	// that whoever answers never blocks, and kept when p is reused (its value, if
	// sent, was received: see wait)
	done chan struct{}
	// refs counts who may still read p: its caller (until decide returns) and the
	// batcher (until the request leaves the queue unsent, in take, or its round trip
	// is over and out of the flights, in flush). The last to let go puts p back for
	// reuse: a request whose caller left may still be in a round trip in flight, whose
	// reply goes to the late path through p.
	refs atomic.Int32
}

// pendings holds pendings for reuse: one with its channel costs two allocations, about
// a tenth of a coalesced call's CPU in the client.
var pendings sync.Pool

// newPending returns a queued request of s's for the call c made with ctx, held by its
// caller and the batcher (see pending.refs).
func newPending(s *source, ctx context.Context, c command) *pending {
	p, ok := pendings.Get().(*pending)
	if !ok {
		p = &pending{done: make(chan struct{}, 1)}
	}
	p.src, p.ctx, p.cmd = s, ctx, c
	p.due = time.Now().Add(s.run.callTimeout)
	p.state.Store(pendQueued)
	p.refs.Store(2)
	return p
}

// release lets go of p for one of its holders (see pending.refs); the last one frees
// it.
func (p *pending) release() {
	if p.refs.Add(-1) == 0 {
		p.free()
	}
}

// free clears p, which nobody reads any more, and keeps it for reuse. Its channel is
// empty: its one value, if sent, was received.
func (p *pending) free() {
	if f := onFree.Load(); f != nil {
		(*f)(p)
	}
	p.src, p.ctx, p.cmd, p.val, p.ints, p.err = nil, nil, command{}, nil, nil, nil
	pendings.Put(p)
}

// onFree, when set (tests), is called with each pending before it is kept for reuse.
var onFree atomic.Pointer[func(*pending)]

// source is what a Limiter or a Semaphore brings to coalescing: its runner (breaker,
// hooks, error mapping), its keys, and how its ARGV is laid out.
type source struct {
	run   *runner
	batch *batcher // the client's, or nil without coalescing
	group any      // the state shared by those built alike: their requests (of one script) go in one script call
	keys  []string
	own   [3]int8 // where a request's own arguments (the batch form's triple) are in its single ARGV
	tail  []any   // the batch form's ARGV after the triples, shared by the requests
	owner lateGiver

	script *redis.Script // the script head is for
	head   []any         // evalHead(script, keys)
	// width is how many integers one reply is (5 a Limiter's, 3 a Semaphore's): the
	// script replies with integers only, a batch with one flat array of width per
	// request (lua/batch.lua, lua/semaphore_batch.lua)
	width int
}

// newSource returns the source of a Limiter or Semaphore whose calls run script, whose
// replies are width integers each (see source.width).
func newSource(run *runner, batch *batcher, group any, keys []string, own [3]int8, tail []any, owner lateGiver, script *redis.Script, width int) source {
	return source{run: run, batch: batch, group: group, keys: keys, own: own, tail: tail, owner: owner,
		script: script, head: evalHead(script, keys), width: width}
}

// command returns the call of script on the source's keys with ARGV args. Its EVALSHA
// arguments are made when it is sent alone (command.queue): a call that goes in a
// batch needs only args.
func (s *source) command(script *redis.Script, args []any) command {
	head := s.head
	if script != s.script { // swapped since (tests)
		head = evalHead(script, s.keys)
	}
	c := command{script: script, keys: s.keys, args: args, sha: head, headOnly: true}
	c.ints = true
	return c
}

// clientBatcher returns the batcher of rdb, or nil when c turns coalescing off.
func clientBatcher(rdb redis.UniversalClient, c *config) *batcher {
	if c.noCoalesce {
		return nil
	}
	return batchers.get(rdb, func() *batcher { return &batcher{rdb: rdb} })
}

// lateGiver gives back what a reply granted after its caller left: lateFor returns
// what to do with such a reply to a call with ARGV args made with ctx (see lateReply),
// or nil.
type lateGiver interface {
	lateFor(ctx context.Context, args []any) func(any)
}

// decide runs c, one call of the source's (its ARGV in the single form), through the
// client's batcher: at once when no round trip of the client is in flight, else in a
// round trip of queued requests (see maxFlights). The reply is val, or, for a request
// answered from a batch's flat reply, ints (val nil; read only).
func (s *source) decide(ctx context.Context, c command) (val any, ints []int64, err error) {
	b := s.batch
	if b == nil {
		val, err = s.run.execLate(ctx, c, s.owner.lateFor(ctx, c.args))
		return val, nil, err
	}
	b.calls.Add(1)
	p := newPending(s, ctx, c) // before taking b.mu, which the other callers wait for
	b.mu.Lock()
	if b.flying == 0 {
		b.flying = 1
		b.mu.Unlock()
		p.free() // not queued: nobody else has it
		defer b.next()
		val, err = s.run.execLate(ctx, c, s.owner.lateFor(ctx, c.args))
		return val, nil, err
	}
	b.queue = append(b.queue, p)
	if b.watchAt.IsZero() || p.due.Before(b.watchAt) {
		b.arm(p.due)
	}
	if b.ready() {
		b.launch()
	}
	b.mu.Unlock()
	val, ints, err = p.wait()
	p.release()
	b.calls.Add(-1)
	return val, ints, err
}

// ready reports whether what is queued should go now, in a round trip of its own
// (b.mu held): when nothing else is in flight to take it when it returns, or when a
// round trip more may fly and the queue holds its share (1/maxFlights) of the calls
// under way, so that the round trips in flight carry about as many requests each. A
// queue smaller than that waits for a round trip to return (as calls queue behind a
// single one in flight), or for more calls: round trips of a few requests would make
// Redis pay a round trip's cost for each few.
func (b *batcher) ready() bool {
	if len(b.queue) == 0 || b.flying >= maxFlights {
		return false
	}
	return b.flying == 0 || len(b.queue)*maxFlights >= int(b.calls.Load())
}

// next ends a lone call's round trip: what queued meanwhile goes in a round trip of
// its own, in the background, when ready.
func (b *batcher) next() {
	b.calls.Add(-1)
	b.mu.Lock()
	b.flying--
	if b.ready() {
		b.launch()
	}
	b.mu.Unlock()
}

// launch sends what is queued in a new round trip, in the background (b.mu held, fewer
// than maxFlights in flight); nothing when no caller waits in the queue.
func (b *batcher) launch() {
	batch := b.take()
	if batch == nil {
		return
	}
	f := &flight{sent: batch}
	b.flights = append(b.flights, f)
	b.flying++
	select {
	case flushes <- flushJob{b, f}:
	default:
		go flusher(flushJob{b, f})
	}
}

// Round trips launched run on flushers: goroutines that, once a round trip (and those
// its flush takes after it) is done, wait up to workerIdle for the next one (on
// flushes) before they end, as call workers do (see calls): a goroutine per launch
// would grow its stack through go-redis's deep call path each time (4% of a coalesced
// call's CPU at 64 and 256 goroutines on one key).
var flushes = make(chan flushJob)

// flushJob is a launched round trip: f, of b's.
type flushJob struct {
	b *batcher
	f *flight
}

// flusher runs j's flush, then each it is handed while it waits for one, until none
// comes within workerIdle.
func flusher(j flushJob) {
	idle := time.NewTimer(workerIdle)
	for {
		j.b.flush(j.f)
		j = flushJob{} // let the batcher go while idle
		idle.Reset(workerIdle)
		select {
		case j = <-flushes:
		case <-idle.C:
			return
		}
	}
}

// flush makes f's round trip, then, while ready, another of what queued meanwhile;
// it ends when its round trip does once the watchdog let f go (see expire).
func (b *batcher) flush(f *flight) {
	batch := f.sent // only this goroutine sets f.sent (b.mu held)
	for {
		b.send(batch)
		b.mu.Lock()
		if f.gone { // out of the flights already (expire)
			b.mu.Unlock()
			releaseAll(batch)
			return
		}
		b.flying--
		var next []*pending
		if b.ready() {
			next = b.take()
		}
		if next == nil {
			b.land(f)
			b.mu.Unlock()
			releaseAll(batch)
			return
		}
		b.flying++
		f.sent = next
		b.mu.Unlock()
		releaseAll(batch) // out of the flights: expire no longer reads them
		batch = next
	}
}

// releaseAll lets go of the batcher's hold on each request of a round trip that is
// over (see pending.refs).
func releaseAll(batch []*pending) {
	for _, p := range batch {
		p.release()
	}
}

// land takes f out of the flights (b.mu held).
func (b *batcher) land(f *flight) {
	for i, g := range b.flights {
		if g == f {
			b.flights = slices.Delete(b.flights, i, i+1)
			return
		}
	}
}

// take removes the next round trip's requests from the queue (b.mu held): up to
// pipeCap, in arrival order, skipping (and letting go of) those whose callers left;
// nil when none is left.
func (b *batcher) take() []*pending {
	var batch []*pending
	i := 0
	for ; i < len(b.queue) && len(batch) < pipeCap; i++ {
		p := b.queue[i]
		if !p.state.CompareAndSwap(pendQueued, pendSent) {
			p.release()
			continue
		}
		if batch == nil {
			batch = make([]*pending, 0, min(len(b.queue)-i, pipeCap))
		}
		batch = append(batch, p)
	}
	// the rest moves to the front: the queue keeps its array, which the next calls
	// fill, unless a burst made it much larger than a round trip
	n := copy(b.queue, b.queue[i:])
	clear(b.queue[n:])
	b.queue = b.queue[:n]
	if n == 0 && cap(b.queue) > 4*pipeCap {
		b.queue = nil
	}
	return batch
}

// arm sets the watchdog to run expire at at (b.mu held).
func (b *batcher) arm(at time.Time) {
	b.watchAt = at
	if b.watch == nil {
		b.watch = time.AfterFunc(time.Until(at), b.expire)
		return
	}
	b.watch.Reset(time.Until(at))
}

// expire is the watchdog: it answers each queued or sent request whose call timeout
// has passed with the error a call of its own gets then (callTimedOut), and sets
// itself for the next one due. A flight nobody waits for any more it lets go: it no
// longer counts as in flight, the queue goes on in a new round trip, and the flight's
// flusher ends when its round trip does.
func (b *batcher) expire() {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := time.Now()
	var next time.Time
	check := func(ps []*pending) (waiting bool) {
		for _, p := range ps {
			if st := p.state.Load(); st != pendQueued && st != pendSent {
				continue
			}
			if p.due.After(now) {
				if next.IsZero() || p.due.Before(next) {
					next = p.due
				}
				waiting = true
				continue
			}
			p.timeout()
		}
		return waiting
	}
	var gone []*flight
	for _, f := range b.flights {
		if !check(f.sent) {
			gone = append(gone, f)
		}
	}
	check(b.queue)
	b.watchAt = time.Time{}
	if !next.IsZero() {
		b.arm(next)
	}
	for _, f := range gone {
		f.gone = true
		b.land(f)
		b.flying--
	}
	if gone != nil && b.ready() {
		b.launch()
	}
}

// wait returns the request's reply (val, or ints: see decide), or what its caller
// gets when its context ends or its call timeout passes first (as awaitReply does for
// a call of its own).
func (p *pending) wait() (any, []int64, error) {
	if done := p.ctx.Done(); done == nil {
		<-p.done
	} else {
		select {
		case <-p.done:
		case <-done:
			if p.state.CompareAndSwap(pendQueued, pendLeft) || p.state.CompareAndSwap(pendSent, pendLeft) {
				if errors.Is(p.ctx.Err(), context.DeadlineExceeded) {
					return nil, nil, noReply(p.ctx, nil)
				}
				return nil, nil, p.ctx.Err() // nothing is sent on p.done
			}
			<-p.done // answered as the context ended: use it
		}
	}
	if p.err != nil && errors.Is(p.ctx.Err(), context.DeadlineExceeded) && errors.Is(p.err, ErrUnavailable) &&
		!errors.Is(p.err, errRecentlyDown) {
		return nil, nil, noReply(p.ctx, p.err)
	}
	return p.val, p.ints, p.err
}

// timeout answers a request whose call timeout passed before its reply came; a
// reply that comes later goes to answer's late path.
func (p *pending) timeout() {
	if p.state.CompareAndSwap(pendQueued, pendLeft) || p.state.CompareAndSwap(pendSent, pendLeft) {
		p.err = callTimedOut(p.src.run.callTimeout)
		p.done <- struct{}{}
	}
}

// answer hands a request its reply, or, when its caller has left, gives the reply to
// what gives back a grant booked for it (lateFor) in a goroutine of its own: that
// calls on the key, which would queue behind the batch being answered.
func (p *pending) answer(val any, err error) {
	if p.state.CompareAndSwap(pendSent, pendDone) {
		p.val, p.err = val, err
		p.done <- struct{}{}
		return
	}
	if err == nil {
		if late := p.src.owner.lateFor(p.ctx, p.cmd.args); late != nil {
			go late(val)
		}
	}
}

// answerInts is answer of ints, the request's part of a batch's flat reply.
func (p *pending) answerInts(ints []int64) {
	if p.state.CompareAndSwap(pendSent, pendDone) {
		p.ints = ints
		p.done <- struct{}{}
		return
	}
	p.answer(ints, nil) // its caller left: the late path
}

// group is the requests of one round trip that go in one script call: one key (one
// shared state) and script, in arrival order, at most batchCap.
type group struct {
	src    *source // the first request's: its keys, ARGV tail and breaker
	script *redis.Script
	reqs   []*pending
	cmd    redis.Cmder

	noRecord bool // send no record's write (see pipeline)
}

// groups splits a round trip's requests into script calls, in the order each first
// appears.
func groups(batch []*pending) []*group {
	if oneKey(batch) { // the usual case: the batch in order, batchCap at a time
		out := make([]*group, 0, (len(batch)+batchCap-1)/batchCap)
		for len(batch) > 0 {
			k := min(len(batch), batchCap)
			out = append(out, &group{src: batch[0].src, script: batch[0].cmd.script, reqs: batch[:k:k]})
			batch = batch[k:]
		}
		return out
	}
	type gk struct {
		shared any
		script *redis.Script
	}
	open := map[gk]*group{}
	var out []*group
	for _, p := range batch {
		k := gk{p.src.group, p.cmd.script}
		g := open[k]
		if g == nil || len(g.reqs) == batchCap {
			g = &group{src: p.src, script: p.cmd.script}
			open[k] = g
			out = append(out, g)
		}
		g.reqs = append(g.reqs, p)
	}
	return out
}

// oneKey reports whether every request of batch goes in one script call of the same
// key (but for batchCap).
func oneKey(batch []*pending) bool {
	g, script := batch[0].src.group, batch[0].cmd.script
	for _, p := range batch[1:] {
		if p.src.group != g || p.cmd.script != script {
			return false
		}
	}
	return true
}

// command is the group's call: the single form for one request, else the batch form.
func (g *group) command() command {
	if len(g.reqs) == 1 {
		return g.reqs[0].cmd
	}
	s := g.src
	head := s.head
	if g.script != s.script { // swapped since (tests)
		head = evalHead(g.script, s.keys)
	}
	sha := make([]any, len(head)+2, len(head)+2+3*len(g.reqs)+len(s.tail))
	copy(sha, head)
	sha[len(head)], sha[len(head)+1] = lua.Batch, len(g.reqs)
	var rec *record // a request's record write rides along (record.go)
	for _, p := range g.reqs {
		a := p.cmd.args
		sha = append(sha, a[s.own[0]], a[s.own[1]], a[s.own[2]])
		if p.cmd.rec != nil {
			rec = p.cmd.rec
		}
	}
	sha = append(sha, s.tail...)
	return command{script: g.script, keys: s.keys, args: sha[len(head):], sha: sha, ints: true, rec: rec}
}

// send makes one round trip for batch: each key's requests in one script call, the
// calls in one pipeline.
func (b *batcher) send(batch []*pending) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	var live []*group
	for _, g := range groups(batch) {
		if err := g.src.run.skip(); err != nil { // this key's breaker is open
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
	pipeline(ctx, b.rdb, &b.pipes, live, false)
	var again []*group // the server did not have the script: send it (EVAL)
	for _, g := range live {
		if err := g.cmd.Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			g.noRecord = true // written with the EVALSHA
			again = append(again, g)
		}
	}
	if again != nil {
		pipeline(ctx, b.rdb, &b.pipes, again, true)
	}
	for _, g := range live {
		g.deliver(ctx)
	}
}

// pipeline runs the groups' script calls in one round trip (see evalOnce: MULTI/EXEC
// unless the client never re-sends), by EVALSHA or, when eval, EVAL. On a cluster a
// transaction must keep to one hash slot: each group (one key) goes in a transaction
// of its own, all at once.
func pipeline(ctx context.Context, rdb redis.UniversalClient, ps *pipePool, gs []*group, eval bool) {
	if _, ok := rdb.(*redis.ClusterClient); ok && len(gs) > 1 {
		var wg sync.WaitGroup
		for _, g := range gs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				pipeline(ctx, rdb, ps, []*group{g}, eval)
			}()
		}
		wg.Wait()
		return
	}
	pipe := ps.get(rdb)
	defer ps.put(pipe)
	cmds := ctx.Value(batchKey{}).(*sync.Map)
	var sets []*redis.StatusCmd // the keys' records riding along (record.go)
	for _, g := range gs {
		c := g.command()
		if c.rec != nil && !g.noRecord {
			sets = append(sets, c.rec.queue(ctx, pipe))
		}
		g.cmd = c.queue(ctx, pipe, eval)
		cmds.Store(g.cmd, g.reqs)
	}
	_, err := pipe.Exec(ctx)
	for _, set := range sets {
		if execAborted(set, gs[0].cmd) { // nothing ran: again without the records
			for _, g := range gs {
				g.noRecord = true
			}
			pipeline(ctx, rdb, ps, gs, eval)
			return
		}
	}
	if err != nil {
		// A failure go-redis would have retried (a refused dial, a read timeout) but
		// may not (MaxRetries) leaves the commands without a reply or an error of
		// their own: the round trip's is theirs.
		for _, g := range gs {
			if g.cmd.Err() == nil && replyOf(g.cmd) == nil {
				g.cmd.SetErr(err)
			}
		}
	}
}

// deliver answers the group's requests from its command's reply.
func (g *group) deliver(ctx context.Context) {
	r := g.src.run
	val, err := replyOf(g.cmd), g.cmd.Err()
	if err != nil {
		for _, p := range g.reqs {
			p.answer(nil, p.src.run.failed(p.ctx, err))
		}
		if isUnavailable(ctx, err) {
			r.down()
		}
		return
	}
	r.succeeded()
	if len(g.reqs) == 1 {
		g.reqs[0].answer(val, nil)
		return
	}
	g.deliverFlat(val)
}

// unexpected fails the group's requests with ErrUnexpectedReply for the reply val.
func (g *group) unexpected(val any) {
	err := fmt.Errorf("%w: key %q: batch of %d: %v", ErrUnexpectedReply, g.src.run.key, len(g.reqs), val)
	for _, p := range g.reqs {
		p.answer(nil, err)
	}
}

// deliverFlat answers the group's requests from a batch's flat reply (see lua/batch.lua
// and lua/semaphore_batch.lua): request r's w integers (the source's width) at w·r, or
// the text of its error. Each request reads its own in place: nothing is made per
// request.
func (g *group) deliverFlat(val any) {
	flat, ok := val.([]int64)
	if !ok { // EVAL's reply, read the generic way
		s, _ := val.([]any)
		flat = make([]int64, len(s))
		if !int64s(val, flat) {
			flat = nil
		}
	}
	k, w := len(g.reqs), g.src.width
	if len(flat) < w*k || w < 3 {
		g.unexpected(val)
		return
	}
	for i, p := range g.reqs {
		mine := flat[w*i : w*i+w : w*i+w]
		if mine[0] != -1 {
			p.answerInts(mine)
			continue
		}
		at, n := mine[1]-1, mine[2]
		if at < int64(w*k) || n < 0 || at+n > int64(len(flat)) {
			p.answer(nil, fmt.Errorf("%w: key %q: request %d of a batch of %d: error text at %d (%d bytes) in a reply of %d", ErrUnexpectedReply, g.src.run.key, i, k, at+1, n, len(flat)))
			continue
		}
		text := make([]byte, n)
		for j := range text {
			text[j] = byte(flat[at+int64(j)])
		}
		p.answer(nil, p.src.run.failed(p.ctx, batchError(text)))
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
