package asynqmw_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jobthrottle/jobthrottle/asynqmw"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/throttle"
	"github.com/redis/go-redis/v9"
)

// A last attempt whose deadline leaves it too little time to sleep for its permit is
// handed back as a copy that runs once, later, with the original's Timeout, Retention
// and one retry of its own (for its worker's death); the original is gone (not
// archived, not completed), and nothing is archived or failed. The handler time, not a short Timeout, makes the deadline too
// close, so that a loaded host cannot make the copy miss its own deadline.
func TestRequeueWhenDeadlineIsNear(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("tasks", throttle.PerSecond(10))
		c := newCounters()
		// The tasks' deadlines are 10 s away, and the handler needs all but 300ms of it.
		jt := asynqmw.New(b.Client, asynqmw.InlineWait(300*time.Millisecond), asynqmw.HandlerTime(9700*time.Millisecond), asynqmw.WithHooks(c.hooks()))
		f.run(jt, 4, f.handler(nil), jt.ThrottleFunc(bookingFirst(t, lim, 2))) // the next permit 2 s away

		kept := f.enqueue("kept", asynq.MaxRetry(0), asynq.Timeout(10*time.Second), asynq.Retention(time.Minute))
		plain := f.enqueue("plain", asynq.MaxRetry(0), asynq.Timeout(10*time.Second))
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 2 })

		f.ranOnce(qi, "kept", "plain")
		for _, tc := range []struct {
			id        string
			orig      *asynq.TaskInfo
			state     asynq.TaskState
			retention time.Duration
		}{
			{"kept", kept, asynq.TaskStateCompleted, time.Minute},
			{"plain", plain, 0, 0},
		} {
			// It ran as a copy: "<id>~r1", or "~r2"... if the copy came back early
			// (asynq keeps whole seconds) and was requeued again.
			ran := f.runs.getTaskIDs(tc.id)
			if len(ran) != 1 || !strings.HasPrefix(ran[0], tc.orig.ID+"~r") {
				t.Fatalf("requeued task %s ran as %v, want a copy %s~r<n>", tc.id, ran, tc.orig.ID)
			}
			if got := get(c, c.requeued, tc.id); got < 1 {
				t.Errorf("task %s requeued %d times, want at least 1", tc.id, got)
			}
			if _, err := f.insp.GetTaskInfo(f.queue, tc.orig.ID); !errors.Is(err, asynq.ErrTaskNotFound) {
				t.Errorf("original task %s: GetTaskInfo error %v, want ErrTaskNotFound", tc.orig.ID, err)
			}
			cp, err := f.insp.GetTaskInfo(f.queue, ran[0])
			if tc.retention == 0 {
				if !errors.Is(err, asynq.ErrTaskNotFound) {
					t.Errorf("copy %s of a task without retention: %+v, %v; want it gone", ran[0], cp, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("copy: %v", err)
			}
			if cp.State != tc.state || cp.Timeout != 10*time.Second || cp.MaxRetry != 1 || cp.Retention != tc.retention {
				t.Errorf("copy: state %v, timeout %v, max retry %d, retention %v; want %v, 10s, 1, %v",
					cp.State, cp.Timeout, cp.MaxRetry, cp.Retention, tc.state, tc.retention)
			}
		}
	})
}

