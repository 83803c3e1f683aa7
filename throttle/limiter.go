package throttle

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Limiter enforces one or more rate limits on a key, shared by every process that
// uses the same Redis, key, prefix and algorithm.
//
// Every decision is one atomic script call (EVALSHA) that reads the clock of the Redis
// server, so clients' clocks do not matter and no two processes can both take the last
// permit. A denial is a Result with Allowed false and the exact RetryAfter, not an
// error; an error means bad input or a failed Redis call, and then nothing was granted.
//
// Use Allow or AllowN to take permits now or not at all (to drop or defer work); Wait
// or WaitN to sleep until they come (a worker loop); Reserve to book them and decide
// yourself (see waiter.Reservation). Waiting callers book their place: they are served
// in arrival order across every process, at one Redis call per wait, without polling.
//
// A Limiter holds no state of its own besides its configuration: it is safe for
// simultaneous use by multiple goroutines, and two Limiters built alike are
// interchangeable.
type Limiter struct {
	rdb    redis.UniversalClient
	key    string
	keys   []string // state key, pause key
	alg    Algorithm
	limits []Limit
	script *redis.Script
	tail   []any // ARGV after op, n, x
	take1  []any // the whole ARGV of the usual call, Allow: op acquire, n 1, x 0, tail
	maxN   int
	hooks  Hooks
	clock  waiter.Clock
	moved  *pauseSignal // closed when this process pauses the key
	policy FailurePolicy
	brk    breaker
	local  *localLog // FailLocal's share
	stats  counters
	lost   stateWatch // the latest grant, for Hooks.StateLost
}

// New returns a limiter enforcing limit, and any limits added with WithLimits, on key.
//
// rdb may be any go-redis client: a plain Client, a Sentinel-backed FailoverClient or a
// ClusterClient. New does not contact Redis. It returns an error wrapping ErrNilClient
// for a nil client, ErrInvalidKey for an empty key, ErrInvalidLimit for a limit out of
// range (see Limit), or ErrInvalidArgument for an option that does not fit.
func New(rdb redis.UniversalClient, key string, limit Limit, opts ...Option) (*Limiter, error) {
	if isNilClient(rdb) {
		return nil, ErrNilClient
	}
	c := newConfig()
	for _, o := range opts {
		o.apply(c)
	}
	if c.err != nil {
		return nil, c.err
	}
	limits := append([]Limit{limit}, c.extra...)
	if len(limits) > 16 {
		return nil, fmt.Errorf("%w: %d limits, at most 16", ErrInvalidArgument, len(limits))
	}
	a := c.algorithm.algo()
	maxN := maxRate
	for _, l := range limits {
		if err := l.validate(c.algorithm); err != nil {
			return nil, fmt.Errorf("%w (key %q, limit %s)", err, key, l)
		}
		maxN = min(maxN, a.maxN(l))
	}
	tag, err := hashTag(c.prefix, key)
	if err != nil {
		return nil, err
	}
	script := a.script
	if c.script != nil {
		script = c.script
	}
	tail := a.args(limits, c)
	l := &Limiter{
		rdb:    rdb,
		key:    key,
		keys:   []string{tag + ":" + a.suffix, tag + ":pause"},
		alg:    c.algorithm,
		limits: limits,
		script: script,
		tail:   tail,
		take1:  append([]any{opAcquire, 1, int64(0)}, tail...),
		maxN:   maxN,
		hooks:  c.hooks,
		clock:  c.clock,
		moved:  pauseSignalFor(rdb, tag),
		policy: c.policy,
	}
	if c.policy.mode == failLocal {
		l.local = newLocalLog(limits, c.algorithm, c.policy.fleet)
	}
	return l, nil
}

