package rivermw

import (
	"slices"
	"sync"
	"time"
)

// comeBack learns how late River brings a snoozed job back to the middleware after it
// was due, and from that how much earlier than its slot to make it due.
//
// River makes a snoozed job due at the client's clock plus the snooze; a job due
// within its scheduler's interval (5 s) is made available at once, a later one by the
// scheduler, which looks that interval ahead; either way it is fetched by the first
// fetch of its queue after it is due: the next poll (FetchPollInterval, a second by
// default, and up to a tenth more of jitter), or sooner when an insert or a freed
// worker makes the client fetch. Then the middleware's script call follows. On a busy
// host the fetch, the database and the call each wait for a CPU, and every worker of
// the queue may be busy, so a return can come seconds after it was due. A job back
// after its slot loses it (and its place in line). So the middleware records, for each
// job it snoozes, when it is due, and when the job comes back to it, how late that
// was; it makes the next jobs due earlier by a high percentile of the recent lateness
// (comeBackPercentile of the last comeBackSamples), never less than the queue's poll
// interval and 20ms, nor more than half a second above that: a longer margin keeps
// more jobs asleep in the middleware at once, and past MaxSleepingWorkers a returning
// job is snoozed again. A job returning to another client is not seen: each client
// learns from its own.
type comeBack struct {
	mu      sync.Mutex
	due     map[string]time.Time // booking ID → when it is due (wall clock)
	slot    map[string]booked    // booking ID → its booking (this process's clock)
	samples []time.Duration      // the last lateness values, a ring
	next    int
	margin  time.Duration // 0: not learned yet
}

const (
	// comeBackMargin is the least extra time a snoozed job is made due before its
	// slot, beyond the poll interval: for the fetch's and the script's calls.
	comeBackMargin = 20 * time.Millisecond
	// comeBackMaxExtra bounds how much the learned margin may exceed the least one.
	comeBackMaxExtra = 500 * time.Millisecond
	// comeBackSamples is how many recent returns the margin is learned from, and
	// comeBackMinSamples how many it needs before it moves from the least margin.
	comeBackSamples    = 32
	comeBackMinSamples = 5
	// comeBackPercentile is the share of recent returns the margin would have
	// brought back in time.
	comeBackPercentile = 0.9
	// lateGrace bounds how long after its slot a job that comes back may still run on
	// it (see Throttle): at most a quarter of the limit's shortest period. The pacer
	// keeps each process's starts within the limit; across processes it widens the
	// lag of one client's starts behind another's (the Δ of the pacer's fleet-wide
	// bound) by up to this much.
	lateGrace = 250 * time.Millisecond
)

// maxRemembered bounds the snoozes remembered.
const maxRemembered = 100000

// booked is a booking of a snoozed job: its limiter's key, and its slot.
type booked struct {
	key  string
	slot time.Time
}

// snoozed records that the job booked under id on key, its slot wait from now, is due
// again after back.
func (cb *comeBack) snoozed(id, key string, now time.Time, back, wait time.Duration) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.due == nil || len(cb.due) >= maxRemembered {
		cb.due = map[string]time.Time{}
		cb.slot = map[string]booked{}
	}
	cb.slot[id] = booked{key, now.Add(wait)}
	cb.due[id] = now.Add(back).Round(0)
}

// returned notes that the job booked under id came back now, if this process snoozed
// it, and learns from how late that was.
func (cb *comeBack) returned(id string, now time.Time) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	due, ok := cb.due[id]
	if !ok {
		return
	}
	delete(cb.due, id)
	delete(cb.slot, id)
	late := now.Round(0).Sub(due) // wall clock: River keeps due times on the wall clock
	if len(cb.samples) < comeBackSamples {
		cb.samples = append(cb.samples, late)
	} else {
		cb.samples[cb.next] = late
		cb.next = (cb.next + 1) % comeBackSamples
	}
	if len(cb.samples) < comeBackMinSamples {
		return
	}
	s := slices.Clone(cb.samples)
	slices.Sort(s)
	cb.margin = s[int(comeBackPercentile*float64(len(s)-1)+0.5)]
}

// slotIn returns how long from now until the slot of the booking on key this process
// snoozed the job booked under id with, if it did (and the job has not returned
// since).
func (cb *comeBack) slotIn(id, key string, now time.Time) (time.Duration, bool) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	b, ok := cb.slot[id]
	return b.slot.Sub(now), ok && b.key == key
}

// early returns how much before its slot a snoozed job is made due, given how late
// River may bring a due job (its queue's poll interval): the learned lateness and
// comeBackMargin, between the interval and comeBackMargin and half a second more.
func (cb *comeBack) early(interval time.Duration) time.Duration {
	cb.mu.Lock()
	learned := cb.margin
	cb.mu.Unlock()
	least := interval + comeBackMargin
	return min(max(learned+comeBackMargin, least), least+comeBackMaxExtra)
}
