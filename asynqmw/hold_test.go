package asynqmw

import (
	"context"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// resultWrite picks asynq v0.26's writes of a task's result by the shape of their
// keys, with the message each stores, and nothing else.
func TestResultWrite(t *testing.T) {
	eval := func(keys ...string) []any {
		args := []any{"evalsha", "0123abcd", len(keys)}
		for _, k := range keys {
			args = append(args, k)
		}
		return append(args, "id", "msg2", 3, "msg4")
	}
	const tk = "asynq:{q}:t:id"
	for _, c := range []struct {
		name string
		args []any
		want write
	}{
		{"done", eval("asynq:{q}:active", "asynq:{q}:lease", tk, "asynq:{q}:processed:2026-01-01", "asynq:{q}:processed"), write{task: tk}},
		{"complete", eval("asynq:{q}:active", "asynq:{q}:lease", "asynq:{q}:completed", tk, "asynq:{q}:processed:2026-01-01"), write{task: tk, msg: "msg4"}},
		{"retry", eval(tk, "asynq:{q}:active", "asynq:{q}:lease", "asynq:{q}:retry", "asynq:{q}:processed:2026-01-01"), write{task: tk, msg: "msg2"}},
		{"archive", append([]any{"eval"}, eval(tk, "asynq:{q}:active", "asynq:{q}:lease", "asynq:{q}:archived")[1:]...), write{task: tk, msg: "msg2"}},
		{"requeue", eval("asynq:{q}:active", "asynq:{q}:lease", "asynq:{q}:pending", tk), write{}},
		{"dequeue", eval("asynq:{q}:pending", "asynq:{q}:paused", "asynq:{q}:active", "asynq:{q}:lease"), write{}},
		{"enqueue", eval(tk, "asynq:{q}:pending"), write{}},
		{"other keys", eval("app:{q}:active", "app:{q}:lease", "app:{q}:t:id", "app:{q}:processed"), write{}},
		{"get", []any{"get", "asynq:{q}:active"}, write{}},
		{"short", eval("asynq:{q}:active", "asynq:{q}:lease"), write{}},
	} {
		got, ok := resultWrite(c.args)
		if got != c.want || ok != (c.want.task != "") {
			t.Errorf("%s: resultWrite = %+v, %v; want %+v", c.name, got, ok, c.want)
		}
	}
}

// asynqDone is shaped like asynq's Done script: it takes the task out of the active
// list and the lease set, or answers NOT FOUND.
var asynqDone = redis.NewScript(`
if redis.call("LREM", KEYS[1], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("ZREM", KEYS[2], ARGV[1])
redis.call("DEL", KEYS[3])
redis.call("INCR", KEYS[4])
return redis.status_reply("OK")`)

var doneKeys = []string{"asynq:{hold}:active", "asynq:{hold}:lease", "asynq:{hold}:t:id", "asynq:{hold}:processed"}

// seed makes task "id" active, as asynq's dequeue does.
func seed(t *testing.T, rdb redis.UniversalClient) {
	t.Helper()
	ctx := context.Background()
	if err := rdb.Del(ctx, doneKeys...).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.LPush(ctx, doneKeys[0], "id").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ZAdd(ctx, doneKeys[1], redis.Z{Score: 1, Member: "id"}).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.HSet(ctx, doneKeys[2], "msg", "m").Err(); err != nil {
		t.Fatal(err)
	}
}

// While Redis does not answer, a result write with a deadline waits for it and then
// runs; one without a deadline (asynq's syncer and recoverer) and other commands fail
// at once, as without the hook.
func TestWaitForRedisHoldsWrites(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	rdb := redis.NewClient(&redis.Options{Addr: b.Mini.Addr(), MaxRetries: -1})
	defer rdb.Close()
	newConfig([]Option{WaitForRedis(rdb)})
	newConfig([]Option{WaitForRedis(rdb)}) // a second Setup on the client adds no second hook

	// No timing is assumed: Redis stays "loading" until the commands that must not
	// be held have returned, so a held one would return only after the error was
	// cleared (10s later, a safety net: then without an error); the write with a
	// deadline must return after the error was cleared, 300ms later, and succeed.
	// (A 200ms bound on "at once" failed at load 17: 253ms.)
	seed(t, rdb)
	const loading = "LOADING Redis is loading the dataset in memory"
	b.SetError(loading)
	var clearedAt atomic.Int64
	clear := func() { clearedAt.Store(time.Now().UnixNano()); b.SetError("") }
	safety := time.AfterFunc(10*time.Second, clear)
	if err := rdb.Get(context.Background(), "other").Err(); !redis.HasErrorPrefix(err, "LOADING") {
		t.Errorf("another command while Redis is loading: %v, want the LOADING error at once", err)
	}
	if err := asynqDone.Run(context.Background(), rdb, doneKeys, "id").Err(); err == nil || clearedAt.Load() != 0 {
		t.Errorf("a result write without a deadline while Redis is loading: %v (after the error was cleared: %v), want the error at once", err, clearedAt.Load() != 0)
	}
	if !safety.Stop() {
		t.Fatal("commands that are not held were held for 10s")
	}
	b.SetError(loading)
	time.AfterFunc(300*time.Millisecond, clear)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err := asynqDone.Run(ctx, rdb, doneKeys, "id").Err()
	if cleared := clearedAt.Load(); err != nil || cleared == 0 {
		t.Errorf("a result write while Redis is loading for 300ms: %v (after the error was cleared: %v); want nil, after it", err, cleared != 0)
	}
	if n := rdb.LLen(context.Background(), doneKeys[0]).Val(); n != 0 {
		t.Errorf("active list holds %d after the write, want 0", n)
	}

	// Past its deadline the write gives up with Redis's error.
	seed(t, rdb)
	b.SetError("LOADING Redis is loading the dataset in memory")
	defer b.SetError("")
	short, cancel2 := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel2()
	if err := asynqDone.Run(short, rdb, doneKeys, "id").Err(); err == nil {
		t.Error("a result write past its deadline: nil, want an error")
	}
}

// A write that cannot even dial (a dial's "i/o timeout" reads as
// context.DeadlineExceeded) is held until its own deadline.
func TestWaitForRedisHoldsDials(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", DialTimeout: 100 * time.Millisecond, MaxRetries: -1})
	defer rdb.Close()
	WaitForRedis(rdb).apply(&config{})
	ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := asynqDone.Run(ctx, rdb, doneKeys, "id").Err()
	if took := time.Since(start); err == nil || took < 550*time.Millisecond {
		t.Errorf("a result write with nothing to dial: %v after %v; want an error after its 600ms deadline", err, took)
	}
}

// A result write whose reply is lost (it ran; the connection broke before the reply)
// is sent again, finds the task gone and reports success; without the hook the caller
// sees the connection error, as asynq does when Redis dies under its write.
func TestWaitForRedisLostReply(t *testing.T) {
	b := redistest.NewStandalone(t)
	proxy, err := redistest.NewProxy(b.Client.(*redis.Client).Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, hold := range []bool{false, true} {
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1}) // go-redis would send it again itself
		if hold {
			WaitForRedis(rdb).apply(&config{})
		}
		asynqDone.Load(ctx, rdb)
		seed(t, rdb)
		proxy.DropReplyTo(doneKeys[0])
		err := asynqDone.Run(ctx, rdb, doneKeys, "id").Err()
		switch {
		case hold && err != nil:
			t.Errorf("with WaitForRedis, a write whose reply was lost: %v, want nil", err)
		case !hold && err == nil:
			t.Error("without WaitForRedis, a write whose reply was lost: nil, want the connection's error")
		}
		if n := b.Client.LLen(ctx, doneKeys[0]).Val(); n != 0 {
			t.Errorf("hold %v: active list holds %d, want 0 (the write ran)", hold, n)
		}
		rdb.Close()
	}
	if proxy.Dropped() != 2 {
		t.Errorf("replies dropped: %d, want 2", proxy.Dropped())
	}
}