// With the default setup (New), a last attempt whose permit is seconds away is
// requeued as a copy, and the copy runs on the original's booking: one permit and two
// limiter calls for the task, nothing archived, and it runs no earlier than its slot.
func TestLastAttemptCarriesItsBooking(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		grants := redistest.RecordGrants(b.Client)
		f := newFleet(t, b)
		lim := f.limiter("carry", throttle.PerSecond(10))
		// The next permit 5 s away: a task dequeued up to 3.5 s later (a loaded host
		// starting the server) still finds it too far to sleep for. Its slot is 5 s
		// after the first of these calls at the earliest.
		start := time.Now()
		book(t, lim, 5)
		booked, bookings := grants.Total(), len(grants.List())
		jt := asynqmw.New(b.Client)
		cfg := f.serverConfig(4)
		cfg.DelayedTaskCheckInterval, cfg.TaskCheckInterval = 0, 0
		f.start(jt.Config(cfg), f.handler(nil), jt.Throttle(lim))
		orig := f.enqueue("last", asynq.MaxRetry(0))
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= 1 })

		f.ranOnce(qi, "last")
		ran := f.runs.getTaskIDs("last")
		if len(ran) != 1 || ran[0] != orig.ID+"~r1" {
			t.Errorf("ran as %v, want the copy %s~r1", ran, orig.ID)
		}
		if el := time.Since(start); el < 4500*time.Millisecond {
			t.Errorf("ran after %v, before its slot about 5s on", el)
		}
		// A copy whose claim reaches Redis more than the grace (20ms) after its slot
		// books anew, by design (the slot is gone; its permit is not used): a starved
		// machine can bring it back that late (asynq forwards it, a worker dequeues it,
		// the call waits for a CPU). That is judged on Redis's clock, by when the
		// claim's script ran (its grant's At - Wait) against the slot; the checks below
		// are for a copy back in time.
		if list := grants.List(); len(list) == bookings+2 {
			if late := list[bookings+1].At.Add(-list[bookings+1].Wait).Sub(list[bookings].At); late > 20*time.Millisecond {
				t.Logf("the copy's claim ran %v after its slot and booked anew", late)
				return
			}
		}
		if got := grants.Total() - booked; got != 1 {
			t.Errorf("permits granted for the task: %d, want 1 (the copy used the original's booking)", got)
		}
		key := "{" + b.Prefix + "carry}:l"
		if got := grants.ByKey()[key].Calls() - 5; got != 2 {
			t.Errorf("limiter calls for the task: %d, want 2 (book, then claim)", got)
		}
		if st := jt.Stats(); st.HandedBack != 1 || st.Requeued != 1 || st.Kept != 1 {
			t.Errorf("stats %+v, want 1 hand-back (requeued) and 1 return that kept its booking", st)
		}
	})
}

// Normal throttling is quiet: 60 tasks at 10 a second, half of them on their last
// attempt (MaxRetry(0)), on a server logging at warn level, log no warning and no
// error, through asynq's Logger: a hand-back is not an error to asynq (IsFailure), and
// a last attempt's original ends without one (see finish). Every task runs once, none
// fails or is archived; asynq's processed count is the runs plus one per copy (the
// original of each copy is deleted as done, the copy then counted when it runs).
func TestLastAttemptsAreQuiet(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		const n = 60
		f := newFleet(t, b)
		lim := f.limiter("quiet", throttle.PerSecond(10))
		log := &logRecorder{testLogger: testLogger{t}}
		jt := asynqmw.New(b.Client)
		cfg := f.serverConfig(10)
		cfg.LogLevel, cfg.Logger = asynq.WarnLevel, log
		f.start(jt.Config(cfg), f.handler(nil), jt.Throttle(lim))
		final, retrying := ids("final", n/2), ids("retrying", n/2)
		for i := range final {
			f.enqueue(final[i], asynq.MaxRetry(0))
			f.enqueue(retrying[i], asynq.MaxRetry(3))
		}
		qi := f.waitIdle(idleLimit, func() bool { return f.runs.total() >= n })
		f.stop()

		f.ranOnce(qi, append(final, retrying...)...)
		st := jt.Stats()
		if st.Requeued == 0 || st.HandedBack <= st.Requeued {
			t.Errorf("stats %+v: want last attempts handed back as copies, and others through asynq's retry", st)
		}
		if lines := log.all(); len(lines) != 0 {
			t.Errorf("asynq logged %d warnings and errors, want none: %q", len(lines), lines)
		}
		if got, want := f.info().ProcessedTotal, n+int(st.Requeued); got != want {
			t.Errorf("asynq's processed total %d, want %d (%d runs and %d copies' originals)", got, want, n, st.Requeued)
		}
		redistest.Figure(t, "%s: %d tasks (%d on their last attempt) at 10/s: %d hand-backs (%d as copies), %d warnings or errors logged",
			b.Kind, n, n/2, st.HandedBack, st.Requeued, len(log.all()))
	})
}

