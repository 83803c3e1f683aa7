package asynqmw

import (
	"context"
	"crypto/rand"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// asynqDequeue is asynq v0.26's dequeue script (dequeueCmd in its internal/rdb/rdb.go),
// byte for byte. It is a deliberate copy: the hook of WaitForRedis must recognise
// asynq's dequeue among the commands of the server's client, and the only mark it
// has is the script's text or SHA-1, which asynq keeps in a package Go does not let
// us import (internal/rdb). So the hook takes over calls of exactly this script, and
// of no other: a different asynq version's dequeue has another SHA-1 and passes
// through untouched. Do not reformat it.
const asynqDequeue = `
if redis.call("EXISTS", KEYS[2]) == 0 then
	local id = redis.call("RPOPLPUSH", KEYS[1], KEYS[3])
	if id then
		local key = ARGV[2] .. id
		redis.call("HSET", key, "state", "active")
		redis.call("HDEL", key, "pending_since")
		redis.call("ZADD", KEYS[4], ARGV[1], id)
		return redis.call("HGET", key, "msg")
	end
end
return nil`

var asynqDequeueSHA = func() string {
	sum := sha1.Sum([]byte(asynqDequeue))
	return hex.EncodeToString(sum[:])
}()

// dequeueOnce is asynq's dequeue made safe to send again: it records the task it
// takes under a token (KEYS[5], for a minute), and a call with the same token finds
// that task and returns it again, as long as it is still active on the lease that
// dequeue gave it (no worker has it: a worker's lease is extended, a recovered task's
// is gone). KEYS and ARGV are asynq's, then the token's key. It is asynqDequeue
// itself, with the lookup of the token before it and the record of the task taken
// added where it returns the task's message.
var dequeueOnce = redis.NewScript(dequeueOnceSrc())

func dequeueOnceSrc() string {
	const taken = "\t\treturn redis.call(\"HGET\", key, \"msg\")\n"
	if strings.Count(asynqDequeue, taken) != 1 {
		panic("asynqmw: asynqDequeue does not return the task's message where dequeueOnce records it")
	}
	return `
local rec = redis.call("GET", KEYS[5])
if rec then
	local id, score = string.match(rec, "^(.*):(%d+)$")
	if id and redis.call("ZSCORE", KEYS[4], id) == score then
		return redis.call("HGET", ARGV[2] .. id, "msg")
	end
end` + strings.Replace(asynqDequeue, taken,
		"\t\tredis.call(\"SET\", KEYS[5], id .. \":\" .. ARGV[1], \"EX\", 60)\n"+taken, 1)
}

// dequeue runs asynq's dequeue of cmd (keys: pending, paused, active, lease) as
// dequeueOnce, under a token that stays the same for every time go-redis sends it,
// and for the next dequeue of the queue when this one fails on the connection: a
// dequeue that ran in Redis though its reply was lost (Redis killed as it answered)
// then hands its task to the next dequeue instead of leaving it active with no
// worker on it, for asynq's recoverer to retry or archive a minute later.
func (h *writeHold) dequeue(ctx context.Context, cmd redis.Cmder, keys []string, argv []any) error {
	queue := keys[0]
	token := h.token(queue)
	tk := strings.TrimSuffix(queue, "pending") + "jt-dq:" + token
	res, err := dequeueOnce.Run(ctx, h.rdb, append(keys[:4:4], tk), argv...).Result()
	if err != nil && !errors.Is(err, redis.Nil) && unreachable(err) {
		h.mu.Lock()
		h.left[queue] = append(h.left[queue], token)
		h.mu.Unlock()
	}
	c, ok := cmd.(*redis.Cmd)
	if !ok {
		return errors.New("asynqmw: asynq's dequeue is not a *redis.Cmd")
	}
	c.SetVal(res)
	c.SetErr(err)
	return err
}

// token returns the token of a dequeue of queue: one left by a dequeue that failed on
// the connection, or a new one.
func (h *writeHold) token(queue string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.left[queue]; len(l) > 0 {
		h.left[queue] = l[1:]
		if len(h.left[queue]) == 0 {
			delete(h.left, queue)
		}
		return l[0]
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// isDequeue reports whether args are asynq v0.26's dequeue, and returns its keys and
// arguments.
func isDequeue(args []any) (keys []string, argv []any, ok bool) {
	if len(args) != 3+4+2 {
		return nil, nil, false
	}
	switch name, _ := args[0].(string); name {
	case "evalsha":
		if sha, _ := args[1].(string); sha != asynqDequeueSHA {
			return nil, nil, false
		}
	case "eval":
		if src, _ := args[1].(string); src != asynqDequeue {
			return nil, nil, false
		}
	default:
		return nil, nil, false
	}
	if n, _ := args[2].(int); n != 4 {
		return nil, nil, false
	}
	keys = make([]string, 4)
	for i := range keys {
		k, ok := args[3+i].(string)
		if !ok || !strings.HasPrefix(k, "asynq:{") {
			return nil, nil, false
		}
		keys[i] = k
	}
	if !strings.HasSuffix(keys[0], "}:pending") {
		return nil, nil, false
	}
	return keys, args[7:], true
}