// isDequeue picks asynq v0.26's dequeue by its script, and nothing else.
func TestIsDequeue(t *testing.T) {
	keys := []any{"asynq:{q}:pending", "asynq:{q}:paused", "asynq:{q}:active", "asynq:{q}:lease"}
	mk := func(name, script string, keys ...any) []any {
		return append(append([]any{name, script, len(keys)}, keys...), int64(1), "asynq:{q}:t:")
	}
	if _, _, ok := isDequeue(mk("evalsha", asynqDequeueSHA, keys...)); !ok {
		t.Error("evalsha of asynq's dequeue not recognised")
	}
	if _, _, ok := isDequeue(mk("eval", asynqDequeue, keys...)); !ok {
		t.Error("eval of asynq's dequeue not recognised")
	}
	for name, args := range map[string][]any{
		"another script": mk("evalsha", "0123", keys...),
		"other keys":     mk("evalsha", asynqDequeueSHA, "app:{q}:pending", "app:{q}:paused", "app:{q}:active", "app:{q}:lease"),
		"three keys":     mk("evalsha", asynqDequeueSHA, keys[:3]...),
		"get":            {"get", "asynq:{q}:pending"},
	} {
		if _, _, ok := isDequeue(args); ok {
			t.Errorf("%s taken for asynq's dequeue", name)
		}
	}
}

