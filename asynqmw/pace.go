package asynqmw

import (
	"context"
	"slices"
	"sync"
	"time"
)

// pacer keeps the handler starts of one process within each limit on its own clock.
//
// Redis never lets more than a limit's Rate permits take effect in any window of its
// Period, but a handler starts when its task's sleep ends, measured from when the
// script's reply arrived: a start lags its permit by the reply's way back plus timer
// and scheduling delays (Δ, up to about 100ms on a busy host). Algorithms that
// grant a period's permits at once (the sliding window, the fixed window) put whole
// batches exactly a Period apart, so a batch that starts late by more than the next
// one shares a window of one Period with it: up to twice the Rate. A task back after
// its slot that runs on its passed permit (within lateGrace) lags it a little more. The
// pacer delays a start, by at most about Δ (and that lateness), until it is at least a
// Period after the start Rate places before it, so that a process's starts through one
// limiter never exceed Rate in any window of Period.
//
// What it bounds is the starts as it counts them: the time it reads, under its lock,
// when it lets a task go on to its handler (Hooks.Started reports it), on this
// process's monotonic clock. Anything later, a handler's own reading of the clock
// among it, lags that by a function call, or by as long as the goroutine is
// descheduled; an earlier start whose reading lagged
// more than a later one's puts one more in that reading's window. Nothing in the
// middleware can bound what a handler reads after it is called. Across processes the
// bound is Redis's (the starts of several processes may lag differently): Rate in any
// window of Period − Δ, Δ being how much more one process's starts lag their permits
// than another's; a process whose starts lagged keeps its next batches at least as
// late while they follow one another a Period apart (the pacer spaces them from its
// own).
type pacer struct {
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

// start returns when the task may start through li (at once, mostly), with the time
// it counted as the task's start; or ctx.Err() if ctx ends first. With sleep false it
// does not wait: it returns how long the task would have to (0 and the start counted
// when it may go at once).
func (p *pacer) start(ctx context.Context, li limitInfo, sleep bool) (time.Time, time.Duration, error) {
	for {
		d, at := p.wait(li, time.Now)
		if d == 0 {
			return at, 0, nil
		}
		if !sleep {
			return time.Time{}, d, nil
		}
		if err := sleepFor(ctx, d); err != nil {
			return time.Time{}, 0, err
		}
	}
}

// wait counts a start now and returns 0 and the time it counted if that keeps this
// process's starts through lim within each limit; otherwise it returns how long to
// wait before asking again.
//
// clock is read under the pacer's lock, so that the starts are counted in order.
func (p *pacer) wait(li limitInfo, clock func() time.Time) (time.Duration, time.Time) {
	if li.paced == nil {
		return 0, clock() // a bucket may grant Burst at once: more than Rate in a Period
	}
	keep := 0
	for _, l := range li.paced {
		keep = max(keep, l.rate)
	}
	k := li.key + "\x00" + li.desc
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
	for _, l := range li.paced {
		if n := len(s.times); n >= l.rate {
			at = later(at, s.times[n-l.rate].Add(l.period))
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

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sleepFor waits d or until ctx ends, and returns ctx.Err() if it ended first.
func sleepFor(ctx context.Context, d time.Duration) error {
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
