package throttle

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/clock"
)

// Lease is one slot of a Semaphore, held until it is released or expires. Its methods
// are safe for simultaneous use; calls on one lease run one at a time.
type Lease struct {
	s       *Semaphore
	id      string
	mu      sync.Mutex
	state   leaseState
	granted time.Time // by the Semaphore's clock
	renewed time.Time // when the call that granted it, or its last extension, was sent, by the Semaphore's clock
	local   bool      // granted without Redis by the failure policy: kept in the process
	// reported: the LeaseLost hook ran for this lease (once per lease)
	reported bool
}

type leaseState int

const (
	leaseHeld leaseState = iota
	leaseReleased
	leaseLost
)

// ID returns the lease's holder token: 128 random bits as 32 hex digits, unique to
// this holder, its member in the Redis sorted set of leases. Only this holder's calls
// renew or release it; downstream systems may use it to fence writes by an earlier
// holder of the slot.
func (l *Lease) ID() string { return l.id }

// Extend renews the lease: it expires one lease TTL from now (server clock).
//
// It returns an error wrapping ErrLeaseLost, renewing nothing, if the lease had
// already expired (its slot may be someone else's by now) or was released; the lease
// is then lost for good. Other errors are Redis errors; the lease may still be live,
// and Extend can be tried again.
func (l *Lease) Extend(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	sent := clock.Now() // the server renews it from a time after this
	if err := l.renew(ctx, semExtend, l.s.ttl); err != nil {
		return err
	}
	l.renewed = sent
	return nil
}

// Release frees the lease's slot at once and hands it to the oldest waiter, if any.
// Releasing a lease again does nothing and returns nil. If the lease had expired
// before Release reached Redis it frees nothing (the slot was already free, or is
// another holder's) and returns an error wrapping ErrLeaseLost. Other errors are Redis
// errors: the lease may still be live, and Release can be tried again (or left to
// expire).
func (l *Lease) Release(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.state == leaseReleased {
		return nil
	}
	if err := l.renew(ctx, semRelease, 0); err != nil {
		return err
	}
	l.state = leaseReleased
	if h := l.s.hooks.Released; h != nil {
		h(l.s.key, clock.Now().Sub(l.granted))
	}
	return nil
}

// renew makes the call op (semExtend or semRelease) for a held lease, or for a local one
// gives it ttl more (0: frees it), keeping the key's state (its share) that long; a lease
// found expired is lost. The caller holds l.mu.
func (l *Lease) renew(ctx context.Context, op int, ttl time.Duration) error {
	if err := l.gone(); err != nil {
		return err
	}
	var r semReply
	var err error
	if l.local {
		if r.ok = l.s.local().renew(clock.Now(), l.id, ttl); r.ok && ttl > 0 {
			l.s.client().key(l.s.t.tag).keepFor(ttl) // as at its grant (degraded): until then
		}
	} else if r, err = l.s.call(ctx, op, l.id, "", false, false); err != nil {
		return err
	}
	if !r.ok {
		l.state = leaseLost
		l.reportLost()
		return l.gone()
	}
	return nil
}

// reportLost calls the LeaseLost hook, once per lease; the caller holds l.mu.
func (l *Lease) reportLost() {
	if h := l.s.hooks.LeaseLost; h != nil && !l.reported {
		h(l.s.key)
	}
	l.reported = true
}

// gone returns the error for a lease that is no longer held, or nil.
func (l *Lease) gone() error {
	switch l.state {
	case leaseReleased:
		return fmt.Errorf("%w: lease %s of key %q was released", ErrLeaseLost, l.id, l.s.key)
	case leaseLost:
		return fmt.Errorf("%w: lease %s of key %q had expired", ErrLeaseLost, l.id, l.s.key)
	}
	return nil
}

// Hold runs fn while keeping the lease: it extends the lease every TTL/3 until fn
// returns, then releases it, and returns fn's error. Use it for a lease taken with
// TryAcquire or Acquire; Semaphore.Do is Acquire followed by Hold.
//
// If the lease is lost while fn runs (an extension found it expired, or none
// succeeded for a whole TTL), fn's context is cancelled with a cause wrapping
// ErrLeaseLost (see context.Cause), and fn should stop. Hold returns fn's error all
// the same, and does not run fn at all (returning an error wrapping ErrLeaseLost) for a
// lease already released or lost. It waits for the final release, unless ctx ends
// first: it then returns at once, whatever Redis does, and the release goes on in the
// background, once, before any call this process makes on the key afterwards. A failed
// final release is left to the hooks (RedisError): the lease then expires by itself.
func (l *Lease) Hold(ctx context.Context, fn func(ctx context.Context) error) error {
	l.mu.Lock()
	err := l.gone()
	l.mu.Unlock()
	if err != nil {
		return err
	}
	hctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done, stopped := make(chan struct{}), make(chan struct{})
	go l.keepAlive(hctx, done, stopped, cancel)
	defer func() { // also when fn panics: the slot must not stay taken
		close(done)
		released := make(chan struct{})
		go func() {
			defer close(released)
			<-stopped // an extension under way ends by its own bound
			_ = l.Release(givingBack(ctx))
		}()
		select {
		case <-released:
		case <-ctx.Done(): // the process's next calls on the key go after the release
			l.s.client().key(l.s.t.tag).leave(func() { <-released })
		}
	}()
	return fn(hctx)
}

// keepAlive extends the lease every TTL/3 until done is closed or the lease is lost
// (cancelling the holder's context), then closes stopped. Without a successful
// extension, the lease is lost a whole TTL after the last one was sent: its ticks and
// its extensions' bounds end there, so that fn never runs past a lapsed lease.
func (l *Lease) keepAlive(ctx context.Context, done <-chan struct{}, stopped chan<- struct{}, cancel context.CancelCauseFunc) {
	defer close(stopped)
	ttl := l.s.ttl
	every := max(ttl/3, time.Microsecond)
	var err error // the last extension's
	for {
		left := l.left()
		if left > 0 {
			t := clock.NewTimer(min(every, left))
			select {
			case <-done:
				t.Stop()
				return
			case <-t.C():
			}
			left = l.left()
		}
		if left <= 0 {
			l.mu.Lock()
			l.reportLost()
			l.mu.Unlock()
			lost := fmt.Errorf("%w: lease %s of key %q not renewed for %v", ErrLeaseLost, l.id, l.s.key, ttl-left)
			if err != nil {
				lost = fmt.Errorf("%w: %w", lost, err)
			}
			cancel(lost)
			return
		}
		ectx, stop := context.WithTimeout(context.WithoutCancel(ctx), min(every, left))
		err = l.Extend(ectx)
		stop()
		if errors.Is(err, ErrLeaseLost) {
			cancel(err)
			return
		}
	}
}

// left returns how long the lease lives unless renewed, by the Semaphore's clock.
func (l *Lease) left() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.s.ttl - clock.Now().Sub(l.renewed)
}
