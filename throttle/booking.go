package throttle

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"

	"github.com/jobthrottle/jobthrottle/waiter"
)

// Booking ops of the limiter scripts (ARGV[1]); see prelude.lua.
const (
	opAcquireFor     = 2
	opCancelFor      = 3
	opAcquireForLate = 5
)

// maxBookingID is the longest id ReserveFor takes, in bytes.
const maxBookingID = 512

// ReserveFor is Reserve for work that goes away and comes back, such as a task handed
// back to its queue: the booking is recorded in Redis under id, and a later
// ReserveFor with the same id and n, from any process, gets that same booking back
// (kept is true) instead of booking again, so the work keeps its place in line.
//
// A booking whose time has passed, or that a pause overtook, is not kept: ReserveFor
// then books n permits as Reserve does, within maxWait, so work that came back late
// runs on new permits (the passed ones stay counted) and the limit holds when it
// actually starts. The record expires a second after its booking takes effect; one
// nobody comes back for leaves a permit unused and nothing behind. The reservation's
// Cancel gives the permits back and deletes the record, as long as the booking is
// still this reservation's: once a later ReserveFor with id has got it back (the
// work's copy, run elsewhere), it is that one's, and Cancel leaves it alone. So a
// process that gives up (shut down while its work slept) cannot cancel a booking the
// work's copy runs on, whichever call reaches Redis first. Its Wait does not book again
// by itself: when this process pauses the key (see Pause) before the booking takes
// effect, or it took effect inside the hold, Wait returns waiter.ErrMoved (having
// given back what it could), and the work calls ReserveFor again.
//
// Errors are those of Reserve, and ErrInvalidArgument for an empty id or one longer
// than 512 bytes. Under the FailOpen and FailLocal policies, when Redis is
// unavailable it books as Reserve does, without a record.
func (l *Limiter) ReserveFor(ctx context.Context, id string, n int, maxWait time.Duration) (r *waiter.Reservation, kept bool, err error) {
	if maxWait < 0 {
		return nil, false, fmt.Errorf("%w: maxWait %v", ErrInvalidArgument, maxWait)
	}
	return l.reserveFor(ctx, id, n, maxWait, opAcquireFor, min(int64(maxWait/time.Microsecond), maxWaitMicros))
}

// ReserveForLate is ReserveFor with no bound on how far ahead it books, that also
// keeps a booking whose time passed at most late ago: the reservation is then due at
// once (Delay 0) and kept is true. Redis counted those permits when they took effect,
// so the work starts up to late after its permits: use it where the caller bounds its
// own starts, as asynqmw's middleware does (it paces the starts of each process), and
// late is small next to the limit's period. Errors are those of ReserveFor, and
// ErrInvalidArgument for a negative late.
func (l *Limiter) ReserveForLate(ctx context.Context, id string, n int, late time.Duration) (r *waiter.Reservation, kept bool, err error) {
	if late < 0 {
		return nil, false, fmt.Errorf("%w: late %v", ErrInvalidArgument, late)
	}
	return l.reserveFor(ctx, id, n, time.Duration(maxWaitMicros)*time.Microsecond, opAcquireForLate, min(int64(late/time.Microsecond), maxWaitMicros))
}

// reserveFor runs booking op (opAcquireFor with x its maxWait in µs, or
// opAcquireForLate with x its late in µs) for ReserveFor and ReserveForLate.
func (l *Limiter) reserveFor(ctx context.Context, id string, n int, maxWait time.Duration, op int, x int64) (r *waiter.Reservation, kept bool, err error) {
	if id == "" || len(id) > maxBookingID {
		return nil, false, fmt.Errorf("%w: booking id of %d bytes, want 1 to %d", ErrInvalidArgument, len(id), maxBookingID)
	}
	if err := l.checkN(n); err != nil {
		return nil, false, err
	}
	if err := ctx.Err(); err != nil {
		return nil, false, err
	}
	keys := l.bookingKeys(id)
	moved := l.hold.signal()
	rep, fresh, stamp, err := l.runFor(ctx, keys, op, n, x)
	if err != nil {
		if l.policy.degrades(err) && ctx.Err() == nil {
			r, err := l.Reserve(ctx, n, maxWait)
			return r, false, err
		}
		return nil, false, err
	}
	if fresh {
		l.report(n, rep)
	}
	// no Again: the work decides whether to wait for its booking, so Wait returns
	// waiter.ErrMoved when a pause of this process moves it (see Pause)
	b := waiter.Booking{OK: rep.granted, Delay: rep.wait, Clock: l.clock, Moved: moved, Pass: l.Pass}
	if rep.granted && rep.wait > 0 {
		// the give-back names the stamp: it cancels the booking only as this caller
		// holds it, not once another (the task's copy) has taken it over
		b.Cancel = func(ctx context.Context) error {
			c, _, _, err := l.runFor(ctx, keys, opCancelFor, n, stamp)
			if err == nil && c.granted && l.hooks.Cancelled != nil {
				l.hooks.Cancelled(l.key, n)
			}
			return err
		}
	}
	return waiter.NewReservation(b), rep.granted && !fresh, nil
}

