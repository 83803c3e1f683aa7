// Package clock is the Go side's time, for throttle and waiter: when a booking is due,
// and the timers that sleep until then (decisions use the Redis server's clock). It is
// the time package's, unless a test sets another with Set; it is internal so that it is
// not part of the API.
package clock

import (
	"context"
	"math"
	"sync/atomic"
	"time"
)

// Clock is a source of time and timers.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the waiters use.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

var current atomic.Pointer[Clock]

// Now returns the current time.
func Now() time.Time {
	if c := current.Load(); c != nil {
		return (*c).Now()
	}
	return time.Now()
}

// NewTimer returns a timer that fires after d.
func NewTimer(d time.Duration) Timer {
	if c := current.Load(); c != nil {
		return (*c).NewTimer(d)
	}
	return sysTimer{time.NewTimer(d)}
}

// MaxWait is how long ctx lets a caller wait: until its deadline, or for ever.
func MaxWait(ctx context.Context) time.Duration {
	if dl, ok := ctx.Deadline(); ok {
		return max(0, time.Until(dl))
	}
	return time.Duration(math.MaxInt64)
}

// Set makes c the clock (tests), and returns what puts the time package's back.
func Set(c Clock) (restore func()) {
	current.Store(&c)
	return func() { current.Store(nil) }
}

// System is the time package's Clock.
var System Clock = system{}

type system struct{}

func (system) Now() time.Time                 { return time.Now() }
func (system) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }
