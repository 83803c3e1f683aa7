package throttle

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// A target is what the requests of a Limiter or Semaphore share: the script, the KEYS
// before the requests' own, and the arguments besides the requests (a limiter's heads,
// a semaphore's tail). Requests of targets with the same id go in one script call.
type target struct {
	id      string // the script's SHA, the keys and the shared arguments
	key     string // the key, without prefix, for errors
	tag     string
	script  *script
	keys    []string
	head    string // a limiter's head and its tenants' caps' head (internal/protocol)
	caps    string
	tail    []any // a semaphore's ARGV after its requests
	limiter bool
}

// newLimiterTarget is the target of a limiter: its state keys (its calls' and meta's, then
// its units'), its head and its caps'.
func newLimiterTarget(key, tag string, s *script, states []string, head, caps string) *target {
	id := s.sha + " " + strings.Join(states, " ") + " " + head + "\n" + caps
	return &target{id: id, key: key, tag: tag, script: s, keys: states, head: head, caps: caps, limiter: true}
}

// newSemaphoreTarget is the target of a semaphore: its keys and the ARGV after its
// requests.
func newSemaphoreTarget(key, tag string, s *script, keys []string, tail []any) *target {
	id := s.sha + " " + strings.Join(keys, " ") + " " + fmt.Sprint(tail...)
	return &target{id: id, key: key, tag: tag, script: s, keys: keys, tail: tail}
}

// reply is one request's answer: its integers, and its part of the extra region; with
// FlagDrift, the head the script found (another process's).
type reply struct {
	v     [protocol.Width]int64
	extra []int64
	drift string
}

// request is one call of a script, on its way to Redis and back.
type request struct {
	ctx    context.Context
	t      *target
	ks     *keyState
	call   *protocol.Request // a limiter's request
	fields []any             // a semaphore's request's fields
	detail bool              // the reply has a part of the extra region (Inspect)
	late   func(reply)       // given the reply that came after its caller left, to give back what it granted

	timeout time.Duration // its call timeout (WithCallTimeout)
	due     time.Time
	state   atomic.Int32
	reply   reply
	err     error
	done    chan struct{} // one value when answered (buffered)
	// with late: closed once the answer, lateRep or lateErr, came after its caller left
	landed  chan struct{}
	lateRep reply
	lateErr error
}

// The states of a request.
const (
	queued int32 = iota
	sent
	answered
	left // its caller left: its context ended or its call timeout passed
)

// batchCap is the most requests one script call carries, pipeCap one round trip.
const (
	batchCap = 128
	pipeCap  = 512
)

// maxFlights is the most round trips of one client in flight at once: two keep the
// client (waking the callers of one, building the next) and Redis (running the other)
// busy together; a third only splits the same requests into smaller round trips.
const maxFlights = 2

// do sends r and returns its reply, or the error the caller gets when its context
// ends or its call timeout passes first: it never waits for go-redis (docs/design.md,
// "One way to Redis").
func (c *client) do(r *request) (reply, error) {
	res := c.doAll([]*request{r})[0]
	return res.rep, res.err
}

// result is one request's answer.
type result struct {
	rep reply
	err error
}

// doAll is do of every request of reqs, queued together in their order: those of one
// target go in one script call, in that order (pipeCap at most). They go at once if
// nothing is in flight, and after the give-backs their keys have under way.
func (c *client) doAll(reqs []*request) []result {
	now := time.Now()
	for _, r := range reqs { // after the give-backs of callers that left (keyState.leave)
		if !r.ks.settle(r.ctx, now.Add(r.timeout)) {
			out := make([]result, len(reqs))
			for i, r := range reqs {
				out[i].err = c.noReply(r)
			}
			return out
		}
	}
	now = time.Now()
	c.mu.Lock()
	for _, r := range reqs {
		r.done = make(chan struct{}, 1)
		if r.late != nil {
			r.landed = make(chan struct{})
		}
		r.due = now.Add(r.timeout)
		if c.watchAt.IsZero() || r.due.Before(c.watchAt) {
			c.watchAt = r.due
			c.watch.Reset(time.Until(r.due))
		}
	}
	c.queue = append(c.queue, reqs...)
	c.calls += len(reqs)
	var mine *flight
	if c.ready() {
		if c.inline && len(c.flights) == 0 && len(c.queue) == len(reqs) && unending(reqs) {
			mine = c.take()
		} else {
			go c.flush(c.take())
		}
	}
	c.mu.Unlock()
	if mine != nil {
		c.send(mine.reqs)
		if next := c.landed(mine); next != nil {
			go c.flush(next)
		}
	}
	out := make([]result, len(reqs))
	for i, r := range reqs {
		out[i].rep, out[i].err = c.wait(r)
	}
	c.mu.Lock()
	c.calls -= len(reqs)
	c.rest()
	c.mu.Unlock()
	return out
}

