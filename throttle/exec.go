package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/redis/go-redis/v9"
)

// runner runs the scripts of one Limiter or Semaphore: every script call of this
// package goes through its exec, so each runs at most once, its errors are mapped
// once, and the breaker of FailOpen and FailLocal is consulted and kept once.
type runner struct {
	rdb        redis.UniversalClient
	key        string
	clock      clock.Clock
	policy     FailurePolicy
	breaker    *breaker            // shared by the key's users in this process
	redisError func(string, error) // the RedisError hook, or nil
	pin        *pin                // keeps the shared state alive while it matters
	owner      any                 // the shared state pin holds

	callTimeout time.Duration     // bounds each call (see evalOnTime, WithCallTimeout)
	pipes       *pipePool         // the key's pipelines, kept for reuse
	direct      bool              // rdb honours deadlines: a call that cannot end otherwise runs on its caller's goroutine (see evalOnTime)
	onPath      func(direct bool) // tests: told which way each call goes (see evalOnTime), or nil
}

// exec runs script once on keys with args and returns its reply, by ctx's deadline
// whatever the client's options (see awaitReply). Under FailOpen and
// FailLocal it does not try Redis while the breaker says Redis was down moments ago,
// returning an error wrapping ErrUnavailable; the caller decides without Redis then.
// Errors are mapped by scriptError; a reply lost on the way back is ErrUnavailable,
// and the script's effect, if it ran, stands once.
func (r *runner) exec(ctx context.Context, script *redis.Script, keys []string, args []any) (any, error) {
	return r.execLate(ctx, newCommand(script, keys, args), nil)
}

// execLate is exec of c, and gives late (if not nil) a reply that came after ctx
// ended and exec had returned without it (see awaitReply).
func (r *runner) execLate(ctx context.Context, c command, late func(any)) (any, error) {
	if err := r.skip(); err != nil {
		return nil, err
	}
	val, err := r.evalOnTime(ctx, c, late)
	if err == nil {
		r.succeeded()
		return val, nil
	}
	err = r.failed(ctx, err)
	if errors.Is(err, ErrUnavailable) {
		r.down()
	}
	return nil, err
}

// skip returns an error wrapping ErrUnavailable when, under FailOpen and FailLocal,
// the breaker says Redis was down moments ago: the call is not tried.
func (r *runner) skip() error {
	if r.policy.mode != failClosed && r.breaker.skip(r.clock.Now()) {
		return fmt.Errorf("%w: key %q: %w", ErrUnavailable, r.key, errRecentlyDown)
	}
	return nil
}

// succeeded tells the breaker a call got its reply.
func (r *runner) succeeded() {
	if r.policy.mode != failClosed {
		r.breaker.succeeded()
	}
}

// down notes a call that found Redis unreachable: the cluster's slots are read anew,
// and the breaker opens (FailOpen, FailLocal).
func (r *runner) down() {
	reloadSlots(r.rdb)
	if r.policy.mode != failClosed {
		r.keep(r.breaker.failed(r.clock.Now()))
	}
}

// failed calls the RedisError hook for a failed call and maps its error (scriptError).
func (r *runner) failed(ctx context.Context, err error) error {
	if r.redisError != nil {
		r.redisError(r.key, err)
	}
	return scriptError(ctx, r.key, err)
}

// keep pins the shared state for at least d.
func (r *runner) keep(d time.Duration) { r.pin.hold(r.owner, d) }

// command is one script call, ready to send: the script, its KEYS and ARGV, and the
// arguments of its EVALSHA ("evalsha", sha, numkeys, KEYS…, ARGV…), built once where
// a call repeats (a Limiter's Allow, see Limiter.take1) so that a call boxes and
// copies nothing. sha is only read: one slice may go in many calls at once.
type command struct {
	script *redis.Script
	keys   []string
	args   []any
	sha    []any
	ints   bool // the reply is an array of integers: read it as []int64 (see replyOf)
	// headOnly: sha holds only the arguments before ARGV (evalHead), for a call that may
	// go in a batch, which needs only args; withSHA makes the whole when it is sent alone
	headOnly bool
	rec      *record // if not nil, the key's record is written in the same round trip (see record.go)
}

// newCommand returns the command that runs s on keys with args.
func newCommand(s *redis.Script, keys []string, args []any) command {
	return withHead(evalHead(s, keys), s, keys, args)
}

