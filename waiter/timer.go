package waiter

import "time"

// Clock is the waiter's view of time: what it reads to know when a booking is due and
// the timers it sleeps on. Tests replace it; SystemClock is the real one.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the waiter uses.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// SystemClock is the Clock of the time package.
var SystemClock Clock = systemClock{}

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

func (systemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }
