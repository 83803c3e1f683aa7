package throttle

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// Semaphore limits how many holders run at once across every process that uses the
// same Redis, key and prefix: at most Max leases are live at any moment.
//
// A lease lives for the lease TTL (WithLeaseTTL, 30 seconds by default) unless its
// holder extends it, so the slot of a holder that dies comes back within one TTL;
// Release frees it at once. Use Do (or Lease.Hold) to run a function under a lease
// that is renewed every TTL/3 and always released; TryAcquire to take a lease now or
// learn how long to wait (to hand a job back to its queue); Acquire to wait for one.
//
// Waiters are served first come, first served across every process: a freed slot
// goes straight to the oldest waiter, which has it within about a pub/sub round trip,
// without polling (the README's "In-flight limits: Semaphore" tells how). While the
// key is paused (Limiter.Pause) no lease is granted; held leases can still be
// extended and released. Keys: "{<prefix><key>}:sem", ":semq" and ":semx"; channel
// "{<prefix><key>}:sem:wake".
//
// A Semaphore is safe for simultaneous use by multiple goroutines, and cheap to
// build: Semaphores of one process built alike share what the process knows of the
// key (see Limiter).
type Semaphore struct {
	runner
	keys    []string // leases, queue, queue expiries, pause
	channel string
	max     int
	ttl     time.Duration
	ttlUS   int64
	script  *redis.Script
	view    *redis.Script // Inspect's script; nil: lua.InspectSemaphore.Script() (tests swap it)
	hooks   SemaphoreHooks
	hub     *wakeHub
	shared  *semaphoreState // shared with the Semaphores built alike (see shared.go)
	local   *localSem       // shared.local: stands in while Redis is unreachable
	stats   *counters       // &shared.stats
	src     source          // its side of coalescing (see coalesce.go)
}

// NewSemaphore returns a semaphore that lets at most max holders hold a lease on key
// at once.
//
// Its options are WithKeyPrefix, WithFailurePolicy, WithCallTimeout, WithCoalescing
// (CommonOptions, which a Limiter takes too), WithLeaseTTL and WithSemaphoreHooks; a Limiter's own options do
// not compile here (see SemaphoreOption). With Redis unreachable a
// Semaphore follows its FailurePolicy: FailClosed (the default) grants nothing and
// returns an error wrapping ErrUnavailable; FailOpen grants every lease; FailLocal(n)
// grants this process's share of the slots, max/n (at least 1). Leases granted without
// Redis are kept in the process (Extend and Release act on them there) and are not
// known to Redis when it returns. NewSemaphore does not contact Redis. It returns an error
// wrapping ErrNilClient for a nil client, ErrInvalidKey for an empty key,
// ErrInvalidLimit for max outside 1..10^9, or ErrInvalidArgument for an option that
// does not fit.
//
// Processes sharing a key should agree on max: each call enforces the max it is given.
func NewSemaphore(rdb redis.UniversalClient, key string, max int, opts ...SemaphoreOption) (*Semaphore, error) {
	c := newConfig()
	for _, o := range opts {
		o.applySemaphore(c)
	}
	tag, err := prepare(rdb, key, c)
	if err != nil {
		return nil, err
	}
	if max < 1 || max > maxRate {
		return nil, fmt.Errorf("%w: semaphore max %d is not in 1..%d (key %q)", ErrInvalidLimit, max, maxRate, key)
	}
	ttl := c.leaseTTL
	if ttl == 0 {
		ttl = defaultLeaseTTL
	}
	sem := tag + ":sem"
	shared := semaphoreStates.get(sharedKey{rdb, tag, fmt.Sprint("semaphore", max, ttl, c.policy)}, func() *semaphoreState {
		return &semaphoreState{local: newLocalSem(max, c.policy)}
	})
	s := &Semaphore{
		runner:  newRunner(rdb, key, c, &shared.keyState, shared, c.semHooks.RedisError),
		keys:    []string{sem, tag + ":semq", tag + ":semx", tag + ":pause"},
		channel: sem + ":wake",
		max:     max,
		ttl:     ttl,
		ttlUS:   ceilMicros(ttl),
		script:  lua.Semaphore.Script(),
		hooks:   c.semHooks,
		hub:     wakeHubFor(rdb),
		shared:  shared,
		local:   shared.local,
		stats:   &shared.stats,
	}
	s.src = newSource(&s.runner, clientBatcher(rdb, c), shared, s.keys, [3]int8{0, 1, 4}, []any{s.max, s.ttlUS}, s, s.script, 3)
	return s, nil
}