// hashTag returns "{<prefix><key>}", the part every Redis key of a limiter starts with,
// so Redis Cluster hashes only it and all of them land in one slot whatever braces the
// key holds: the tag ends at the first "}" after the opening brace, the same place in
// every key of the limiter. The tag must not be empty, which a key starting with "}"
// and no prefix would make.
func hashTag(prefix, key string) (string, error) {
	if key == "" {
		return "", fmt.Errorf("%w: empty key", ErrInvalidKey)
	}
	if strings.HasPrefix(prefix+key, "}") {
		return "", fmt.Errorf("%w: %q: prefix and key must not start with '}'", ErrInvalidKey, prefix+key)
	}
	return "{" + prefix + key + "}", nil
}

func isNilClient(rdb redis.UniversalClient) bool {
	switch c := rdb.(type) {
	case nil:
		return true
	case *redis.Client:
		return c == nil
	case *redis.ClusterClient:
		return c == nil
	case *redis.Ring:
		return c == nil
	}
	return false
}

// Key returns the key the limiter was made for (without prefix).
func (l *Limiter) Key() string { return l.key }

// Algorithm returns the limiter's algorithm.
func (l *Limiter) Algorithm() Algorithm { return l.alg }

// Limits returns the limits the limiter enforces, the first one first.
func (l *Limiter) Limits() []Limit { return append([]Limit(nil), l.limits...) }

// Allow is shorthand for AllowN(ctx, 1).
func (l *Limiter) Allow(ctx context.Context) (Result, error) {
	return l.AllowN(ctx, 1)
}

// AllowN takes n permits now if every limit has room for them, and otherwise takes
// nothing and reports in RetryAfter when they would fit. Queued reservations come
// first: while any wait, AllowN is denied. AllowN(ctx, 0) takes nothing and reports
// the state (Allowed is true).
//
// Use AllowN when a denied caller drops or defers its work; use Wait or Reserve to
// wait for the permits instead.
//
// It returns an error wrapping ErrInvalidArgument for n < 0, ErrExceedsLimit for n
// above what the limit can ever grant (without calling Redis), ctx.Err() for a done
// context, and the Redis error when the call fails; Allowed is false with any error.
func (l *Limiter) AllowN(ctx context.Context, n int) (Result, error) {
	if err := l.checkN(n); err != nil {
		return Result{}, err
	}
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	r, err := l.call(ctx, opAcquire, n, 0)
	if err != nil {
		return Result{}, err
	}
	l.report(n, r)
	return r.result(), nil
}

// report calls the Allowed or Denied hook for a decision.
func (l *Limiter) report(n int, r reply) {
	if r.granted {
		if l.hooks.Allowed != nil {
			l.hooks.Allowed(l.key, n, r.wait)
		}
	} else if l.hooks.Denied != nil {
		l.hooks.Denied(l.key, n, r.wait)
	}
}

func (l *Limiter) checkN(n int) error {
	if n < 0 {
		return fmt.Errorf("%w: n = %d", ErrInvalidArgument, n)
	}
	if n > l.maxN {
		return fmt.Errorf("%w: n = %d, at most %d (key %q)", ErrExceedsLimit, n, l.maxN, l.key)
	}
	return nil
}

// Script operations (ARGV[1]).
const (
	opAcquire = 0
	opCancel  = 1
)

// reply is a script's answer: {granted, remaining, wait_us, reset_us, token}.
type reply struct {
	granted   bool
	remaining int
	wait      time.Duration
	reset     time.Duration
	token     int64 // when the grant takes effect (µs); what a cancel sends back
	local     bool  // decided without Redis (FailOpen, FailLocal): token is local time
}

func (r reply) result() Result {
	res := Result{Allowed: r.granted, Remaining: r.remaining, ResetAfter: r.reset}
	if !r.granted {
		res.RetryAfter = r.wait
	}
	return res
}