// evalHead returns EVALSHA's arguments before ARGV for s on keys.
func evalHead(s *redis.Script, keys []string) []any {
	head := make([]any, 0, 3+len(keys))
	head = append(head, "evalsha", s.Hash(), len(keys))
	for _, k := range keys {
		head = append(head, k)
	}
	return head
}

// withHead returns the command that runs s on keys with args, whose EVALSHA
// arguments before ARGV are head (evalHead(s, keys)).
func withHead(head []any, s *redis.Script, keys []string, args []any) command {
	sha := make([]any, len(head)+len(args))
	copy(sha, head)
	copy(sha[len(head):], args)
	return command{script: s, keys: keys, args: args, sha: sha}
}

// withSHA returns c with its EVALSHA arguments made, for a command built once and
// sent many times (Limiter.take1).
func (c command) withSHA() command {
	if c.headOnly {
		head := c.sha
		c.sha = make([]any, len(head)+len(c.args))
		copy(c.sha, head)
		copy(c.sha[len(head):], c.args)
		c.headOnly = false
	}
	return c
}

// queue adds the command to pipe (or sends it, when pipe is a client): by EVALSHA or,
// when eval, EVAL (the script's source; the server did not have it).
//
// A command whose reply is all integers (ints) is read as such (redis.IntSliceCmd):
// one []int64, where a generic reply costs an object per array and per integer
// above 255. EVAL, the rare path, reads it the generic way. A command of headOnly (see
// source.command) gets its whole EVALSHA arguments here.
func (c command) queue(ctx context.Context, pipe redis.Scripter, eval bool) redis.Cmder {
	if eval {
		return c.script.Eval(ctx, pipe, c.keys, c.args...)
	}
	sha := c.withSHA().sha
	var cmd redis.Cmder
	if c.ints {
		cmd = redis.NewIntSliceCmd(ctx, sha...)
	} else {
		cmd = redis.NewCmd(ctx, sha...)
	}
	if len(c.keys) > 0 {
		cmd.SetFirstKeyPos(3)
	}
	_ = pipe.(processor).Process(ctx, cmd)
	return cmd
}

// replyOf returns cmd's reply: []int64 for a command read as integers, else the
// generic reply (nil: none).
func replyOf(cmd redis.Cmder) any {
	switch c := cmd.(type) {
	case *redis.IntSliceCmd:
		if v := c.Val(); v != nil {
			return v
		}
	case *redis.Cmd:
		return c.Val()
	}
	return nil
}

// processor is what runs a command: every go-redis client and pipeline.
type processor interface {
	Process(ctx context.Context, cmd redis.Cmder) error
}

// pipePool keeps the pipelines (MULTI/EXEC, see evalOnce) of one client for reuse: a
// go-redis pipeline is empty again once it has run, and building one costs four
// allocations. The zero value is ready; a nil *pipePool builds a pipeline per call.
type pipePool struct{ pool sync.Pool }

// get returns a pipeline for rdb, a transaction unless rdb never re-sends.
func (ps *pipePool) get(rdb redis.UniversalClient) redis.Pipeliner {
	if ps != nil {
		if p, ok := ps.pool.Get().(redis.Pipeliner); ok {
			return p
		}
	}
	if neverResends(rdb) {
		return rdb.Pipeline()
	}
	return rdb.TxPipeline()
}

// put keeps p, which has run, for the next call.
func (ps *pipePool) put(p redis.Pipeliner) {
	if ps != nil {
		ps.pool.Put(p)
	}
}

// evalOnce runs a script at most once: EVALSHA inside MULTI/EXEC and, when the server
// does not have the script (after a restart or SCRIPT FLUSH), EVAL the same way.
// go-redis re-sends a plain command whose reply was lost to a read timeout or a dropped
// connection, which would run an acquire twice and charge twice; it never re-sends a
// transaction it has written. A call whose reply is lost fails with ErrUnavailable
// instead, and its effect, if it ran, stands once.
//
// A client that never re-sends (a go-redis Client whose options say MaxRetries < 0:
// go-redis then tries each command once) needs no transaction: the script is sent as
// a plain EVALSHA, which saves Redis the MULTI and EXEC.
func evalOnce(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys []string, args []any) (any, error) {
	c := newCommand(s, keys, args)
	return c.once(ctx, rdb, nil)
}