// A dequeue that failed on the connection after it ran hands the task it took to the
// next dequeue of the queue, instead of leaving it active with nobody on it.
func TestDequeueAfterLostReply(t *testing.T) {
	b := redistest.NewStandalone(t)
	proxy, err := redistest.NewProxy(b.Client.(*redis.Client).Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	ctx := context.Background()
	q := "asynq:{" + b.Prefix + "dq}:"
	keys := []string{q + "pending", q + "paused", q + "active", q + "lease"}
	dequeue := redis.NewScript(asynqDequeue)
	for _, hold := range []bool{false, true} {
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: -1}) // go-redis sends nothing again
		if hold {
			WaitForRedis(rdb).apply(&config{})
		}
		if err := b.Client.Del(ctx, append(keys, q+"t:a", q+"t:b")...).Err(); err != nil {
			t.Fatal(err)
		}
		b.Client.LPush(ctx, keys[0], "a", "b") // "a" is dequeued first
		b.Client.HSet(ctx, q+"t:a", "msg", "A")
		b.Client.HSet(ctx, q+"t:b", "msg", "B")
		dequeue.Load(ctx, b.Client)
		dequeueOnce.Load(ctx, b.Client) // so that the dropped reply is of a dequeue that ran
		proxy.DropReplyTo("}:paused")
		if _, err := dequeue.Run(ctx, rdb, keys, int64(2000000000), q+"t:").Result(); err == nil {
			t.Fatalf("hold %v: the dequeue whose reply was dropped returned no error", hold)
		}
		got, err := dequeue.Run(ctx, rdb, keys, int64(2000000000), q+"t:").Text()
		want := "B" // asynq alone: "a" stays active with nobody on it
		if hold {
			want = "A"
		}
		if err != nil || got != want {
			t.Errorf("hold %v: the next dequeue got %q, %v; want %q", hold, got, err, want)
		}
		active := int64(2) // "a" with nobody on it, and "b"
		if hold {
			active = 1
		}
		if n := b.Client.LLen(ctx, keys[2]).Val(); n != active {
			t.Errorf("hold %v: %d tasks active, want %d", hold, n, active)
		}
		rdb.Close()
	}
}

// asynqRetry is shaped like asynq's Retry script: it moves the task from the active
// list to the retry set and stores its new message.
var asynqRetry = redis.NewScript(`
if redis.call("LREM", KEYS[2], 0, ARGV[1]) == 0 then
  return redis.error_reply("NOT FOUND")
end
redis.call("ZREM", KEYS[3], ARGV[1])
redis.call("ZADD", KEYS[4], 1, ARGV[1])
redis.call("HSET", KEYS[1], "msg", ARGV[2], "state", "retry")
return redis.status_reply("OK")`)

// After a try of a result write fails on the connection, the hook sends it again only
// if it did not run: a Retry whose reply was lost, whose task another worker already
// runs again, is not sent again (it would take the task from that worker).
func TestWaitForRedisSendsAgainOnlyWhatDidNotRun(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := "asynq:{" + b.Prefix + "again}:"
	keys := []string{q + "t:id", q + "active", q + "lease", q + "retry"}
	h := &writeHold{rdb: b.Client, left: map[string][]string{}}
	for _, ran := range []bool{true, false} {
		b.Client.Del(ctx, keys...)
		b.Client.LPush(ctx, keys[1], "id")
		b.Client.ZAdd(ctx, keys[2], redis.Z{Score: 1, Member: "id"})
		b.Client.HSet(ctx, keys[0], "msg", "old", "state", "active")
		tries := 0
		next := func(ctx context.Context, cmd redis.Cmder) error {
			tries++
			if tries == 1 {
				if ran { // it runs, its reply is lost, and the task runs again elsewhere
					if err := asynqRetry.Run(ctx, b.Client, keys, "id", "new").Err(); err != nil {
						t.Fatal(err)
					}
					b.Client.ZRem(ctx, keys[3], "id")
					b.Client.LPush(ctx, keys[1], "id")
				}
				cmd.SetErr(io.EOF)
				return io.EOF
			}
			err := asynqRetry.Run(ctx, b.Client, keys, "id", "new").Err()
			cmd.SetErr(err)
			return err
		}
		args := []any{"evalsha", "0123", 4}
		for _, k := range keys {
			args = append(args, k)
		}
		cmd := redis.NewCmd(ctx, append(args, "id", "new")...)
		err := h.ProcessHook(next)(ctx, cmd)
		wantTries := 2
		if ran {
			wantTries = 1
		}
		if err != nil || tries != wantTries {
			t.Errorf("ran %v: %v after %d tries, want nil after %d", ran, err, tries, wantTries)
		}
		if n := b.Client.LLen(ctx, keys[1]).Val(); ran && n != 1 {
			t.Errorf("ran %v: %d active, want 1 (the task running again elsewhere)", ran, n)
		} else if !ran && n != 0 {
			t.Errorf("ran %v: %d active, want 0", ran, n)
		}
	}
}
