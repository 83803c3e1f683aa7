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

// requeuer hands a task on its last attempt back to its queue as a copy: asynq
// archives such a task on any error (see finish), so the retry path would lose it.
//
// The copy has the original's type, payload, headers, queue, Timeout, Deadline,
// Retention and remaining retries (none), finds its booking (bookingID), and has the
// ID "<id>~r1" (or its count raised), so an enqueue sent again adds no second copy;
// it does not keep a Unique lock or a Group.
type requeuer struct {
	rdb       redis.UniversalClient
	client    *asynq.Client
	inspector *asynq.Inspector
}

func newRequeuer(rdb redis.UniversalClient) *requeuer {
	return &requeuer{
		rdb:       rdb,
		client:    asynq.NewClientFromRedisClient(rdb),
		inspector: asynq.NewInspectorFromRedisClient(rdb),
	}
}

// requeue enqueues a copy of t to run after te's delay and returns te, Requeued (see
// finish for what asynq then gets); or an error when the copy could not be enqueued.
// While Redis does not answer it tries again, within a's budget.
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
			return te
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
		te.retention = info.Retention
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
