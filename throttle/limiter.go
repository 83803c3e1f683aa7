package throttle

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Limiter enforces one or more rate limits on a key, shared by every process that
// uses the same Redis, key, prefix and algorithm.
//
// Every decision is one atomic script call, run at most once, that reads the clock of
// the Redis server, so clients' clocks do not matter and no two processes can both
// take the last permit. A denial is a Result
// with Allowed false and the exact RetryAfter, not an error; an error means bad input
// or a failed Redis call, and then nothing was granted. Concurrent calls share round
// trips (see WithCoalescing): each is still decided on its own, as above.
//
// Use Allow or AllowN to take permits now or not at all (to drop or defer work); Wait
// or WaitN to sleep until they come (a worker loop); Reserve to book them and decide
// yourself (see waiter.Reservation). Waiting callers book their place: they are served
// in arrival order across every process, at one Redis call per wait, without polling.
//
// A Limiter is safe for simultaneous use by multiple goroutines, and cheap to build:
// Limiters of one process on the same client, key and configuration share what the
// process knows of the key besides Redis (failure policy, Stats, StateLost; the hold
// is shared per client and key), so one built per call or per task behaves as one
// built once.
type Limiter struct {
	runner
	keys    []string // state key, pause key
	alg     Algorithm
	limits  []Limit
	script  *redis.Script
	view    *redis.Script // Inspect's script; nil: the algorithm's (tests swap it)
	tail    []any         // ARGV after op, n, waitOrToken
	take1   command       // the usual call, Allow: op acquire, n 1, waitOrToken 0, tail
	late1   func(any)     // lateReply(opAcquire, 1)
	maxN    int
	hooks   Hooks
	hold    *hold         // this process's hold on the key (see Hold)
	shared  *limiterState // shared with the Limiters built alike (see shared.go)
	src     source        // its side of coalescing (see coalesce.go)
	local   *localLog     // shared.local: FailLocal's share
	stats   *counters     // &shared.stats
	latest  *stateWatch   // &shared.latest
	keepFor time.Duration // how long a grant matters to StateLost after it takes effect
}

// New returns a limiter enforcing limit, and any limits added with WithLimits, on key.
//
// rdb may be any go-redis client: a plain Client, a Sentinel-backed FailoverClient or a
// ClusterClient. New does not contact Redis. It returns an error wrapping ErrNilClient
// for a nil client, ErrInvalidKey for an empty key, ErrInvalidLimit for a limit out of
// range (see Limit), or ErrInvalidArgument for an option with a bad value. Options
// that only fit a Semaphore do not compile here (see Option).
func New(rdb redis.UniversalClient, key string, limit Limit, opts ...Option) (*Limiter, error) {
	c := newConfig()
	for _, o := range opts {
		o.applyLimiter(c)
	}
	tag, err := prepare(rdb, key, c)
	if err != nil {
		return nil, err
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
	tail := a.args(limits, c)
	shared := limiterStates.get(sharedKey{rdb, tag, fmt.Sprint("limiter", c.algorithm, tail, c.policy)}, func() *limiterState {
		s := &limiterState{}
		if c.policy.mode == failLocal {
			s.local = newLocalLog(limits, c.algorithm, c.policy.fleet)
		}
		s.rec = newRecord(rdb, tag, c.algorithm, limits, c.buckets)
		return s
	})
	l := &Limiter{
		runner:  newRunner(rdb, key, c, &shared.keyState, shared, c.hooks.RedisError),
		keys:    algorithmKeys(tag, a.suffix),
		alg:     c.algorithm,
		limits:  limits,
		script:  a.script,
		tail:    tail,
		maxN:    maxN,
		hooks:   c.hooks,
		hold:    holdFor(sharedKey{rdb: rdb, tag: tag}),
		shared:  shared,
		local:   shared.local,
		stats:   &shared.stats,
		latest:  &shared.latest,
		keepFor: grantMatters(limits, c.algorithm),
	}
	l.src = newSource(&l.runner, clientBatcher(rdb, c), shared, l.keys, [3]int8{0, 1, 2}, tail, l, l.script, 5)
	l.take1 = l.src.command(l.script, append([]any{opAcquire, 1, int64(0)}, tail...)).withSHA()
	l.late1 = l.lateReply(opAcquire, 1)
	return l, nil
}

// grantMatters is how long after a grant takes effect its permits still count
// somewhere: the longest period, or for a token bucket whose burst is above its rate
// the time the bucket takes to refill the burst.
func grantMatters(limits []Limit, alg Algorithm) time.Duration {
	var d time.Duration
	for _, l := range limits {
		refills := 1 // burst × period <= 2^50µs for a token bucket: no overflow
		if alg == TokenBucket {
			refills = max(1, (l.burst()+l.Rate-1)/l.Rate)
		}
		d = max(d, l.Period*time.Duration(refills))
	}
	return d
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

// call runs the script once: op, n, waitOrToken (for an acquire the longest wait
// in µs, for a cancel the token of the booking to give back), or, while
// Redis is unreachable, decides as the failure policy says.
func (l *Limiter) call(ctx context.Context, op, n int, waitOrToken int64) (reply, error) {
	r, err := l.run(ctx, op, n, waitOrToken)
	if l.policy.degrades(err) {
		return l.degraded(op, n, waitOrToken, err)
	}
	return r, err
}

// run runs the script once.
func (l *Limiter) run(ctx context.Context, op, n int, waitOrToken int64) (reply, error) {
	var mark stateMark
	if l.hooks.StateLost != nil {
		mark = l.latest.get()
	}
	c := l.take1 // built once; go-redis only reads it
	if op != opAcquire || n != 1 || waitOrToken != 0 || c.script != l.script {
		args := make([]any, 3, 3+len(l.tail))
		args[0], args[1], args[2] = op, n, waitOrToken
		c = l.src.command(l.script, append(args, l.tail...))
	}
	c.rec = l.recordIf(op == opAcquire && n > 0) // a call that may grant carries the key's record when due
	val, ints, err := l.src.decide(ctx, c)
	c.rec.failedIf(err)
	if err != nil {
		if ae, ok := err.(*AlgorithmError); ok {
			ae.Want = l.alg
		}
		return reply{}, err
	}
	var v [5]int64 // {granted, remaining, wait_us, reset_us, token}
	if ints != nil {
		copy(v[:], ints) // five: see group.deliverFlat
	} else if !int64s(val, v[:]) {
		return reply{}, fmt.Errorf("%w: key %q: %v", ErrUnexpectedReply, l.key, val)
	}
	r := reply{
		granted:   v[0] == 1,
		remaining: int(v[1]),
		wait:      time.Duration(v[2]) * time.Microsecond,
		reset:     time.Duration(v[3]) * time.Microsecond,
		token:     v[4],
	}
	if l.hooks.StateLost != nil {
		l.observe(mark, op, n, waitOrToken, r)
	}
	return r, nil
}
