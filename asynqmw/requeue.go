package asynqmw

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"
)

// Requeue lets the middleware hand a task on its last attempt back to its queue, rather
// than have asynq archive it, when its deadline comes too soon for it to sleep until its
// permit (see Throttle). rdb must be the Redis client the asynq server uses (the one
// given to asynq.NewServerFromRedisClient, or one to the same Redis). New sets it.
//
// The middleware enqueues a copy to run after the throttle's delay, then returns an
// error wrapping both the *ThrottledError (Requeued set) and asynq.RevokeTask, which
// removes the original. The copy has the original's type, payload, headers, queue,
// Timeout, Deadline, Retention and remaining retries (none), its booking, and the ID
// "<id>~r1" (or its count raised), so a repeated requeue adds no second copy; it does
// not keep a Unique lock or a Group. asynq counts the original as processed (not
// failed) and logs a "revoke task" warning for it. The enqueue is tried again while
// Redis does not answer, within the task's deadline (see HandlerTime); if it cannot be
// made, the task sleeps for its booking in the handler instead (a copy enqueued unseen,
// its reply lost, may then run too: see the README's asynq section).
func Requeue(rdb redis.UniversalClient) Option {
	return optionFunc(func(c *config) {
		if rdb == nil {
			c.requeue = nil
			return
		}
		c.requeue = &requeuer{
			rdb:       rdb,
			client:    asynq.NewClientFromRedisClient(rdb),
			inspector: asynq.NewInspectorFromRedisClient(rdb),
		}
	})
}

type requeuer struct {
	rdb       redis.UniversalClient
	client    *asynq.Client
	inspector *asynq.Inspector
}

// requeue enqueues a copy of t to run after te's delay and returns the error that
// makes asynq drop the original; or te when ctx is not an asynq task's. While Redis
// does not answer it tries again, within a's budget.
func (r *requeuer) requeue(ctx context.Context, t *asynq.Task, a attempt, te *ThrottledError) error {
	id, ok1 := asynq.GetTaskID(ctx)
	queue, ok2 := asynq.GetQueueName(ctx)
	if !ok1 || !ok2 {
		return te
	}
	var down outage
	for {
		err := r.enqueueCopy(ctx, t, id, queue, te)
		if err != nil && r.answers(ctx) {
			// Redis is there: once more, which also finds a copy whose enqueue ran
			// though its reply was lost.
			if err = r.enqueueCopy(ctx, t, id, queue, te); err != nil {
				return fmt.Errorf("asynqmw: requeueing throttled task %s: %w", id, err)
			}
		}
		if err == nil {
			te.Requeued = true
			return fmt.Errorf("%w (%w)", te, asynq.RevokeTask)
		}
		if ctx.Err() != nil || !down.wait(ctx, a) { // tried again while Redis does not answer
			return fmt.Errorf("asynqmw: requeueing throttled task %s: %w", id, err)
		}
	}
}

// answers reports whether Redis answers a PING.
func (r *requeuer) answers(ctx context.Context) bool {
	pctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	return r.rdb.Ping(pctx).Err() == nil
}

// enqueueCopy enqueues the copy of task id of queue; nil also when it is there.
func (r *requeuer) enqueueCopy(ctx context.Context, t *asynq.Task, id, queue string, te *ThrottledError) error {
	info, err := r.inspector.GetTaskInfo(queue, id)
	if err != nil {
		return err
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
		return err
	}
	return nil
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