// A last attempt's copy has a retry of its own only for its worker's death: an error
// of its handler archives it at once, and a copy asynq retries because its handler
// overran its timeout is archived without running again, as the original, with no
// retry left, would have been.
func TestCopyFailuresAreFinal(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		f := newFleet(t, b)
		lim := f.limiter("copies", throttle.PerSecond(100))
		jt := asynqmw.New(b.Client)
		fail := func(ctx context.Context, id string, _ int) error {
			if id == "timeout" {
				<-ctx.Done() // past its 1s timeout: asynq retries it, counting a failure
			}
			return errBoom
		}
		f.run(jt, 4, f.handler(fail), jt.Throttle(lim))
		for _, id := range []string{"error", "timeout"} {
			cp := asynq.NewTaskWithHeaders("job", []byte(id), map[string]string{asynqmw.CopyOf: id + "-original"},
				asynq.Queue(f.queue), asynq.MaxRetry(1), asynq.Timeout(time.Second))
			if _, err := f.client.Enqueue(cp); err != nil {
				t.Fatal(err)
			}
		}
		f.waitIdle(idleLimit, nil)
		for _, id := range []string{"error", "timeout"} {
			if got := f.runs.get(id); len(got) != 1 {
				t.Errorf("copy %s: retry counts of its runs %v, want one run", id, got)
			}
		}
		arch, err := f.insp.ListArchivedTasks(f.queue)
		if err != nil {
			t.Fatal(err)
		}
		last := map[string]string{}
		for _, a := range arch {
			last[string(a.Payload)] = a.LastErr
		}
		if len(arch) != 2 || last["error"] != errBoom.Error() || !strings.Contains(last["timeout"], "failed on its last attempt") {
			t.Errorf("archived %q, want both copies, the first with its handler's error, the second as a failed last attempt", last)
		}
	})
}

// A worker process killed (-9) while tasks on their last attempt wait in its
// middleware for their permits loses none of them: a last attempt never sleeps in its
// worker, its copy does, with a retry of its own, and asynq's recoverer retries a
// copy whose worker died instead of archiving it. Six MaxRetry(0) tasks of a limit of
// one a second go to a worker process, which is killed as soon as one sleeps; asynq's
// recoverer, on another server, then finds the dead worker's tasks (the test makes
// their leases look expired 60 s ago, as they would be a minute after the kill, rather
// than waiting that minute). Every task runs, none is archived.
func TestLastAttemptSurvivesItsWorkersDeath(t *testing.T) {
	eachBackend(t, func(t *testing.T, b *redistest.Backend) {
		const (
			n    = 6
			rate = 1
		)
		f := newFleet(t, b)
		w := startWorker(t, b, f.queue, "killed", rate)
		for i := range n {
			f.enqueue(fmt.Sprint("last-", i), asynq.MaxRetry(0))
		}
		deadline := time.After(idleLimit)
		for asleep := 0; asleep == 0; {
			select {
			case asleep = <-w.sleeping:
			case <-deadline:
				t.Fatalf("no task slept in the worker within %v", idleLimit)
			}
		}
		if err := w.cmd.Process.Kill(); err != nil {
			t.Fatal(err)
		}
		_, _ = w.cmd.Process.Wait()
		killed := time.Now()
		ranBefore := len(runsOf(t, b.Client, b.Prefix))

		// asynq's lease set of the queue (internal/base.LeaseKey): task ID → when its
		// lease ends, Unix seconds; the recoverer takes those that ended 30 s ago.
		ctx := context.Background()
		leases := "asynq:{" + f.queue + "}:lease"
		active, err := b.Client.ZRange(ctx, leases, 0, -1).Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, id := range active {
			if err := b.Client.ZAddXX(ctx, leases, redis.Z{Score: float64(killed.Add(-time.Minute).Unix()), Member: id}).Err(); err != nil {
				t.Fatal(err)
			}
		}
		lim := f.limiter("killed", throttle.PerSecond(rate))
		jt := asynqmw.New(b.Client)
		f.start(jt.Config(workerConfig(f.queue, 10, testLogger{t})), recordRun(b.Client, b.Prefix), jt.Throttle(lim))
		qi := f.waitIdle(idleLimit, func() bool { return len(runsOf(t, b.Client, b.Prefix)) >= n })

		runs := runsOf(t, b.Client, b.Prefix)
		twice := 0
		for i := range n {
			id := fmt.Sprint("last-", i)
			if len(runs[id]) == 0 {
				t.Errorf("task %s never ran", id)
			}
			twice += max(len(runs[id])-1, 0)
		}
		arch, err := f.insp.ListArchivedTasks(f.queue)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range arch {
			t.Errorf("archived %s (%s, retried %d of %d): %s", a.Payload, a.ID, a.Retried, a.MaxRetry, a.LastErr)
		}
		redistest.Figure(t, "%s: worker killed -9 with %d MaxRetry(0) tasks of 1/s, %d run before the kill, %d in flight at it: lost %d, archived %d, run twice %d",
			b.Kind, n, ranBefore, len(active), n-len(runs), qi.Archived, twice)
	})
}
