package throttle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/booking"
	"github.com/jobthrottle/jobthrottle/internal/clock"
	"github.com/jobthrottle/jobthrottle/internal/keys"
	"github.com/redis/go-redis/v9"
)

// Semaphore limits how many holders run at once across every process that uses the
// same Redis, key and prefix: at most Max leases are live at any moment.
//
// A lease lives for the lease TTL (WithLeaseTTL) unless its holder extends it, so the
// slot of a holder that dies comes back within one TTL; Release frees it at once. Use
// Do (or Lease.Hold) to run a function under a lease renewed every TTL/3 and always
// released; TryAcquire to take a lease now or learn how long to wait; Acquire to wait
// for one, served first come, first served across every process. While the key is
// paused (Limiter.Pause) no lease is granted, nor on a full Redis unless its calls go
// without MULTI/EXEC (ErrUnavailable; docs/failures.md); held leases can still be
// extended and released. A Semaphore is safe for simultaneous use and cheap to build.
type Semaphore struct {
	rdb     redis.UniversalClient
	t       *target
	key     string
	max     int
	ttl     time.Duration
	hooks   SemaphoreHooks
	policy  FailurePolicy
	timeout time.Duration
	config  string
	channel string
}

// Ops of the semaphore script (lua/semaphore.lua), and the fields of one request.
const (
	semAcquire = 0
	semExtend  = 1
	semRelease = 2
	semInspect = 3
)

// NewSemaphore returns a semaphore that lets at most max holders hold a lease on key
// at once.
//
// Its options are WithKeyPrefix, WithFailurePolicy, WithCallTimeout, WithLeaseTTL and
// WithSemaphoreHooks. With Redis unreachable a Semaphore follows its FailurePolicy:
// FailClosed (the default) grants nothing and returns an error wrapping
// ErrUnavailable; FailOpen grants every lease; FailLocal(n) grants this process's
// share of the slots, max/n (at least 1); leases granted without Redis are kept in the
// process. NewSemaphore does not contact Redis. Its errors are New's, and
// ErrInvalidLimit for max outside 1..10^9. Processes sharing a key should agree on max.
func NewSemaphore(rdb redis.UniversalClient, key string, max int, opts ...SemaphoreOption) (*Semaphore, error) {
	c, tag, err := prepare(rdb, key, opts, SemaphoreOption.applySemaphore)
	if err != nil {
		return nil, err
	}
	if max < 1 || max > maxRate {
		return nil, fmt.Errorf("%w: semaphore max %d is not in 1..%d (key %q)", ErrInvalidLimit, max, maxRate, key)
	}
	base := []string{keys.Name(tag, keys.Leases), keys.Name(tag, keys.Queue), keys.Name(tag, keys.QueueExpiry),
		keys.Name(tag, keys.State)} // the pause is the key's: a limiter state's meta holds it
	t := newSemaphoreTarget(key, tag, semaphoreScript, base, []any{max, ceilMicros(c.leaseTTL)})
	return &Semaphore{rdb: rdb, t: t, key: key, max: max, ttl: c.leaseTTL, hooks: c.semHooks, policy: c.policy,
		timeout: callTimeout(c.callTimeout, rdb), config: t.id + " " + c.policy.String(), channel: keys.Name(tag, keys.Wake)}, nil
}

var semaphoreScript = newScript("semaphore")

// client returns the process's client of the Semaphore's Redis client (see clients).
func (s *Semaphore) client() *client { return clientFor(s.rdb) }

// Key returns the key the semaphore was made for (without prefix).
func (s *Semaphore) Key() string { return s.key }

// Max returns how many leases may be live at once.
func (s *Semaphore) Max() int { return s.max }

