package asynqmw

import (
	"slices"
	"sync"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/jobmw"
)

// comeBack learns how late the server brings a handed-back task to the middleware
// after asynq made it due, and from that how much earlier than its slot to make it due.
//
// asynq makes a retried (or requeued) task due at its retry time truncated to whole
// seconds; the forwarder moves it to its queue within DelayedTaskCheckInterval, a
// worker dequeues it within TaskCheckInterval, and the middleware's script call
// follows. On an idle host that is the check intervals and a few ms; on a busy one
// the forwarder, the dequeue and the call each wait for a CPU, and a return can come
// seconds after it was due. A task back after its slot loses it (and its place in
// line). So the middleware records, for each task it hands back, when asynq makes it
// due, and when the task comes back to it, how late that was; it makes the next tasks
// due earlier by a high percentile of the recent lateness (comeBackPercentile of the
// last comeBackSamples), never less than the check intervals and 20ms, nor more than
// half a second above that: a longer margin keeps more tasks asleep in the middleware
// at once, and past MaxSleepingWorkers a returning task bounces. A task returning to
// another server of the fleet is not seen: each server learns from its own.
type comeBack struct {
	mu      sync.Mutex
	due     map[string]time.Time // booking ID → when asynq makes it due (wall clock)
	slot    map[string]booked    // booking ID → its booking (this process's clock)
	samples []time.Duration      // the last lateness values, a ring
	next    int
	margin  time.Duration // 0: not learned yet
}

const (
	// comeBackMargin is the least extra time a handed-back task is made due before its
	// slot, beyond the check intervals: for the Redis calls of the forward and the
	// dequeue.
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
	// lateGrace bounds how long after its slot a task that comes back may still run on
	// it (at most a quarter of the limit's shortest period): about the time its call
	// takes to reach Redis. A later one books anew, its passed permit unused: started on
	// it, it would lag its permit by as much, and a start that lags its permit more
	// than another process's next ones puts more than the limit's Rate in a window of
	// its Period across processes (see pacer).
	lateGrace = 20 * time.Millisecond
)

// maxRemembered bounds the hand-backs remembered.
const maxRemembered = 100000

// booked is a booking of a handed-back task: its limiter's key, and its slot.
type booked struct {
	key  string
	slot time.Time
}

// handedBack records that the task booked under id on key, its slot wait from now, is
// due again after back.
func (cb *comeBack) handedBack(id, key string, now time.Time, back, wait time.Duration) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	if cb.due == nil || len(cb.due) >= maxRemembered {
		cb.due = map[string]time.Time{}
		cb.slot = map[string]booked{}
	}
	cb.slot[id] = booked{key, now.Add(wait)}
	// asynq stores the retry time in whole seconds, truncated; one truncated into the
	// past is due at once, not then (else a short hand-back would read as late by up to
	// a second, and a longer margin would make more tasks bounce: a feedback loop)
	cb.due[id] = jobmw.Later(time.Unix(now.Add(back).Unix(), 0), now.Round(0))
}

// returned notes that the task booked under id came back now, if this process handed
// it back, and learns from how late that was.
func (cb *comeBack) returned(id string, now time.Time) {
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

// slotIn returns how long from now until the slot of the booking on key this process
// handed the task booked under id back with, if it did (and the task has not
// returned since).
func (cb *comeBack) slotIn(id, key string, now time.Time) (time.Duration, bool) {
	cb.mu.Lock()
	defer cb.mu.Unlock()
	b, ok := cb.slot[id]
	return b.slot.Sub(now), ok && b.key == key
}

// early returns how much before its slot a handed-back task is made due, given how
// late the server may bring a due task (the check intervals): the learned lateness
// and comeBackMargin, between the check intervals and comeBackMargin and a second
// more.
func (cb *comeBack) early(interval time.Duration) time.Duration {
	cb.mu.Lock()
	learned := cb.margin
	cb.mu.Unlock()
	least := interval + comeBackMargin
	return min(max(learned+comeBackMargin, least), least+comeBackMaxExtra)
}