// bookingKeys returns the script's keys for a booking op: the state key, the pause
// key and "{<prefix><key>}:bk:<id>", under the same hash tag.
func (l *Limiter) bookingKeys(id string) []string {
	state := l.keys[0]
	tag := state[:strings.LastIndexByte(state, ':')]
	// then the other algorithms' state keys, which a grant creating the state checks
	return append([]string{state, l.keys[1], tag + ":bk:" + id}, l.keys[2:]...)
}

// runFor runs a booking op once (x: op 2's maxWait or op 5's late, in µs, or op 3's
// stamp); fresh reports whether it granted anew, stamp is the stamp of the record op
// 2 wrote (the sixth and seventh integers of the reply; see prelude.lua, jt_claim).
func (l *Limiter) runFor(ctx context.Context, keys []string, op, n int, x int64) (r reply, fresh bool, stamp int64, err error) {
	args := make([]any, 3, 3+len(l.tail))
	args[0], args[1], args[2] = op, n, x
	args = append(args, l.tail...)
	val, err := l.execRecorded(ctx, keys, args) // the key's record rides along when due
	if err != nil {
		return reply{}, false, 0, err
	}
	var v [7]int64 // {granted, remaining, wait_us, reset_us, token, fresh, stamp}
	if !int64s(val, v[:]) {
		return reply{}, false, 0, fmt.Errorf("%w: key %q: %v", ErrUnexpectedReply, l.key, val)
	}
	return reply{
		granted:   v[0] == 1,
		remaining: int(v[1]),
		wait:      time.Duration(v[2]) * time.Microsecond,
		reset:     time.Duration(v[3]) * time.Microsecond,
		token:     v[4],
	}, v[5] == 1, v[6], nil
}

// TryAcquireFor is TryAcquire for work that goes away and comes back, such as a task
// handed back to its queue: the lease and the caller's place in the semaphore's queue
// are recorded under id, and a later TryAcquireFor or AcquireFor with the same id,
// from any process, finds them, so the work keeps its place in line while it is
// away.
//
// In one atomic script call it returns the lease if one is live under id (a slot the
// semaphore handed to id's place while the work was away, or one it took earlier);
// otherwise it takes a lease now if fewer than Max are live and nobody is queued;
// otherwise it takes (or renews) id's place in the queue, at the end for a new one,
// and returns a nil lease and the wait as TryAcquire does. Places are served in
// arrival order: a slot freed while the work is away is handed to its place and kept
// for it as a lease, which its next TryAcquireFor gets. That slot stays unused until
// then; a place and a handed lease nobody comes back for lapse after one lease TTL.
//
// Errors are those of TryAcquire, and ErrInvalidArgument for an empty id or one longer
// than 512 bytes.
func (s *Semaphore) TryAcquireFor(ctx context.Context, id string) (*Lease, time.Duration, error) {
	lid, err := leaseIDFor(id)
	if err != nil {
		return nil, 0, err
	}
	return s.tryAcquire(ctx, lid, true)
}

// AcquireFor is Acquire in id's place in the queue (see TryAcquireFor): it waits for
// the lease the semaphore hands to that place. If ctx ends first, it returns ctx.Err()
// and keeps the place (and a slot handed to it meanwhile) for the next TryAcquireFor
// or AcquireFor with id, for one lease TTL.
func (s *Semaphore) AcquireFor(ctx context.Context, id string) (*Lease, error) {
	lid, err := leaseIDFor(id)
	if err != nil {
		return nil, err
	}
	return s.acquire(ctx, lid, true)
}

// leaseIDFor is the lease id recorded for id: 128 bits of its SHA-256, in hex.
func leaseIDFor(id string) (string, error) {
	if id == "" || len(id) > maxBookingID {
		return "", fmt.Errorf("%w: booking id of %d bytes, want 1 to %d", ErrInvalidArgument, len(id), maxBookingID)
	}
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:16]), nil
}