// ready reports whether what is queued goes now (c.mu held): when nothing is in
// flight, or when a round trip more may fly and the queue holds its share of the calls
// under way, so that the round trips in flight carry about as many requests each.
func (c *client) ready() bool {
	flying := len(c.flights)
	return len(c.queue) > 0 && flying < maxFlights && (flying == 0 || len(c.queue)*maxFlights >= c.calls)
}

// flight is a round trip in flight: its requests.
type flight struct {
	reqs []*request
}

// flush makes f's round trip (none if f is nil), then, while ready, another of what
// queued meanwhile; it stops once the watchdog has let f go.
func (c *client) flush(f *flight) {
	for f != nil {
		c.send(f.reqs)
		f = c.landed(f)
	}
}

// landed removes f, answered, from the round trips in flight and returns the next one
// to make, if ready; nil if the watchdog has let f go.
func (c *client) landed(f *flight) *flight {
	c.mu.Lock()
	defer c.mu.Unlock()
	i := slices.Index(c.flights, f)
	if i < 0 {
		return nil
	}
	c.flights = slices.Delete(c.flights, i, i+1)
	if c.ready() {
		return c.take()
	}
	c.rest()
	return nil
}

// rest stops the watchdog once nothing is under way (c.mu held): no caller waits,
// nothing is queued or in flight. Its timer would hold the client until it fired.
func (c *client) rest() {
	if c.calls == 0 && len(c.queue) == 0 && len(c.flights) == 0 {
		c.watch.Stop()
		c.watchAt = time.Time{}
	}
}

// unending reports whether no request of reqs has a context that can end: their
// callers leave only by the call timeout, which a client.inline keeps itself, so their
// round trip may run on the caller's goroutine (docs/design.md, "One way to Redis").
func unending(reqs []*request) bool {
	for _, r := range reqs {
		if r.ctx.Done() != nil {
			return false
		}
	}
	return true
}

// take removes the next round trip's requests from the queue and makes them a flight
// (c.mu held): up to pipeCap, in arrival order, skipping those whose callers left; nil
// when none is left.
func (c *client) take() *flight {
	var batch []*request
	i := 0
	for ; i < len(c.queue) && len(batch) < pipeCap; i++ {
		if r := c.queue[i]; r.state.CompareAndSwap(queued, sent) {
			batch = append(batch, r)
		}
	}
	c.queue = slices.Delete(c.queue, 0, i)
	if batch == nil {
		return nil
	}
	f := &flight{reqs: batch}
	c.flights = append(c.flights, f)
	return f
}

// expire is the watchdog, one timer per client for every request's call timeout: it
// answers each request queued or in flight whose timeout has passed, and sets itself
// for the next. A round trip nobody waits for any more (a Redis that stopped answering)
// it lets go, so the queue goes on in another; its replies, if they ever come, still go
// to the late path.
func (c *client) expire() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	var next time.Time
	check := func(reqs []*request) (waiting bool) {
		for _, r := range reqs {
			switch st := r.state.Load(); {
			case st != queued && st != sent:
			case r.due.After(now):
				if next.IsZero() || r.due.Before(next) {
					next = r.due
				}
				waiting = true
			case r.state.CompareAndSwap(st, left): // else answered meanwhile
				if st == sent {
					r.leftInFlight()
				}
				r.err = c.noReply(r)
				r.done <- struct{}{}
			}
		}
		return waiting
	}
	check(c.queue)
	c.flights = slices.DeleteFunc(c.flights, func(f *flight) bool { return !check(f.reqs) })
	c.watchAt = next
	if !next.IsZero() {
		c.watch.Reset(time.Until(next))
	}
	if c.ready() {
		go c.flush(c.take())
	}
}