// TryAcquire takes a lease now if fewer than Max are live and nobody is queued for
// one; otherwise it takes nothing and returns a nil lease and the time until, by
// expiry alone, a slot would come to a caller asking now (a release can free one
// earlier). Use it when a caller that cannot run now defers its work; use Acquire or
// Do to wait instead. It returns ctx.Err() for a done context and the Redis error
// when the call fails; the lease is nil with any error.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, time.Duration, error) {
	token, place, task, err := holder(ctx)
	if err != nil {
		return nil, 0, err
	}
	sent := clock.Now()
	r, err := s.call(ctx, semAcquire, token, place, task, task)
	if err != nil {
		return nil, 0, err
	}
	if !r.ok {
		if s.hooks.Denied != nil {
			s.hooks.Denied(s.key, r.wait)
		}
		return nil, r.wait, nil
	}
	return s.granted(token, sent, 0, r.local), 0, nil
}

// Acquire waits for a lease and returns it. Callers are served in arrival order
// across every process; a release hands its slot to the oldest waiter at once, which
// returns within about a pub/sub round trip. If ctx ends first, Acquire returns
// ctx.Err() at once, whatever Redis does; its place in the queue (and a lease handed to
// it meanwhile) goes back in the background, once, before any call this process makes
// on the key afterwards. Other errors are the Redis errors of the calls it makes.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	token, place, keep, err := holder(ctx) // a task keeps its place when it leaves
	if err != nil {
		return nil, err
	}
	start := clock.Now()
	l := &listener{channel: s.channel, place: place, handed: make(chan struct{}, 1), check: make(chan struct{}, 1)}
	// The end of a pause hands out nothing itself: the slots it held back go to the queue on
	// the next semaphore call. So a waiter asks again on a pause (to learn its end) and on a
	// resume, and sleeps no longer than a pause lasts.
	l.paused = func(int64) { signal(l.check) }
	l.resumed = l.paused
	h := s.client().hub
	live := h.listen(l)
	defer h.unlisten(l)
	joined := false // a call took a place in the queue: give it back when leaving without a lease
	for round := 0; ; round++ {
		// Take a place in the queue once listening is confirmed, so that no notice
		// naming it comes unheard.
		join := live || round > 0
		sent := clock.Now() // a lease handed to the place after this call is no older
		r, err := s.call(ctx, semAcquire, token, place, join, keep)
		if err != nil {
			if (joined || join && ctx.Err() != nil) && !keep {
				s.giveUp(ctx, token, place)
			}
			return nil, err
		}
		joined = joined || join
		if r.ok {
			var waited time.Duration
			if round > 0 {
				waited = clock.Now().Sub(start)
			}
			return s.granted(token, sent, waited, r.local), nil
		}
		if h.subscribe(l) && !join {
			continue // confirmed already: take the place now
		}
		next := min(r.wait, s.ttl/3) // a place lapses after one TTL
		if r.paused > 0 {
			next = min(next, r.paused)
		}
		t := clock.NewTimer(next)
		select {
		case <-l.handed:
			if place == token { // handed to its own place: the lease is its own already
				t.Stop()
				if ctx.Err() != nil {
					s.giveUp(ctx, token, place)
					return nil, ctx.Err()
				}
				return s.granted(token, sent, clock.Now().Sub(start), false), nil
			}
			// a task's place: the next call claims the lease under the token
		case <-l.check:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			if joined && !keep {
				s.giveUp(ctx, token, place)
			}
			return nil, ctx.Err()
		}
		t.Stop()
	}
}

// Do acquires a lease (as Acquire), runs fn under it (as Lease.Hold: renewed every
// TTL/3, released when fn returns) and returns fn's error, or Acquire's if it got no
// lease. If the lease is lost while fn runs, fn's context is cancelled with a cause
// wrapping ErrLeaseLost (see context.Cause); Do still returns what fn returns.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	l, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	return l.Hold(ctx, fn)
}

