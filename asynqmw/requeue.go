package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Requeue lets the middleware hand a task on its last attempt back to its queue when
// its deadline comes too soon for it to sleep until its permit (see Throttle). rdb
// must be the Redis client the asynq server uses (the one given to
// asynq.NewServerFromRedisClient, or one to the same Redis).
//
// asynq v0.26 offers a handler no way to reschedule its own task on a last attempt:
// any error archives it, and only asynq.RevokeTask leaves it alone, by deleting it.
// So the middleware enqueues a copy to run after the throttle's delay and then
// returns an error wrapping both the *ThrottledError (Requeued set) and
// asynq.RevokeTask, which removes the original. The copy has the original's type,
// payload, headers, queue, Timeout, Deadline and Retention, and its remaining
// retries (none, as this was the last attempt); it has a new ID, the original's
// with "~r1" appended (or its count raised), so a repeated requeue of the same
// attempt adds no second copy, and it runs on the original's booking (bookings are
// recorded under the original's ID). It does not keep a Unique lock or a Group; asynq
// counts the revoked original as processed (not failed) in its queue stats and logs a
// "revoke task" warning for it.
//
// If the copy cannot be enqueued the middleware returns that error, and asynq
// archives the task as it would any error on a last attempt.
func Requeue(rdb redis.UniversalClient) Option {
	return optionFunc(func(c *config) {
		if rdb == nil {
			c.requeue = nil
			return
		}
		c.requeue = &requeuer{
			client:    asynq.NewClientFromRedisClient(rdb),
			inspector: asynq.NewInspectorFromRedisClient(rdb),
		}
	})
}

type requeuer struct {
	client    *asynq.Client
	inspector *asynq.Inspector
}

// requeue enqueues a copy of t to run after te's delay and returns the error that
// makes asynq drop the original; or te when ctx is not an asynq task's.
func (r *requeuer) requeue(ctx context.Context, t *asynq.Task, te *ThrottledError) error {
	id, ok1 := asynq.GetTaskID(ctx)
	queue, ok2 := asynq.GetQueueName(ctx)
	if !ok1 || !ok2 {
		return te
	}
	info, err := r.inspector.GetTaskInfo(queue, id)
	if err != nil {
		return fmt.Errorf("asynqmw: requeueing throttled task %s: %w", id, err)
	}
	delay := retryDelay(te.RetryIn)
	if te.Booked {
		delay = te.back // the copy finds the original's booking: due just before it
	}
	opts := []asynq.Option{
		asynq.Queue(queue),
		asynq.TaskID(nextCopyID(id)),
		asynq.MaxRetry(max(info.MaxRetry-info.Retried, 0)),
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
	}
	cp := asynq.NewTaskWithHeaders(t.Type(), t.Payload(), t.Headers(), opts...)
	if _, err := r.client.EnqueueContext(ctx, cp); err != nil && !errors.Is(err, asynq.ErrTaskIDConflict) {
		return fmt.Errorf("asynqmw: requeueing throttled task %s: %w", id, err)
	}
	te.Requeued = true
	return fmt.Errorf("%w (%w)", te, asynq.RevokeTask)
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
