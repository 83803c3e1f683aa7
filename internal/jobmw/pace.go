package jobmw

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Pacer keeps the starts of one process's jobs within each limit on its own clock.
//
// Redis never lets more than a limit's Rate permits take effect in any window of its
// Period, but a job starts when its sleep ends, measured from when the script's reply
// arrived: a start lags its permit by the reply's way back plus timer and scheduling
// delays (Δ, up to about 100ms on a busy host). Algorithms that grant a period's
// permits at once (the sliding window, the fixed window) put whole batches exactly a
// Period apart, so a batch that starts late by more than the next one shares a window
// of one Period with it: up to twice the Rate. A job back after its slot that runs on
// its passed permit (within Limit.Grace) lags it more still. The pacer delays a start,
// by at most about Δ (and that lateness), until it is at least a Period after the
// start Rate places before it, so that a process's starts through one limiter never
// exceed Rate in any window of Period.
//
// What it bounds is the starts as it counts them: the time it reads, under its lock,
// when it lets a job go on to its handler (the middlewares' Hooks.Started reports it),
// on this process's monotonic clock. Anything later, a handler's own reading of the
// clock among it, lags that by a function call, or by as long as the goroutine is
// descheduled; an earlier start whose reading lagged more than a later one's puts one
// more in that reading's window. Nothing in a middleware can bound what a handler
// reads after it is called. Across processes the bound is Redis's (the starts of
// several processes may lag differently): Rate in any window of Period − Δ, Δ being
// how much more one process's starts lag their permits than another's; a process
// whose starts lagged keeps its next batches at least as late while they follow one
// another a Period apart (the pacer spaces them from its own).
//
// The zero Pacer is ready to use. How a job waits for it (a run slot given up while
// it sleeps, a job handed back rather than delayed) is each middleware's.
type Pacer struct {
	mu   sync.Mutex
	keys map[string]*startLog
}

// startLog is the last starts through one limiter, oldest first.
type startLog struct {
	times []time.Time
}

// maxPaced bounds what the pacer keeps: limiters (keys) and starts per limiter. A
// limit of a higher Rate is not paced.
const (
	maxPacedKeys  = 10000
	maxPacedRate  = 10000
	maxPacedDelay = time.Second
)

// Wait counts a start now and returns 0 and the time it counted if that keeps this
// process's starts through li within each limit; otherwise it returns how long to
// wait before asking again.
//
// clock is read under the pacer's lock, so that the starts are counted in order.
func (p *Pacer) Wait(li Limit, clock func() time.Time) (time.Duration, time.Time) {
	if li.Paced == nil {
		return 0, clock() // a bucket may grant Burst at once: more than Rate in a Period
	}
	keep := 0
	for _, l := range li.Paced {
		keep = max(keep, l.Rate)
	}
	k := li.Key + "\x00" + li.Desc
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.keys == nil || len(p.keys) >= maxPacedKeys {
		p.keys = map[string]*startLog{}
	}
	s := p.keys[k]
	if s == nil {
		s = &startLog{}
		p.keys[k] = s
	}
	now := clock()
	at := now
	for _, l := range li.Paced {
		if n := len(s.times); n >= l.Rate {
			at = Later(at, s.times[n-l.Rate].Add(l.Period))
		}
	}
	if d := at.Sub(now); d > 0 && d <= maxPacedDelay {
		return d, time.Time{}
	}
	// now, or a wait too long to be a lag (a clock jump, permits from before a pause):
	// never stall
	s.times = append(s.times, now)
	if len(s.times) > keep {
		s.times = slices.Delete(s.times, 0, len(s.times)-keep)
	}
	return 0, now
}

// Later returns the later of a and b.
func Later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// Sleep waits d or until ctx ends, and returns ctx.Err() if it ended first.
func Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