// wait returns r's answer, or noReply's error if its context ends first.
func (c *client) wait(r *request) (reply, error) {
	select {
	case <-r.done:
	case <-r.ctx.Done():
		if r.state.CompareAndSwap(queued, left) {
			return reply{}, c.noReply(r)
		}
		if r.state.CompareAndSwap(sent, left) {
			r.leftInFlight()
			return reply{}, c.noReply(r)
		}
		<-r.done // answered as the context ended: use it
	}
	return r.reply, r.err
}

// noReply is the error of r, whose caller leaves without a reply: ctx.Err() for a
// cancelled context; else an error wrapping ErrUnavailable (and, for the context's
// deadline, context.DeadlineExceeded) that names the bound that passed and wraps the last
// failure seen lately. It counts as a failed call for the failure policy.
func (c *client) noReply(r *request) error {
	err := r.ctx.Err()
	if err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	r.ks.breaker.failed(time.Now())
	reloadSlots(c.rdb)
	f := c.lastErr.Load()
	if dl, ok := r.ctx.Deadline(); err != nil || ok && !dl.After(time.Now()) {
		err = fmt.Errorf("%w: key %q: no reply before the context's deadline (%w)", ErrUnavailable, r.t.key,
			context.DeadlineExceeded)
	} else {
		err = fmt.Errorf("%w: key %q: no reply within the call timeout (%v)", ErrUnavailable, r.t.key, r.timeout)
		if f != nil && errors.Is(f.err, context.DeadlineExceeded) { // a timeout's: the caller's deadline did not pass
			f = &failure{errors.New(f.err.Error()), f.at}
		}
	}
	if f == nil || time.Since(f.at) > time.Minute {
		return err
	}
	return fmt.Errorf("%w; the last failure seen, %v ago: %w", err, time.Since(f.at).Round(time.Millisecond), f.err)
}

// bounded runs call, a read that is no script call (ReadRecord's), within r's bounds as
// do keeps a request's: it returns when call does, or with noReply's error when r.ctx
// ends or r.timeout passes first; call's context ends by then too.
func (c *client) bounded(r *request, call func(ctx context.Context) error) error {
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(r.ctx, r.timeout)
		defer cancel()
		done <- call(ctx)
	}()
	t := time.NewTimer(r.timeout)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-r.ctx.Done():
	case <-t.C:
	}
	return c.noReply(r)
}

// answer hands r its reply or error; an answer that comes after its caller left goes
// to r.late (leftInFlight).
func (r *request) answer(rep reply, err error) {
	if r.state.CompareAndSwap(sent, answered) {
		r.reply, r.err = rep, err
		r.done <- struct{}{}
		return
	}
	if r.landed != nil {
		r.lateRep, r.lateErr = rep, err
		close(r.landed)
	}
}

// leftInFlight is for r's caller leaving while r is in flight: its reply, when it
// comes (batchContext bounds the wait), goes to r.late through keyState.leave.
func (r *request) leftInFlight() {
	if r.late == nil {
		return
	}
	r.ks.leave(func() {
		<-r.landed
		if r.lateErr == nil {
			r.late(r.lateRep)
		}
	})
}

// repeatable reports whether running r twice does no harm: an inspect only reads, and
// a semaphore's extend and release renew or free a lease by its holder's token (a
// release's hand-off fills only the slots free when it runs). When a full Redis
// refuses its transaction, such a request goes again without one (see full).
func (r *request) repeatable() bool {
	if r.call != nil {
		return r.call.Op == protocol.OpInspect
	}
	return len(r.fields) > 0 && r.fields[0] != semAcquire
}

