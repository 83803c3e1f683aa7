package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// errNoReply is why a call returned without Redis's reply.
var errNoReply = errors.New("no reply")

// awaitReply runs call, one script call on rdb, and returns its reply, or returns
// early, whatever rdb's options, once the caller cannot use the reply any more:
//
//   - when ctx's deadline passes, with an error wrapping ErrUnavailable (Redis did
//     not answer in time) and context.DeadlineExceeded (so a caller that stops at
//     its deadline, or hands work back when a budget ends, sees that too): a go-redis
//     client built without ContextTimeoutEnabled waits for its own ReadTimeout,
//     retries included, whatever the deadline (a 1s deadline returned after 3s, 10s
//     after 12s);
//   - when ctx is cancelled, with ctx.Err().
//
// A call whose context has no deadline waits as long as go-redis does: each try up
// to the client's timeouts, MaxRetries more tries. (Cutting it at one ReadTimeout
// failed healthy calls on a loaded machine: a fresh process's first call also dials,
// and that is not part of ReadTimeout.)
//
// The call goes on in the background; if it then brings a reply, late is given it
// (late may be nil), so that a grant its caller never saw can be given back. A
// context that can end costs a goroutine per call; one that cannot (Background)
// calls directly.
//
// A call that fails on its own, once ctx's deadline has passed, also reports
// ErrUnavailable unless Redis answered with an error of its own, so a client that
// honours deadlines (ContextTimeoutEnabled) yields the same error as one that does not.
func awaitReply(ctx context.Context, call func(context.Context) (any, error), late func(any)) (any, error) {
	if ctx.Done() == nil { // never ends (context.Background): nothing to return early for
		return call(ctx)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	var (
		state atomic.Int32 // 0: the caller waits; 1: the reply was handed over; 2: the caller left
		val   any
		err   error
		done  = make(chan struct{})
	)
	go func() {
		v, e := call(ctx)
		if state.CompareAndSwap(0, 1) {
			val, err = v, e
			close(done)
			return
		}
		if e == nil && late != nil { // the caller left without it
			late(v)
		}
	}()
	select {
	case <-done:
	case <-ctx.Done():
		if state.CompareAndSwap(0, 2) {
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return nil, noReply(ctx, nil)
			}
			return nil, ctx.Err()
		}
		<-done // the reply came as the context ended: use it
	}
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && !isServerError(err) {
		return nil, noReply(ctx, err)
	}
	return val, err
}

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

// evalOnTime is evalOnce, returning by ctx's deadline (see awaitReply); late, if not
// nil, gets a reply that came after its caller left. A context that never ends costs
// nothing extra: it calls evalOnce directly.
func (r *runner) evalOnTime(ctx context.Context, script *redis.Script, keys []string, args []any, late func(any)) (any, error) {
	if ctx.Done() == nil {
		return evalOnce(ctx, r.rdb, script, keys, args)
	}
	return awaitReply(ctx, func(ctx context.Context) (any, error) {
		return evalOnce(ctx, r.rdb, script, keys, args)
	}, late)
}

// lateCancelTimeout bounds the call that gives back a grant whose caller had left.
const lateCancelTimeout = 2 * time.Second

// lateReply returns what awaitReply does with the reply to an acquire of n permits
// that came after its caller had left: a grant booked ahead is given back, as the
// caller would have done had it seen it. A grant that took effect at once has been
// used as far as the limit can tell (the scripts give back only bookings still
// ahead), and counts. Other operations leave nothing to give back, and a context
// that never ends never leaves early (nil for both).
func (l *Limiter) lateReply(ctx context.Context, op, n int) func(any) {
	if op != opAcquire || n == 0 || ctx.Done() == nil {
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

// lateAcquire returns what awaitReply does with the reply to a semaphore acquire for
// lease id that came after its caller had left: the lease it may have granted, or the
// place in the queue it may have taken, is given back (a release of id; one that
// holds nothing frees nothing). Other operations, and a context that never ends,
// need nothing (nil).
func (s *Semaphore) lateAcquire(ctx context.Context, op int, id string) func(any) {
	if op != semAcquire || ctx.Done() == nil {
		return nil
	}
	return func(any) {
		ctx, cancel := context.WithTimeout(context.Background(), lateCancelTimeout)
		defer cancel()
		_, _ = s.run(ctx, semRelease, id, false)
	}
}