// once is evalOnce of c, with a pipeline from ps.
func (c command) once(ctx context.Context, rdb redis.UniversalClient, ps *pipePool) (any, error) {
	eval := evalTx
	if neverResends(rdb) {
		eval = evalPlain
	}
	cmd, err := eval(ctx, rdb, ps, c, false)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		c.rec = nil // written with the EVALSHA
		cmd, err = eval(ctx, rdb, ps, c, true)
	}
	if err != nil {
		return nil, err
	}
	return replyOf(cmd), nil
}

// neverResends reports whether rdb sends each command once whatever happens to its
// reply: a go-redis Client built with MaxRetries < 0 (its options then hold 0; the
// default, 0 when built, becomes 3). A cluster client re-sends on redirects and
// connection errors alike, so it is never taken to be one.
func neverResends(rdb redis.UniversalClient) bool {
	c, ok := rdb.(*redis.Client)
	return ok && c.Options().MaxRetries == 0
}

func evalPlain(ctx context.Context, rdb redis.UniversalClient, _ *pipePool, c command, eval bool) (redis.Cmder, error) {
	if c.rec != nil { // the record rides along: a pipeline, still one round trip
		pipe := rdb.Pipeline()
		c.rec.queue(ctx, pipe)
		cmd := c.queue(ctx, pipe, eval)
		_, err := pipe.Exec(ctx)
		if cmd.Err() == nil && replyOf(cmd) == nil {
			return cmd, err
		}
		return cmd, cmd.Err()
	}
	cmd := c.queue(ctx, rdb, eval)
	return cmd, cmd.Err()
}

func evalTx(ctx context.Context, rdb redis.UniversalClient, ps *pipePool, c command, eval bool) (redis.Cmder, error) {
	pipe := ps.get(rdb)
	var set *redis.StatusCmd
	if c.rec != nil {
		set = c.rec.queue(ctx, pipe)
	}
	cmd := c.queue(ctx, pipe, eval)
	_, err := pipe.Exec(ctx)
	ps.put(pipe)
	if execAborted(set, cmd) { // nothing ran: again without the record
		c.rec = nil
		return evalTx(ctx, rdb, ps, c, eval)
	}
	if cmd.Err() != nil {
		return cmd, cmd.Err() // the script's own error, or the connection's
	}
	if replyOf(cmd) != nil {
		return cmd, nil // the script's reply (the record's write, if it failed, does not matter)
	}
	return cmd, err // the transaction failed before the script got a reply of its own
}

// scriptError maps a failed script call to this package's errors: what a script
// reports (JTARG, JTSTATE), a wrong-type key and an ACL refusal become sentinels, an
// unreachable Redis ErrUnavailable (wrapping the cause too); anything else (the
// caller's context) is wrapped as it is.
func scriptError(ctx context.Context, key string, err error) error {
	if isUnavailable(ctx, err) {
		return fmt.Errorf("%w: key %q: %w", ErrUnavailable, key, err)
	}
	var rerr redis.Error
	if errors.As(err, &rerr) {
		msg := rerr.Error()
		switch {
		case strings.Contains(msg, "JTSTATE"), strings.Contains(msg, "WRONGTYPE"):
			return fmt.Errorf("%w: key %q: %v", ErrCorruptState, key, err)
		case strings.Contains(msg, "JTALG"):
			return algorithmError(key, msg, err)
		case strings.Contains(msg, "JTEXCEEDS"):
			return fmt.Errorf("%w: key %q: %v", ErrExceedsLimit, key, err)
		case strings.Contains(msg, "JTARG"):
			return fmt.Errorf("%w: key %q: %v", ErrInvalidArgument, key, err)
		case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "The user executing the script can't"):
			return fmt.Errorf("%w: key %q: %w", ErrNoPermission, key, err)
		}
	}
	return fmt.Errorf("jobthrottle: key %q: %w", key, err)
}

// int64s reads a script's reply of k integers (generic, or read as []int64) into v
// without allocating; it reports whether the reply was k integers.
func int64s(val any, v []int64) bool {
	if s, ok := val.([]int64); ok {
		return len(s) == len(v) && copy(v, s) == len(v)
	}
	s, ok := val.([]any)
	if !ok || len(s) != len(v) {
		return false
	}
	for i, e := range s {
		if v[i], ok = e.(int64); !ok {
			return false
		}
	}
	return true
}