// holder returns a new holder's lease token and its place in the queue: the token, or,
// for a task (asynqmw), the task's own place, with task set. It fails for a done ctx.
func holder(ctx context.Context) (token, place string, task bool, err error) {
	if err := ctx.Err(); err != nil {
		return "", "", false, err
	}
	token = newToken()
	t := booking.From(ctx)
	if t == nil {
		return token, token, false, nil
	}
	if err := t.Check(); err != nil {
		return "", "", false, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	return token, t.Place(), true, nil
}

// granted makes the lease of token, granted by a call sent at sent (its TTL runs from
// no earlier, as an extension's: see Lease.Extend), and reports it to the hooks; local
// leases were granted without Redis.
func (s *Semaphore) granted(token string, sent time.Time, waited time.Duration, local bool) *Lease {
	if s.hooks.Acquired != nil {
		s.hooks.Acquired(s.key, waited)
	}
	return &Lease{s: s, id: token, granted: clock.Now(), renewed: sent, local: local}
}

// giveUp takes a waiter that stops waiting out of the queue, releasing a lease handed to
// it, in the background (keyState.leave); if that fails, the place lapses within one TTL.
func (s *Semaphore) giveUp(ctx context.Context, token, place string) {
	ctx = givingBack(ctx)
	s.client().key(s.t.tag).leave(func() {
		if _, err := s.call(ctx, semRelease, token, place, false, false); err == nil && s.hooks.GaveUp != nil {
			s.hooks.GaveUp(s.key)
		}
	})
}

// semReply is the semaphore script's answer: {ok, wait_us, held, paused_us}.
type semReply struct {
	ok     bool
	wait   time.Duration
	held   int
	paused time.Duration // denied by a pause: until its end
	local  bool          // granted without Redis, by the failure policy
}

// call makes one request of the semaphore script for the lease token (and place, to
// queue in when join is set), or, while Redis is unreachable, decides as the failure
// policy says. An acquire whose caller left before its reply came releases the lease it
// brought, and the place with it unless keep is set (a task keeps its place).
func (s *Semaphore) call(ctx context.Context, op int, token, place string, join, keep bool) (semReply, error) {
	ks := s.client().key(s.t.tag)
	if s.policy.local(ks, op == semAcquire) {
		return s.degraded(ks, op, token, fmt.Errorf("%w: key %q: %w", ErrUnavailable, s.key, errRecentlyDown))
	}
	// go-redis sends join as 1 or 0
	r := &request{ctx: ctx, t: s.t, ks: ks, fields: []any{op, token, place, join}, timeout: s.timeout}
	if op == semAcquire {
		r.late = func(rep reply) {
			p := place
			if keep {
				if rep.v[0] != 1 {
					return // no lease; the task's place stays in the queue
				}
				p = ""
			}
			_, _ = s.call(givingBack(context.Background()), semRelease, token, p, false, false)
		}
	}
	rep, err := s.client().do(r)
	if err != nil {
		if s.hooks.RedisError != nil && ctx.Err() == nil {
			s.hooks.RedisError(s.key, err)
		}
		if s.policy.degrades(err) {
			return s.degraded(ks, op, token, err)
		}
		return semReply{}, err
	}
	return semReply{ok: rep.v[0] == 1, wait: micros(rep.v[1]), held: int(rep.v[2]), paused: micros(rep.v[3])}, nil
}

// degraded answers an acquire without Redis under FailOpen or FailLocal. Extending or
// releasing a lease Redis granted needs Redis: those return cause.
func (s *Semaphore) degraded(ks *keyState, op int, token string, cause error) (semReply, error) {
	if op != semAcquire {
		return semReply{}, cause
	}
	ok, wait := s.local().acquire(clock.Now(), token, s.ttl)
	if ok {
		ks.keepFor(s.ttl) // the local lease holds its slot until then
		if s.hooks.Degraded != nil {
			s.hooks.Degraded(s.key, s.policy, cause)
		}
	}
	return semReply{ok: ok, wait: wait, local: true}, nil
}

// local returns the stand-in this configuration shares while Redis is unreachable.
func (s *Semaphore) local() *localSem {
	return s.client().key(s.t.tag).config(s.config, func() *configState { return &configState{sem: newLocalSem(s.max, s.policy)} }).sem
}

// newToken returns 128 random bits in hex: a lease's holder token.
func newToken() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand crashes the program instead)
	return hex.EncodeToString(b[:])
}
