package throttle

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"time"
	"weak"

	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// Pause stops all grants on the limiter's key, across every process and algorithm,
// for d: until then every call is denied, and bookings start after the pause. A
// longer pause already set is kept. Waiters of this process that booked a time inside
// the pause give their booking back and book again after it; callers in other
// processes that booked before the pause keep their booking (see the README's
// "Guarantees and failure modes").
//
// The HTTP transport (waiter.NewTransport) calls Pause when a server answers 429 or
// 503 with Retry-After. It returns an error wrapping ErrInvalidArgument for d <= 0.
func (l *Limiter) Pause(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return fmt.Errorf("%w: pause %v", ErrInvalidArgument, d)
	}
	us := min((int64(d)+int64(time.Microsecond)-1)/int64(time.Microsecond), maxPeriodUS)
	if err := lua.Pause.Run(ctx, l.rdb, l.keys[1:2], us).Err(); err != nil {
		if l.hooks.RedisError != nil {
			l.hooks.RedisError(l.key, err)
		}
		return scriptError(ctx, l.key, err)
	}
	l.moved.fire()
	if l.hooks.Paused != nil {
		l.hooks.Paused(l.key, d)
	}
	return nil
}

// pauseSignal tells this process's waiters on a key that it was paused: the channel
// current() returns is closed by the next fire().
type pauseSignal struct {
	mu sync.Mutex
	ch chan struct{}
}

func (p *pauseSignal) current() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ch
}

func (p *pauseSignal) fire() {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.ch)
	p.ch = make(chan struct{})
}

type signalKey struct {
	rdb redis.Scripter
	tag string
}

// signals holds the signal of every key some Limiter of this process uses, weakly: an
// entry goes when the last Limiter of its key is collected, so per-tenant keys made
// and dropped by the million leave nothing behind.
var (
	signalsMu sync.Mutex
	signals   = map[signalKey]weak.Pointer[pauseSignal]{}
)

// pauseSignalFor returns the signal shared by every Limiter of this process on the same
// client and key.
func pauseSignalFor(rdb redis.Scripter, tag string) *pauseSignal {
	signalsMu.Lock()
	defer signalsMu.Unlock()
	k := signalKey{rdb, tag}
	if s := signals[k].Value(); s != nil {
		return s
	}
	s := &pauseSignal{ch: make(chan struct{})}
	signals[k] = weak.Make(s)
	runtime.AddCleanup(s, dropSignal, k)
	return s
}

func dropSignal(k signalKey) {
	signalsMu.Lock()
	defer signalsMu.Unlock()
	if signals[k].Value() == nil {
		delete(signals, k)
	}
}