// Stats returns the counters of leases granted without Redis by the Semaphores of this
// process built alike.
func (s *Semaphore) Stats() Stats {
	return Stats{FailedOpen: s.stats.failedOpen.Load(), Local: s.stats.local.Load()}
}

// Key returns the key the semaphore was made for (without prefix).
func (s *Semaphore) Key() string { return s.key }

// Max returns how many leases may be live at once.
func (s *Semaphore) Max() int { return s.max }

// LeaseTTL returns how long a lease lives unless extended.
func (s *Semaphore) LeaseTTL() time.Duration { return s.ttl }

// TryAcquire takes a lease now if fewer than Max are live and nobody is queued for
// one; otherwise it takes nothing and returns a nil lease and the time until, by expiry
// alone, a slot would come to a caller asking now: the time until the earliest live
// lease expires when nobody is queued, later when others are (a release can free a
// slot earlier; an extension can push it later).
//
// Use TryAcquire when a caller that cannot run now defers its work (an asynq task
// coming back after the wait); use Acquire or Do to wait instead.
//
// It returns ctx.Err() for a done context (without calling Redis) and the Redis
// error when the call fails; the lease is nil with any error.
func (s *Semaphore) TryAcquire(ctx context.Context) (*Lease, time.Duration, error) {
	return s.tryAcquire(ctx, newLeaseID(), false)
}

// tryAcquire is TryAcquire for lease id; join takes (or renews) id's place in the
// queue when denied (TryAcquireFor).
func (s *Semaphore) tryAcquire(ctx context.Context, id string, join bool) (*Lease, time.Duration, error) {
	if err := ctx.Err(); err != nil {
		return nil, 0, err
	}
	r, err := s.call(ctx, semAcquire, id, join, join)
	if err != nil {
		return nil, 0, err
	}
	if !r.ok {
		if s.hooks.Denied != nil {
			s.hooks.Denied(s.key, r.wait)
		}
		return nil, r.wait, nil
	}
	return s.granted(id, 0, r.local), 0, nil
}

// Acquire waits for a lease and returns it. Callers are served in arrival order
// across every process; a release hands its slot to the oldest waiter at once, which
// returns within about a pub/sub round trip.
//
// If ctx ends first, Acquire gives its place in the queue back (and releases a lease
// handed to it in the meantime) and returns ctx.Err(); unlike Limiter.Wait it does not
// fail early when ctx's deadline is sooner than a slot is expected, since a release can
// come at any time. Other errors are the Redis errors of the calls it makes.
func (s *Semaphore) Acquire(ctx context.Context) (*Lease, error) {
	return s.acquire(ctx, newLeaseID(), false)
}