// call runs the script once: op, n, x (max wait µs, or a token to cancel), or, while
// Redis is unreachable, decides as the failure policy says.
func (l *Limiter) call(ctx context.Context, op, n int, x int64) (reply, error) {
	if l.policy.mode == failClosed {
		return l.run(ctx, op, n, x)
	}
	if l.brk.skip(l.clock.Now()) {
		return l.degraded(op, n, x, fmt.Errorf("%w: key %q: %w", ErrUnavailable, l.key, errRecentlyDown))
	}
	r, err := l.run(ctx, op, n, x)
	switch {
	case err == nil:
		l.brk.succeeded()
	case errors.Is(err, ErrUnavailable):
		l.brk.failed(l.clock.Now())
		return l.degraded(op, n, x, err)
	}
	return r, err
}

// run runs the script once.
func (l *Limiter) run(ctx context.Context, op, n int, x int64) (reply, error) {
	var mark stateMark
	if l.hooks.StateLost != nil {
		mark = l.lost.get()
	}
	args := l.take1 // go-redis copies the arguments; the shared slice is only read
	if op != opAcquire || n != 1 || x != 0 {
		args = make([]any, 3, 3+len(l.tail))
		args[0], args[1], args[2] = op, n, x
		args = append(args, l.tail...)
	}
	cmd, err := evalOnce(ctx, l.rdb, l.script, l.keys, args)
	if err != nil {
		if l.hooks.RedisError != nil {
			l.hooks.RedisError(l.key, err)
		}
		err = scriptError(ctx, l.key, err)
		if errors.Is(err, ErrUnavailable) {
			reloadSlots(l.rdb)
		}
		return reply{}, err
	}
	v, ok := int64s5(cmd.Val())
	if !ok {
		return reply{}, fmt.Errorf("%w: key %q: %v", ErrUnexpectedReply, l.key, cmd.Val())
	}
	r := reply{
		granted:   v[0] == 1,
		remaining: int(v[1]),
		wait:      time.Duration(v[2]) * time.Microsecond,
		reset:     time.Duration(v[3]) * time.Microsecond,
		token:     v[4],
	}
	if l.hooks.StateLost != nil {
		l.observe(mark, op, n, x, r)
	}
	return r, nil
}

// evalOnce runs a script at most once: EVALSHA inside MULTI/EXEC and, when the server
// does not have the script (after a restart or SCRIPT FLUSH), EVAL the same way.
// go-redis re-sends a plain command whose reply was lost to a read timeout or a dropped
// connection, which would run an acquire twice and charge twice; it never re-sends a
// transaction it has written. A call whose reply is lost fails with ErrUnavailable
// instead, and its effect, if it ran, stands once.
func evalOnce(ctx context.Context, rdb redis.UniversalClient, s *redis.Script, keys []string, args []any) (*redis.Cmd, error) {
	cmd, err := evalTx(ctx, rdb, s.EvalSha, keys, args)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmd, err = evalTx(ctx, rdb, s.Eval, keys, args)
	}
	return cmd, err
}

func evalTx(ctx context.Context, rdb redis.UniversalClient,
	eval func(context.Context, redis.Scripter, []string, ...any) *redis.Cmd, keys []string, args []any,
) (*redis.Cmd, error) {
	pipe := rdb.TxPipeline()
	cmd := eval(ctx, pipe, keys, args...)
	_, err := pipe.Exec(ctx)
	if cmd.Err() != nil {
		return cmd, cmd.Err() // the script's own error, or the connection's
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
		case strings.Contains(msg, "JTARG"):
			return fmt.Errorf("%w: key %q: %v", ErrInvalidArgument, key, err)
		case strings.Contains(msg, "NOPERM"), strings.Contains(msg, "The user executing the script can't"):
			return fmt.Errorf("%w: key %q: %w", ErrNoPermission, key, err)
		}
	}
	return fmt.Errorf("jobthrottle: key %q: %w", key, err)
}

// int64s5 reads a limiter script's reply, five integers, without allocating.
func int64s5(val any) (v [5]int64, ok bool) {
	s, ok := val.([]any)
	if !ok || len(s) != 5 {
		return v, false
	}
	for i, e := range s {
		if v[i], ok = e.(int64); !ok {
			return v, false
		}
	}
	return v, true
}