// group is the requests of one round trip that go in one script call.
type group struct {
	t    *target
	reqs []*request
	cmd  *redis.IntSliceCmd
}

// groups splits a round trip's requests into script calls, in the order each target
// first appears, each at most batchCap requests.
func groups(batch []*request) []*group {
	var out []*group
	open := map[string]*group{}
	for _, r := range batch {
		g := open[r.t.id]
		if g == nil || len(g.reqs) == batchCap {
			g = &group{t: r.t}
			open[r.t.id] = g
			out = append(out, g)
		}
		g.reqs = append(g.reqs, r)
	}
	return out
}

// command returns the group's script call: EVALSHA, or EVAL with the script's text. A
// limiter's call names its state key and the requests' own keys (internal/protocol); a
// semaphore's, its keys and the requests' fields.
func (g *group) command(ctx context.Context, eval bool) *redis.IntSliceCmd {
	keys := g.t.keys
	var args []any
	if g.t.limiter {
		index := func(key string) int { // the request's own keys, each in KEYS once
			i := slices.Index(keys, key)
			if i < 0 {
				i = len(keys)
				keys = append(keys[:i:i], key)
			}
			return i + 1
		}
		args = append(make([]any, 0, 2+len(g.reqs)), g.t.head, g.t.caps)
		var b []byte
		for _, r := range g.reqs {
			b = r.call.Append(b[:0], index)
			args = append(args, string(b))
		}
	} else {
		args = append(make([]any, 0, 1+4*len(g.reqs)+len(g.t.tail)), len(g.reqs))
		for _, r := range g.reqs {
			args = append(args, r.fields...)
		}
		args = append(args, g.t.tail...)
	}
	head := []any{"evalsha", g.t.script.sha, len(keys)}
	if eval {
		head[0], head[1] = "eval", g.t.script.src
	}
	for _, k := range keys {
		head = append(head, k)
	}
	cmd := redis.NewIntSliceCmd(ctx, append(head, args...)...)
	cmd.SetFirstKeyPos(3)
	return cmd
}

// send makes one round trip for batch, a script call per group. On a cluster each
// key's calls go in a pipeline of their own, answered as it lands: a slow node holds
// back only its own keys' callers.
func (c *client) send(batch []*request) {
	ctx, cancel := batchContext(batch)
	defer cancel()
	gs := groups(batch)
	if _, ok := c.rdb.(*redis.ClusterClient); !ok || len(gs) == 1 {
		c.round(ctx, gs)
		return
	}
	byTag := map[string][]*group{}
	for _, g := range gs {
		byTag[g.t.tag] = append(byTag[g.t.tag], g)
	}
	var wg sync.WaitGroup
	for _, part := range byTag {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.round(ctx, part)
		}()
	}
	wg.Wait()
}

// round sends the groups of one pipeline and answers their requests; the repeatable
// requests of calls a full Redis refused go again (full).
func (c *client) round(ctx context.Context, gs []*group) {
	c.tries(ctx, gs, c.atMostOnce)
	if !c.atMostOnce {
		gs = c.full(ctx, gs)
	}
	for _, g := range gs {
		c.deliver(ctx, g)
	}
}

// tries sends the groups' script calls (bare: without MULTI/EXEC, see exec), then EVAL
// for those the server answered NOSCRIPT; and, up to movingTries times, those refused for
// a slot in motion once go-redis's cluster client gave up following it (its
// MaxRedirects spent while a reshard moved the slot under it): a MOVED, ASK or TRYAGAIN
// is a reply, so nothing of the call ran.
func (c *client) tries(ctx context.Context, gs []*group, bare bool) {
	eval := false
	for try := 0; len(gs) > 0; try++ {
		c.exec(ctx, gs, eval, bare)
		if again := refused(gs, "NOSCRIPT"); len(again) > 0 {
			eval = true
			c.exec(ctx, again, true, bare)
		}
		if gs = refused(gs, "MOVED", "ASK", "TRYAGAIN"); len(gs) == 0 || try == movingTries || !pause(ctx, movingPause) {
			return
		}
	}
}

