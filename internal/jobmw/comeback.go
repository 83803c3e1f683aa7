package jobmw

import (
	"slices"
	"sync"
	"time"
)

// ComeBack learns how late the queue brings a handed-back job (asynq: retried or
// requeued; River: snoozed) to the middleware after it was due, and from that how much
// earlier than its slot to make it due.
//
// A handed-back job comes back no sooner than its queue's server looks for due jobs
// (asynq's check intervals, River's fetch poll), and then the middleware's script call
// follows. On an idle host that is the interval and a few ms; on a busy one each step
// waits for a CPU, and a return can come seconds after it was due. A job back after
// its slot loses it (and its place in line). So the middleware records, for each job
// it hands back, when it is due, and when the job comes back to it, how late that was;
// it makes the next jobs due earlier by a high percentile of the recent lateness
// (comeBackPercentile of the last comeBackSamples), never less than the interval and
// 20ms, nor more than half a second above that: a longer margin keeps more jobs asleep
// in the middleware at once, and past MaxSleepingWorkers a returning job is handed
// back again. A job returning to another process of the fleet is not seen: each
// process learns from its own.
//
// The zero ComeBack is ready to use.
type ComeBack struct {
	mu      sync.Mutex
	due     map[string]time.Time // booking ID → when it is due (wall clock)
	slot    map[string]booked    // booking ID → its booking (this process's clock)
	samples []time.Duration      // the last lateness values, a ring
	next    int
	margin  time.Duration // 0: not learned yet
}

const (
	// comeBackMargin is the least extra time a handed-back job is made due before its
	// slot, beyond the interval: for the Redis calls of the server's fetch and the
	// script's.
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
)

// maxRemembered bounds the hand-backs remembered.
const maxRemembered = 100000

// booked is a booking of a handed-back job: its limiter's key, and its slot.
type booked struct {
	key  string
	slot time.Time
}

// HandedBack records that the job booked under id on key, its slot at slot (this
// process's clock), is due again at due (the wall clock, as the queue keeps it).
func (cb *ComeBack) HandedBack(id, key string, slot, due time.Time) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.due == nil || len(cb.due) >= maxRemembered {
		cb.due = map[string]time.Time{}
		cb.slot = map[string]booked{}
	}
	cb.slot[id] = booked{key, slot}
	cb.due[id] = due.Round(0)
}

// Returned notes that the job booked under id came back now, if this process handed
// it back, and learns from how late that was.
func (cb *ComeBack) Returned(id string, now time.Time) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	due, ok := cb.due[id]
	if !ok {
		return
	}
	delete(cb.due, id)
	delete(cb.slot, id)
	late := now.Round(0).Sub(due) // wall clock: due has no monotonic reading
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

// SlotIn returns how long from now until the slot of the booking on key this process
// handed the job booked under id back with, if it did (and the job has not returned
// since).
func (cb *ComeBack) SlotIn(id, key string, now time.Time) (time.Duration, bool) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	b, ok := cb.slot[id]
	return b.slot.Sub(now), ok && b.key == key
}

// Early returns how much before its slot a handed-back job is made due, given how
// late the queue may bring a due job (interval: asynq's check intervals, River's poll
// interval): the learned lateness and comeBackMargin, between the interval and
// comeBackMargin and half a second more.
func (cb *ComeBack) Early(interval time.Duration) time.Duration {
	cb.mu.Lock()
	learned := cb.margin
	cb.mu.Unlock()
	least := interval + comeBackMargin
	return min(max(learned+comeBackMargin, least), least+comeBackMaxExtra)
}
