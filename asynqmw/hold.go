package asynqmw

import (
	"context"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// WaitForRedis makes asynq's writes of task results wait for Redis instead of being
// lost when Redis is unreachable, and its dequeues safe to send again, so that Redis
// going down under a task neither runs it twice nor archives it. rdb must be the client
// the asynq server uses (the one given to asynq.NewServerFromRedisClient): WaitForRedis
// adds a hook to it (redis.Client.AddHook, once per client). New sets it.
//
// The hook acts only on asynq v0.26's result writes (its Done, Retry, Archive and
// MarkAsComplete scripts) and its dequeue, recognised by their scripts' SHA-1s. A
// result write that fails because Redis cannot be reached is held, within the task's
// lease, until Redis answers, and sent again only if the failed try did not run; the
// worker waits meanwhile. A dequeue records the task it takes under a token, so one
// sent again hands that task on instead of stranding it. It costs one SET inside each
// dequeue that takes a task; every other command passes through untouched. A nil rdb
// turns it off. The README's asynq section ("Redis killed under the load") tells why.
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
		rdb.AddHook(&writeHold{rdb: rdb, left: map[string][]string{}})
	}
}

// writeHold is the hook of WaitForRedis.
type writeHold struct {
	rdb  redis.UniversalClient
	mu   sync.Mutex
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
		w, ok := resultWrite(cmd.Args())
		if _, dl := ctx.Deadline(); !ok || !dl {
			return next(ctx, cmd)
		}
		var o outage
		err := next(ctx, cmd)
		for err != nil && unreachable(err) && ctx.Err() == nil {
			if !o.wait(ctx, attempt{}) {
				return err
			}
			ran, cerr := w.ran(ctx, h.rdb)
			switch {
			case cerr != nil && unreachable(cerr):
				continue // Redis is still away
			case cerr != nil:
				return err
			case ran:
				cmd.SetErr(nil) // the try whose reply was lost did it
				return nil
			}
			err = next(ctx, cmd)
		}
		return err
	}
}

// write is one of asynq's writes of a task's result: the task's key, and the message
// the write stores in it (nil for Done, which deletes it).
type write struct {
	task string
	msg  any
}

// ranScript reports whether a write already ran: the task's key holds the message it
// stores (Retry, Archive, MarkAsComplete: each stores a message of its own, with the
// time of the call), or is gone (Done).
var ranScript = redis.NewScript(`
if #ARGV == 0 then
	if redis.call("EXISTS", KEYS[1]) == 0 then return 1 end
	return 0
end
if redis.call("HGET", KEYS[1], "msg") == ARGV[1] then return 1 end
return 0`)

// ran reports whether w already ran in Redis.
func (w write) ran(ctx context.Context, rdb redis.UniversalClient) (bool, error) {
	var args []any
	if w.msg != nil {
		args = append(args, w.msg)
	}
	n, err := ranScript.Run(ctx, rdb, []string{w.task}, args...).Int()
	return n == 1, err
}

// resultWrite reports whether args are asynq v0.26's write of a task's result that
// the hook may send again, and returns it. The scripts, by their keys (KEYS) and
// arguments (ARGV):
//   - Done: active, lease, task, ...; it deletes the task;
//   - MarkAsComplete: active, lease, completed, task, ...; ARGV[4] is the message;
//   - Retry and Archive: task, active, lease, retry or archived, ...; ARGV[2] is the
//     message.
//
// Requeue (active, lease, pending, task), which only changes the task's state, is not
// one: whether it ran cannot be told, and a task it put back may be running again. Nor
// is Dequeue (see dequeue).
func resultWrite(args []any) (write, bool) {
	if len(args) < 3 {
		return write{}, false
	}
	if name, _ := args[0].(string); name != "evalsha" && name != "eval" {
		return write{}, false
	}
	n, ok := args[2].(int)
	if !ok || n < 4 || len(args) < 3+n {
		return write{}, false
	}
	keys := make([]string, n)
	for i := range keys {
		if keys[i], ok = args[3+i].(string); !ok || !strings.HasPrefix(keys[i], "asynq:{") {
			return write{}, false
		}
	}
	argv := args[3+n:]
	is := func(k, what string) bool { return strings.HasSuffix(k, "}:"+what) }
	task := func(k string) bool { return strings.Contains(k, "}:t:") }
	switch {
	case is(keys[0], "active") && is(keys[1], "lease") && task(keys[2]): // Done
		return write{task: keys[2]}, true
	case is(keys[0], "active") && is(keys[1], "lease") && is(keys[2], "completed") && task(keys[3]) && len(argv) >= 4:
		return write{task: keys[3], msg: argv[3]}, true // MarkAsComplete
	case task(keys[0]) && is(keys[1], "active") && is(keys[2], "lease") && (is(keys[3], "retry") || is(keys[3], "archived")) && len(argv) >= 2:
		return write{task: keys[0], msg: argv[1]}, true // Retry, Archive
	}
	return write{}, false
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
