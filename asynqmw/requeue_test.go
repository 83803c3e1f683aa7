package asynqmw_test

import (
	"errors"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
)

// A last attempt whose deadline comes before its permit: with Requeue it is handed
// back as a copy that runs once, later, and nothing is archived or failed; without
// Requeue asynq archives it (the case Requeue exists for).
func TestRequeueWhenDeadlineIsNear(t *testing.T) {
	redistest.EachRealTime(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tasks", throttle.PerSecond(10))
		c := newCounters()
		pick := bookingFirst(t, lim, 3) // the next permit 3 s away; the tasks' deadlines 2 s
		f.start(f.serverConfig(4), f.handler(nil), asynqmw.ThrottleFunc(pick,
			asynqmw.MaxInlineWait(300*time.Millisecond), asynqmw.Requeue(b.Client), asynqmw.WithHooks(c.hooks())))
		plain := newFleet(t, b) // the same, without Requeue, on a queue of its own
		plain.start(plain.serverConfig(4), plain.handler(nil), asynqmw.ThrottleFunc(pick, asynqmw.MaxInlineWait(300*time.Millisecond)))

		orig := f.enqueue("req", asynq.MaxRetry(0), asynq.Timeout(2*time.Second), asynq.Retention(time.Minute))
		plain.enqueue("plain", asynq.MaxRetry(0), asynq.Timeout(2*time.Second))
		qi := f.waitIdle(15*time.Second, func() bool { return f.runs.total() >= 1 })

		f.ranOnce(qi, "req")
		if got, want := f.runs.getTaskIDs("req"), orig.ID+"~r1"; len(got) != 1 || got[0] != want {
			t.Errorf("requeued task ran as %v, want [%s]", got, want)
		}
		if got := get(c, c.requeued, "req"); got != 1 {
			t.Errorf("requeued %d times, want 1", got)
		}
		if _, err := f.insp.GetTaskInfo(f.queue, orig.ID); !errors.Is(err, asynq.ErrTaskNotFound) {
			t.Errorf("original task %s: GetTaskInfo error %v, want ErrTaskNotFound (revoked)", orig.ID, err)
		}
		cp, err := f.insp.GetTaskInfo(f.queue, orig.ID+"~r1")
		if err != nil {
			t.Fatalf("copy: %v", err)
		}
		if cp.State != asynq.TaskStateCompleted || cp.Timeout != 2*time.Second || cp.MaxRetry != 0 || cp.Retention != time.Minute {
			t.Errorf("copy: state %v, timeout %v, max retry %d, retention %v; want completed, 2s, 0, 1m",
				cp.State, cp.Timeout, cp.MaxRetry, cp.Retention)
		}

		pq := plain.waitIdle(5*time.Second, nil)
		if pq.Archived != 1 || plain.runs.total() != 0 {
			t.Errorf("without Requeue: archived %d, runs %d; want 1 archived, 0 runs", pq.Archived, plain.runs.total())
		}
	})
}
