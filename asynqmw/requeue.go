package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// requeuer hands a task on its last attempt back to its queue as a copy: asynq
// archives such a task on any error (see finish), so the retry path would lose it,
// and so would a sleep in its worker if the worker died (asynq's recoverer archives a
// last attempt whose lease expired).
//
// The copy has the original's type, payload, headers, queue, Timeout, Deadline and
// Retention, the ID "<id>~r1" (or its count raised), so an enqueue sent again adds no
// second copy, and the header copyOf naming the original's booking, which it finds.
// It has one retry of its own: not a last attempt, it sleeps for its slot and is
// handed back through asynq's retry like any task, and if its worker dies meanwhile
// asynq's recoverer retries it rather than archiving it. That retry is spent only so:
// an error of its handler archives it at once (finish), and a copy retried after its
// handler timed out or panicked is archived without running (spentCopy), as the
// original would have been. It does not keep a Unique lock or a Group.
type requeuer struct {
	client    *asynq.Client
	inspector *asynq.Inspector
}

// copyOf is the header of a last attempt's copy: the booking ID of the task it copies.
const copyOf = "jobthrottle-copy-of"

func newRequeuer(rdb redis.UniversalClient) *requeuer {
	return &requeuer{
		client:    asynq.NewClientFromRedisClient(rdb),
		inspector: asynq.NewInspectorFromRedisClient(rdb),
	}
}

// requeue enqueues a copy of t to run after te's delay and returns te, Requeued (see
// finish for what asynq then gets); or an error when the copy could not be enqueued.
func (r *requeuer) requeue(ctx context.Context, t *asynq.Task, a attempt, te *ThrottledError) error {
	queue, ok := asynq.GetQueueName(ctx)
	if !ok {
		return te
	}
	err := r.enqueueCopy(ctx, t, a, queue, te)
	if err != nil && ctx.Err() == nil {
		// once more, which also finds a copy whose enqueue ran though its reply was lost
		err = r.enqueueCopy(ctx, t, a, queue, te)
	}
	if err != nil {
		return fmt.Errorf("asynqmw: requeueing throttled task %s: %w", a.id, err)
	}
	te.Requeued = true
	return te
}

// enqueueCopy enqueues the copy of the attempt's task of queue; nil also when it is
// there.
func (r *requeuer) enqueueCopy(ctx context.Context, t *asynq.Task, a attempt, queue string, te *ThrottledError) error {
	info, err := r.inspector.GetTaskInfo(queue, a.id)
	if err != nil {
		return err
	}
	delay := retryDelay(te.RetryIn)
	if te.Booked {
		delay = te.back // the copy finds the original's booking: due just before it
	}
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.TaskID(nextCopyID(a.id)),
		asynq.MaxRetry(1),
		asynq.ProcessIn(delay),
	}
	if info.Timeout > 0 {
		opts = append(opts, asynq.Timeout(info.Timeout))
	}
	if !info.Deadline.IsZero() {
		opts = append(opts, asynq.Deadline(info.Deadline))
	}
	if info.Retention > 0 {
		opts = append(opts, asynq.Retention(info.Retention))
		te.retention = info.Retention
	}
	headers := maps.Clone(t.Headers())
	if headers == nil {
		headers = map[string]string{}
	}
	headers[copyOf] = a.booking
	cp := asynq.NewTaskWithHeaders(t.Type(), t.Payload(), headers, opts...)
	if _, err := r.client.EnqueueContext(ctx, cp); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return err
	}
	return nil
}

// spentCopy returns the error that archives a copy whose own retry was spent by its
// handler (a timeout, a deadline or a panic, which asynq retries without the
// middleware seeing the error), not by its worker's death: the task's retries were
// used up before the copy was made. nil for any other task, and for a copy whose
// last error asynq's inspector cannot tell: that one runs, as a last attempt.
func (c *config) spentCopy(ctx context.Context, a attempt) error {
	if !a.copy || !a.final || !a.handBack {
		return nil
	}
	queue, _ := asynq.GetQueueName(ctx)
	info, err := c.requeue.inspector.GetTaskInfo(queue, a.id)
	if err != nil || info.LastErr == "" || info.LastErr == asynq.ErrLeaseExpired.Error() {
		return nil
	}
	return lastAttempt{fmt.Errorf("asynqmw: %s failed on its last attempt: %s", a.id, info.LastErr)}
}

// nextCopyID returns the ID of the copy of task id: "<id>~r1", or "<base>~r<n+1>"
// for a copy "<base>~r<n>".
func nextCopyID(id string) string {
	if i := strings.LastIndex(id, "~r"); i >= 0 {
		if n, err := strconv.Atoi(id[i+2:]); err == nil && n > 0 {
			return id[:i] + "~r" + strconv.Itoa(n+1)
		}
	}
	return id + "~r1"
}
