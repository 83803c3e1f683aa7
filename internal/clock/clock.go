// Package clock is the time seam of throttle and waiter: what Go code reads to know
// when a booking is due, and the timers it sleeps on. Production code uses System;
// tests replace it. It is internal so that it is not part of the API.
package clock

import "time"

// Clock is the Go side's view of time.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer the waiters use.
type Timer interface {
	C() <-chan time.Time
	Stop() bool
}

// System is the Clock of the time package.
var System Clock = system{}

type system struct{}

func (system) Now() time.Time { return time.Now() }

func (system) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (t sysTimer) C() <-chan time.Time { return t.t.C }
func (t sysTimer) Stop() bool          { return t.t.Stop() }