// acquire is Acquire for lease id; keep leaves id's place in the queue (and a slot
// handed to it) when ctx ends, for the next call with id (AcquireFor).
func (s *Semaphore) acquire(ctx context.Context, id string, keep bool) (*Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	start := s.clock.Now()
	w, live := s.hub.watch(s.channel, id)
	defer w.stop()
	joined := false // a call took a place in the queue: give it back when leaving without a lease
	for round := 0; ; round++ {
		// Take a place in the queue once listening is confirmed, so that no notice
		// naming id can come unheard: on the first call if the subscription is live,
		// else once subscribe says it is, or from the second call (the confirmation,
		// or the timer, wakes us before then).
		join := live || round > 0
		r, err := s.call(ctx, semAcquire, id, join, keep)
		if err != nil {
			// A joining call that ctx cut short has most likely taken its place
			// already (its reply was on the way): give it back before returning. If
			// it had not run yet, the late reply's release gives it back (lateAcquire).
			if (joined || (join && ctx.Err() != nil)) && !keep {
				s.giveUp(ctx, id)
			}
			return nil, err
		}
		joined = joined || join
		if r.ok {
			var waited time.Duration // reported only if it had to wait
			if round > 0 {
				waited = s.clock.Now().Sub(start)
			}
			return s.granted(id, waited, r.local), nil
		}
		if w.subscribe(ctx) && !join {
			continue // confirmed already: take the place now
		}
		t := s.clock.NewTimer(min(r.wait, s.ttl/3)) // a place lapses after one TTL
		select {
		case <-w.handed:
			t.Stop()
			if ctx.Err() != nil {
				if !keep {
					s.giveUp(ctx, id)
				}
				return nil, ctx.Err()
			}
			return s.granted(id, s.clock.Now().Sub(start), false), nil
		case <-w.check:
		case <-t.C():
		case <-ctx.Done():
			t.Stop()
			if joined && !keep {
				s.giveUp(ctx, id)
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

// granted makes the lease for id and reports it to the hooks; local leases were
// granted without Redis.
func (s *Semaphore) granted(id string, waited time.Duration, local bool) *Lease {
	if s.hooks.Acquired != nil {
		s.hooks.Acquired(s.key, waited)
	}
	now := s.clock.Now()
	return &Lease{s: s, id: id, granted: now, renewed: now, local: local}
}

// giveUp takes id out of the queue, releasing the lease if one was handed to it, for
// a waiter that stops waiting. It runs even when ctx is done; if it fails, the place
// lapses by itself within one TTL.
func (s *Semaphore) giveUp(ctx context.Context, id string) {
	if _, err := s.call(context.WithoutCancel(ctx), semRelease, id, false, false); err != nil {
		return
	}
	if s.hooks.GaveUp != nil {
		s.hooks.GaveUp(s.key)
	}
}

// Semaphore script operations (ARGV[1]).
const (
	semAcquire = 0
	semExtend  = 1
	semRelease = 2
)

// semReply is the semaphore script's answer: {ok, wait_us, held}.
type semReply struct {
	ok    bool
	wait  time.Duration
	held  int
	local bool // granted without Redis, by the failure policy
}

// call runs the semaphore script once for lease id, or, while Redis is unreachable,
// decides as the failure policy says (see Limiter.call). keep marks id's place as
// kept when its caller leaves (TryAcquireFor, AcquireFor): a reply that comes after
// the caller left gives nothing back.
func (s *Semaphore) call(ctx context.Context, op int, id string, join, keep bool) (semReply, error) {
	r, err := s.run(ctx, op, id, join, keep)
	if s.policy.degrades(err) {
		return s.degraded(op, id, err)
	}
	return r, err
}

// degraded answers an acquire without Redis under FailOpen or FailLocal. Extending or
// releasing a lease Redis granted needs Redis: those return cause.
func (s *Semaphore) degraded(op int, id string, cause error) (semReply, error) {
	if op != semAcquire {
		return semReply{}, cause
	}
	ok, wait := s.local.acquire(s.clock.Now(), id, s.ttl)
	if ok {
		s.keep(s.ttl) // the local lease holds its slot until then
		if s.policy.mode == failOpen {
			s.stats.failedOpen.Add(1)
		} else {
			s.stats.local.Add(1)
		}
		if s.hooks.Degraded != nil {
			s.hooks.Degraded(s.key, s.policy, cause)
		}
	}
	return semReply{ok: ok, wait: wait, local: true}, nil
}

// run runs the semaphore script once for lease id; join asks a denied acquire to
// take (or renew) a place in the queue; keep, see call.
func (s *Semaphore) run(ctx context.Context, op int, id string, join, keep bool) (semReply, error) {
	q := 0
	if join {
		q = 1
	}
	if keep {
		ctx = context.WithValue(ctx, keepPlace{}, true) // for lateFor
	}
	val, ints, err := s.src.decide(ctx, s.src.command(s.script, []any{op, id, s.max, s.ttlUS, q}))
	if err != nil {
		return semReply{}, err
	}
	var v [3]int64 // {ok, wait_us, held}
	if ints != nil {
		copy(v[:], ints) // three: see group.deliverFlat
	} else if !int64s(val, v[:]) {
		return semReply{}, fmt.Errorf("%w: key %q: %v", ErrUnexpectedReply, s.key, val)
	}
	return semReply{ok: v[0] == 1, wait: time.Duration(v[1]) * time.Microsecond, held: int(v[2])}, nil
}

// newLeaseID returns 128 random bits in hex.
func newLeaseID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand crashes the program instead)
	return hex.EncodeToString(b[:])
}
