package asynqmw

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// WaitForRedis makes asynq's writes of task results wait for Redis instead of being
// lost when Redis is unreachable, and its dequeues safe to send again. rdb must be
// the client the asynq server uses (the one given to asynq.NewServerFromRedisClient):
// WaitForRedis adds a hook to it (redis.Client.AddHook, once per client).
//
// asynq v0.26 writes a task's result (done, retry, archive, or the revoke of a task
// the middleware requeued) once; if Redis is down then, or dies while the write is
// on its way, it queues the write for retry with a context that is already
// cancelled, so the retries fail too. The task stays active until its lease expires
// and asynq's recoverer, a minute later, retries it (its handler runs twice and a
// failure is counted) or, on its last attempt, archives it, though it succeeded.
//
// The hook acts on those writes (asynq's scripts that move a task out of its
// queue's active list) only while the server's worker waits for them (a call with a
// deadline: asynq gives each the task's lease): when one fails because Redis cannot
// be reached (a connection error, LOADING, MASTERDOWN, CLUSTERDOWN, TRYAGAIN), it
// sends it again after 50ms, 100ms, ... up to a second apart until Redis answers or
// the lease's deadline passes. Sending again is safe: each of those scripts first
// removes the task from the active list and does nothing if it is not there. When a
// write sent again finds the task gone ("NOT FOUND") after an earlier try failed on
// the connection, the earlier try ran and only its reply was lost: the hook reports
// success. The worker is held while it waits, as nothing can run without Redis
// anyway (a server shut down then waits for it too, up to the lease's 30 s, past its
// ShutdownTimeout).
//
// asynq's dequeue moves a task to the active list and leases it; if its reply is lost
// (Redis killed as it answered), go-redis sends it again, which takes the next task,
// and the first stays active with no worker on it until the recoverer retries it
// (a failure counted) or archives it unrun. The hook runs asynq v0.26's dequeue
// (recognised by its script's SHA-1; any other passes through untouched) as a copy
// that records the task it takes under a token, for a minute: the same call sent
// again, or the next dequeue of the queue after one that failed on the connection,
// gets that task back as long as it is still active on the lease that dequeue gave
// it. It costs a SET inside each dequeue that takes a task.
//
// Every other command of rdb passes through untouched. A nil rdb turns it off.
func WaitForRedis(rdb redis.UniversalClient) Option {
	return optionFunc(func(c *config) {
		if rdb != nil {
			holdWrites(rdb)
		}
	})
}

// held records the clients that have the hook.
var held sync.Map // redis.UniversalClient → true

// holdWrites adds the hook to rdb unless it has it.
func holdWrites(rdb redis.UniversalClient) {
	if _, loaded := held.LoadOrStore(rdb, true); !loaded {
		rdb.AddHook(&writeHold{rdb: rdb, lost: map[string]bool{}, left: map[string][]string{}})
	}
}

// writeHold is the hook of WaitForRedis.
type writeHold struct {
	rdb  redis.UniversalClient
	mu   sync.Mutex
	lost map[string]bool     // task key → a write of it failed on the connection
	left map[string][]string // pending key → tokens of dequeues that failed on the connection
}

func (h *writeHold) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *writeHold) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

func (h *writeHold) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if keys, argv, ok := isDequeue(cmd.Args()); ok {
			return h.dequeue(ctx, cmd, keys, argv)
		}
		task, ok := resultWrite(cmd.Args())
		if _, dl := ctx.Deadline(); !ok || !dl {
			return next(ctx, cmd)
		}
		var o outage
		for {
			err := next(ctx, cmd)
			if err == nil {
				h.settle(task)
				return nil
			}
			if notFound(err) && h.settle(task) {
				cmd.SetErr(nil) // the try whose reply was lost did it
				return nil
			}
			if !unreachable(err) || ctx.Err() != nil {
				return err
			}
			h.mu.Lock()
			if len(h.lost) >= maxRemembered {
				clear(h.lost)
			}
			h.lost[task] = true
			h.mu.Unlock()
			if !o.wait(ctx, attempt{}) {
				return err
			}
		}
	}
}

// settle forgets task and reports whether a write of it had failed on the
// connection.
func (h *writeHold) settle(task string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	was := h.lost[task]
	delete(h.lost, task)
	return was
}

// resultWrite reports whether args are asynq's write of a task's result, and returns
// the task's key. asynq v0.26's Done, MarkAsComplete and Requeue scripts take the
// queue's active and lease keys first and the task's key later; Retry and Archive
// take the task's key, then the active and lease keys. Dequeue (pending, paused,
// active, lease) is not one: sending it again could take a second task.
func resultWrite(args []any) (string, bool) {
	if len(args) < 6 {
		return "", false
	}
	if name, _ := args[0].(string); name != "evalsha" && name != "eval" {
		return "", false
	}
	n, ok := args[2].(int)
	if !ok || n < 3 || len(args) < 3+n {
		return "", false
	}
	keys := make([]string, n)
	for i := range keys {
		if keys[i], ok = args[3+i].(string); !ok || !strings.HasPrefix(keys[i], "asynq:{") {
			return "", false
		}
	}
	first := 0
	if strings.Contains(keys[0], "}:t:") {
		first = 1
	}
	if !strings.HasSuffix(keys[first], "}:active") || !strings.HasSuffix(keys[first+1], "}:lease") {
		return "", false
	}
	for _, k := range keys {
		if strings.Contains(k, "}:t:") {
			return k, true
		}
	}
	return "", false
}

// notFound reports whether err is the "NOT FOUND" of asynq's scripts.
func notFound(err error) bool {
	var re redis.Error
	return errors.As(err, &re) && strings.HasPrefix(re.Error(), "NOT FOUND")
}

// unreachable reports whether err means Redis could not be reached or could not serve
// yet: a connection error (a dial's "i/o timeout" among them, which errors.Is reports
// as context.DeadlineExceeded: the caller checks its context itself), or a reply
// asking to try again later.
func unreachable(err error) bool {
	if errors.Is(err, redis.ErrClosed) {
		return false
	}
	var re redis.Error
	if !errors.As(err, &re) {
		return true // a network or pool error
	}
	for _, p := range []string{"LOADING", "MASTERDOWN", "CLUSTERDOWN", "TRYAGAIN"} {
		if strings.HasPrefix(re.Error(), p) {
			return true
		}
	}
	return false
}