// movingTries and movingPause bound tries' sends again of calls refused for a slot in
// motion: a reshard's steps take milliseconds each.
const (
	movingTries = 3
	movingPause = 20 * time.Millisecond
)

// refused returns the groups whose call Redis refused with an error reply beginning with
// one of prefixes (or a transaction discarded for one).
func refused(gs []*group, prefixes ...string) []*group {
	return slices.DeleteFunc(slices.Clone(gs), func(g *group) bool { return !refusedFor(g.cmd.Err(), prefixes...) })
}

// refusedFor reports whether err is an error reply beginning with one of prefixes, or a
// transaction discarded for one.
func refusedFor(err error, prefixes ...string) bool {
	if err == nil {
		return false
	}
	msg := strings.TrimPrefix(err.Error(), execAbortCause)
	return slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(msg, p+" ") })
}

// pause waits d, or until ctx ends (false).
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// full sends again, bare, the repeatable requests of the calls of gs that a full Redis
// (over maxmemory, under noeviction) refused in MULTI, and returns the calls to answer:
// gs without those requests, and the new calls. The refused transaction ran nothing, so
// each goes again as a first try. Bare, Redis runs a script until its first write that
// may grow memory (SET, ZADD…): an inspect writes nothing, and the semaphore's script
// removes expired leases (ZREMRANGEBYSCORE) before anything else. A grant stays refused.
func (c *client) full(ctx context.Context, gs []*group) []*group {
	var again []*request
	out := make([]*group, 0, len(gs))
	for _, g := range gs {
		if refusedFor(g.cmd.Err(), "OOM") {
			g.reqs = slices.DeleteFunc(g.reqs, func(r *request) bool {
				if r.repeatable() {
					again = append(again, r)
					return true
				}
				return false
			})
		}
		if len(g.reqs) > 0 {
			out = append(out, g)
		}
	}
	if len(again) == 0 {
		return gs
	}
	bare := groups(again)
	c.tries(ctx, bare, true)
	return append(out, bare...)
}

// exec runs the groups' script calls in one pipeline, in MULTI/EXEC unless bare
// (atMostOnce, or see full), and sets each group's cmd. On a cluster (each key's calls
// apart, see send) go-redis's cluster client follows a MOVED or ASK for the whole
// transaction (ASKING before MULTI), and never sends again one it wrote whose reply it
// did not read: that one's error is a network error, ErrUnavailable (docs/design.md,
// "One way to Redis").
func (c *client) exec(ctx context.Context, gs []*group, eval, bare bool) {
	var pipe redis.Pipeliner
	if bare {
		pipe = c.rdb.Pipeline()
	} else {
		pipe = c.rdb.TxPipeline()
	}
	for _, g := range gs {
		g.cmd = g.command(ctx, eval)
		_ = pipe.Process(ctx, g.cmd)
	}
	_, err := pipe.Exec(ctx)
	if err == nil {
		return
	}
	// A failure before the calls had replies of their own (a refused dial, a read
	// timeout) leaves them without one: the round trip's error is theirs.
	for _, g := range gs {
		if g.cmd.Err() == nil && g.cmd.Val() == nil {
			g.cmd.SetErr(err)
		}
	}
}

// deliver answers the group's requests from its call's reply.
func (c *client) deliver(ctx context.Context, g *group) {
	flat, err := g.cmd.Result()
	if err == nil {
		g.reqs[0].ks.breaker.succeeded()
		for i, r := range g.reqs {
			r.answer(g.parse(flat, i))
		}
		return
	}
	// cut: the round trip ran out of time, every request's bound having passed
	// (batchContext); noReply's error says more
	var own redis.Error // a reply of Redis's own (a script's error, NOPERM…)
	cut := ctx.Err() != nil && !errors.As(err, &own)
	down := isUnavailable(ctx, err)
	if down || cut && !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		c.lastErr.Store(&failure{err, time.Now()})
	}
	if down { // a cut one counts for each request (noReply)
		g.reqs[0].ks.breaker.failed(time.Now())
		reloadSlots(c.rdb)
	}
	if errors.Is(err, redis.ErrClosed) { // the caller closed its Redis client
		c.close()
	}
	for _, r := range g.reqs {
		switch {
		case cut:
			r.answer(reply{}, c.noReply(r))
		case isOddReply(err):
			r.answer(reply{}, fmt.Errorf("%w: key %q: %w", ErrUnexpectedReply, g.t.key, err))
		default:
			r.answer(reply{}, scriptError(r.ctx, g.t.key, err))
		}
	}
}

