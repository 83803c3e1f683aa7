package asynqmw

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// WaitForRedis makes the middleware hold a handler's result while asynq's Redis is
// unreachable, so that asynq's write of the result is not lost. rdb must be the
// client the asynq server uses (or one to the same Redis).
//
// asynq v0.26 writes a task's result (done, retry, archive) once; if Redis is down
// then, it queues the write for retry with a context that is already cancelled, so
// the retries fail too. The task stays active until its lease expires and asynq's
// recoverer, a minute later, retries it (its handler runs twice and a failure is
// counted) or, on its last attempt, archives it, though it succeeded. With
// WaitForRedis, after the handler returns the middleware sends rdb a PING; while it
// fails, it tries again 50ms, 100ms, ... up to a second apart, for at most
// MaxResultHold (less than asynq's 30 s lease), then returns the result.
//
// It costs one PING per task. A nil rdb turns it off.
func WaitForRedis(rdb redis.UniversalClient) Option {
	return optionFunc(func(c *config) { c.hold = rdb })
}

// MaxResultHold is the longest WaitForRedis holds a result: asynq's lease on a task
// is 30 s, extended every 5 s while Redis answers; past it, asynq's recoverer takes
// the task over however long the result is held.
const MaxResultHold = 25 * time.Second

// holdPingTimeout bounds each PING of WaitForRedis.
const holdPingTimeout = 500 * time.Millisecond

// holdResult returns once c.hold answers a PING, or after MaxResultHold, or when ctx
// ends, whichever is first. Without WaitForRedis it returns at once.
func (c *config) holdResult(ctx context.Context) {
	if c.hold == nil {
		return
	}
	var o outage
	end := time.Now().Add(MaxResultHold)
	for {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), holdPingTimeout)
		err := c.hold.Ping(pctx).Err()
		cancel()
		if err == nil || ctx.Err() != nil || !o.wait(ctx, attempt{deadline: end}) {
			return
		}
	}
}
