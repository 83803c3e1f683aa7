package asynqmw_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// A last attempt whose deadline leaves it too little time to sleep for its permit:
// with Requeue it is handed back as a copy that runs once, later, and nothing is
// archived or failed; without Requeue asynq archives it (the case Requeue exists for).
// HandlerTime, not a short Timeout, makes the deadline too close, so that a loaded
// host cannot make the copy miss its own deadline.
func TestRequeueWhenDeadlineIsNear(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tasks", throttle.PerSecond(10))
		c := newCounters()
		pick := bookingFirst(t, lim, 2) // the next permit 2 s away
		// The tasks' deadlines are 10 s away, and the handler needs all but 300ms of it.
		opts := append(fleetOpts(4), asynqmw.MaxInlineWait(300*time.Millisecond), asynqmw.HandlerTime(9700*time.Millisecond))
		f.start(f.serverConfig(4), f.handler(nil),
			asynqmw.ThrottleFunc(pick, append(opts, asynqmw.Requeue(b.Client), asynqmw.WithHooks(c.hooks()))...))
		plain := newFleet(t, b) // the same, without Requeue, on a queue of its own
		plain.start(plain.serverConfig(4), plain.handler(nil), asynqmw.ThrottleFunc(pick, opts...))

		orig := f.enqueue("req", asynq.MaxRetry(0), asynq.Timeout(10*time.Second), asynq.Retention(time.Minute))
		plain.enqueue("plain", asynq.MaxRetry(0), asynq.Timeout(10*time.Second))
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 1 })

		f.ranOnce(qi, "req")
		// It ran as a copy: "<id>~r1", or "~r2"... if the copy came back early (asynq
		// keeps whole seconds) and was requeued again.
		ran := f.runs.getTaskIDs("req")
		if len(ran) != 1 || !strings.HasPrefix(ran[0], orig.ID+"~r") {
			t.Fatalf("requeued task ran as %v, want a copy %s~r<n>", ran, orig.ID)
		}
		if got := get(c, c.requeued, "req"); got < 1 {
			t.Errorf("requeued %d times, want at least 1", got)
		}
		if _, err := f.insp.GetTaskInfo(f.queue, orig.ID); !errors.Is(err, asynq.ErrTaskNotFound) {
			t.Errorf("original task %s: GetTaskInfo error %v, want ErrTaskNotFound (revoked)", orig.ID, err)
		}
		cp, err := f.insp.GetTaskInfo(f.queue, ran[0])
		if err != nil {
			t.Fatalf("copy: %v", err)
		}
		if cp.State != asynq.TaskStateCompleted || cp.Timeout != 10*time.Second || cp.MaxRetry != 0 || cp.Retention != time.Minute {
			t.Errorf("copy: state %v, timeout %v, max retry %d, retention %v; want completed, 10s, 0, 1m",
				cp.State, cp.Timeout, cp.MaxRetry, cp.Retention)
		}

		pq := plain.waitIdle(idleLimit, nil)
		if pq.Archived != 1 || plain.runs.total() != 0 {
			t.Errorf("without Requeue: archived %d, runs %d; want 1 archived, 0 runs", pq.Archived, plain.runs.total())
		}
	})
}

// With the default setup (New), a last attempt whose permit is seconds away is
// requeued as a copy, and the copy runs on the original's booking: one permit and two
// limiter calls for the task, nothing archived, and it runs no earlier than its slot.
func TestLastAttemptCarriesItsBooking(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		lim := f.limiter("carry", throttle.PerSecond(10))
		book(t, lim, 3) // the next permit 3 s away
		booked := grants.Total()
		jt := asynqmw.New(b.Client)
		cfg := f.serverConfig(4)
		cfg.IsFailure, cfg.RetryDelayFunc = nil, nil
		cfg.DelayedTaskCheckInterval, cfg.TaskCheckInterval = 0, 0
		start := time.Now()
		f.start(jt.Config(cfg), f.handler(nil), jt.Throttle(lim))
		orig := f.enqueue("last", asynq.MaxRetry(0))
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 1 })

		f.ranOnce(qi, "last")
		ran := f.runs.getTaskIDs("last")
		if len(ran) != 1 || ran[0] != orig.ID+"~r1" {
			t.Errorf("ran as %v, want the copy %s~r1", ran, orig.ID)
		}
		if el := time.Since(start); el < 2500*time.Millisecond {
			t.Errorf("ran after %v, before its slot about 3s on", el)
		}
		// A copy that comes back after its slot has passed books anew, by design (the
		// slot is gone; its permit is not used): a starved machine can bring it back
		// that late (asynq forwards it, a worker dequeues it, the handler starts).
		// That is judged by the claim call's send time against the slot, both on this
		// machine's clock; the checks below are for a copy back in time.
		if list := grants.List(); len(list) == booked+2 && !list[booked+1].Sent.Before(list[booked].At) {
			t.Logf("the copy came back %v after its slot and booked anew", list[booked+1].Sent.Sub(list[booked].At))
			return
		}
		if got := grants.Total() - booked; got != 1 {
			t.Errorf("permits granted for the task: %d, want 1 (the copy used the original's booking)", got)
		}
		key := "{" + b.Prefix + "carry}:sw"
		if got := grants.ByKey()[key].Calls() - 3; got != 2 {
			t.Errorf("limiter calls for the task: %d, want 2 (book, then claim)", got)
		}
		if st := jt.Stats(); st.HandedBack != 1 || st.Kept != 1 {
			t.Errorf("stats %+v, want 1 hand-back and 1 return that kept its booking", st)
		}
	})
}
