package jobmw

import "sync/atomic"

// Sleepers bounds the jobs asleep in a Setup's middlewares at once: a job takes a
// place while the bound leaves one (TrySleep) and gives it back (Release); one that
// cannot be handed back sleeps past the bound (SleepAnyway), counted all the same.
type Sleepers struct {
	Bound    atomic.Int64 // jobs that may sleep at once
	sleeping atomic.Int64
	peak     atomic.Int64
}

// TrySleep takes a place among the jobs asleep, if the bound leaves one.
func (s *Sleepers) TrySleep() bool {
	for {
		n := s.sleeping.Load()
		if n >= s.Bound.Load() {
			return false
		}
		if s.sleeping.CompareAndSwap(n, n+1) {
			s.raisePeak(n + 1)
			return true
		}
	}
}

// SleepAnyway counts a job asleep past the bound.
func (s *Sleepers) SleepAnyway() { s.raisePeak(s.sleeping.Add(1)) }

// Release gives a place back.
func (s *Sleepers) Release() { s.sleeping.Add(-1) }

// Full reports whether as many jobs as the bound allows sleep now.
func (s *Sleepers) Full() bool { return s.sleeping.Load() >= s.Bound.Load() }

// Sleeping and Peak return how many jobs sleep now, and the most that have at once.
func (s *Sleepers) Sleeping() int { return int(s.sleeping.Load()) }
func (s *Sleepers) Peak() int     { return int(s.peak.Load()) }

func (s *Sleepers) raisePeak(n int64) {
	for p := s.peak.Load(); n > p && !s.peak.CompareAndSwap(p, n); p = s.peak.Load() {
	}
}