// parse returns request i's reply, or its error, from its call's reply flat.
func (g *group) parse(flat []int64, i int) (reply, error) {
	k := len(g.reqs)
	if len(flat) < protocol.Width*k {
		return reply{}, fmt.Errorf("%w: key %q: %d integers for %d requests", ErrUnexpectedReply, g.t.key, len(flat), k)
	}
	var rep reply
	copy(rep.v[:], flat[protocol.Width*i:])
	var at, n int64 // the request's part of the extra region
	switch {
	case rep.v[0] == -1: // an error: its code, then its text's place
		at, n = rep.v[2]-1, rep.v[3]
	case g.reqs[i].detail:
		at, n = rep.v[4]-1, rep.v[5]
	}
	if n < 0 || n > 0 && (at < int64(protocol.Width*k) || at+n > int64(len(flat))) {
		return reply{}, fmt.Errorf("%w: key %q: request %d of %d: extra at %d (%d) in a reply of %d",
			ErrUnexpectedReply, g.t.key, i+1, k, at+1, n, len(flat))
	}
	if n > 0 {
		rep.extra = flat[at : at+n : at+n]
	}
	if rep.v[0] != -1 {
		if g.t.limiter && rep.v[6]&protocol.FlagDrift != 0 { // the call's trailer: the head found
			if n := flat[len(flat)-1]; n > 0 && n < int64(len(flat)) {
				rep.drift = replyText(flat[int64(len(flat))-1-n : len(flat)-1])
			}
		}
		return rep, nil
	}
	// the request's place in the call is not the caller's business: its error reads the
	// same whichever requests it went with
	msg := strings.Replace(replyText(rep.extra), fmt.Sprintf("JTARG request %d: ", i+1), "JTARG ", 1)
	return reply{}, scriptError(g.reqs[i].ctx, g.t.key, &failed{code: int(rep.v[1]), text: msg})
}

// replyText is the text a reply spells, one byte per integer.
func replyText(xs []int64) string {
	b := make([]byte, len(xs))
	for i, x := range xs {
		b[i] = byte(x)
	}
	return string(b)
}

// failed is one request's error in a script call: its code (internal/protocol's Err*, or
// 0 for an error Redis gave the script) and its text, for people. It is a reply of
// Redis's own (go-redis's redis.Error).
type failed struct {
	code int
	text string
}

func (e *failed) Error() string { return strings.TrimSpace(e.text) }

// RedisError marks it as a reply of Redis's own (go-redis's redis.Error).
func (*failed) RedisError() {}

// isOddReply reports whether err is go-redis failing to read a reply as integers: a
// reply of another shape than the scripts give (a string, a nil, not an array).
func isOddReply(err error) bool {
	var ne *strconv.NumError
	return errors.As(err, &ne) || errors.Is(err, redis.Nil) || strings.HasPrefix(err.Error(), "redis: can't parse")
}

// batchContext is the context a round trip runs under: no cancellation (a caller that
// leaves does not take the others' call with it), and the latest of the requests'
// deadlines and call timeouts, so that go-redis gives up by then.
func batchContext(batch []*request) (context.Context, context.CancelFunc) {
	var last time.Time
	for _, r := range batch {
		dl := r.due
		if d, ok := r.ctx.Deadline(); ok && d.Before(dl) {
			dl = d
		}
		if dl.After(last) {
			last = dl
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), last)
}

// script is one of lua/gen's scripts: its text and SHA-1.
type script struct{ src, sha string }

func newScript(name string) *script {
	return &script{src: lua.Source(name), sha: lua.Script(name).Hash()}
}
