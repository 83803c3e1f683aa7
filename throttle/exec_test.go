package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"syscall"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// (TestLostReplyChargesOnce and TestLostReplySemaphoreAndPauseOnce, in
// lostreply_test.go, check exec's at-most-once on a real server through a proxy that
// drops replies.)

// replyError is an error reply as go-redis gives it: a redis.Error.
type replyError string

func (e replyError) Error() string { return string(e) }
func (replyError) RedisError()     {}

// scriptError maps each kind of failure to its sentinel, keeps the cause where it says
// so, and leaves the caller's own context error as it is.
func TestScriptErrorMapping(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		err       error
		want      error // nil: none of the package's sentinels
		keepCause bool
	}{
		{replyError("ERR JTARG n above rate script: ..."), ErrInvalidArgument, false},
		{replyError("ERR JTSTATE sem not a zset"), ErrCorruptState, false},
		{replyError("WRONGTYPE Operation against a key holding the wrong kind of value"), ErrCorruptState, false},
		{replyError("NOPERM this user has no permissions to access one of the keys"), ErrNoPermission, true},
		{replyError("ERR The user executing the script can't run this command or subcommand"), ErrNoPermission, true},
		{replyError("LOADING Redis is loading the dataset in memory"), ErrUnavailable, true},
		{replyError("CLUSTERDOWN The cluster is down"), ErrUnavailable, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), ErrUnavailable, true},
		{io.EOF, ErrUnavailable, true},
		{replyError("ERR unknown command"), nil, true},
		{context.Canceled, nil, true},
		{fmt.Errorf("read: %w", context.DeadlineExceeded), ErrUnavailable, true}, // a timeout: a net.Error
	} {
		got := scriptError(ctx, "k", c.err)
		for _, s := range []error{ErrInvalidArgument, ErrCorruptState, ErrNoPermission, ErrUnavailable} {
			if is := errors.Is(got, s); is != (s == c.want) {
				t.Errorf("scriptError(%q) = %v: errors.Is(%v) = %v", c.err, got, s, is)
			}
		}
		if is := errors.Is(got, c.err); is != c.keepCause {
			t.Errorf("scriptError(%q) = %v: wraps the cause %v, want %v", c.err, got, is, c.keepCause)
		}
	}
	// a call whose own context ended is not an outage, whatever the connection says
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got := scriptError(done, "k", io.EOF); errors.Is(got, ErrUnavailable) || !errors.Is(got, io.EOF) {
		t.Errorf("scriptError with the context ended: %v, want io.EOF without ErrUnavailable", got)
	}
}

// int64s accepts exactly k integers.
func TestInt64s(t *testing.T) {
	v := make([]int64, 3)
	if !int64s([]any{int64(1), int64(-2), int64(3)}, v) || v[0] != 1 || v[1] != -2 || v[2] != 3 {
		t.Fatalf("three integers: %v", v)
	}
	for _, bad := range []any{
		nil,
		int64(1),
		[]any{int64(1), int64(2)}, // too short
		[]any{int64(1), int64(2), int64(3), int64(4)}, // too long
		[]any{int64(1), "2", int64(3)},                // a string
		[]any{int64(1), nil, int64(3)},                // a nil (Lua's false)
	} {
		if int64s(bad, v) {
			t.Errorf("int64s(%#v) accepted", bad)
		}
	}
}

// evalOnce runs a script the server does not have (a restart or SCRIPT FLUSH lost it)
// by EVAL, once, and hands back the script's own errors.
func TestEvalOnceLoadsAMissingScript(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		key := "{" + b.Prefix + "once}:n"
		incr := redis.NewScript(`return redis.call('INCR', KEYS[1])`)
		if err := scriptFlush(ctx, b.Client); err != nil {
			t.Fatal(err)
		}
		evals := evalCount()
		b.Client.AddHook(evals)
		for want := int64(1); want <= 2; want++ { // the first by EVAL, the second by EVALSHA
			val, err := evalOnce(ctx, b.Client, incr, []string{key}, nil)
			if err != nil || val != want {
				t.Fatalf("evalOnce #%d = %v, %v; want %d (run once)", want, val, err, want)
			}
			if got := evals.n.Load(); got != 1 {
				t.Fatalf("after evalOnce #%d: %d calls by EVAL, want 1 (the first, after NOSCRIPT)", want, got)
			}
		}
		fail := redis.NewScript(`return redis.error_reply('JTARG test')`)
		_, err := evalOnce(ctx, b.Client, fail, []string{key}, nil)
		if err == nil || !redis.HasErrorPrefix(err, "JTARG") {
			t.Fatalf("evalOnce of a failing script: %v, want its JTARG reply", err)
		}
		if got := scriptError(ctx, "once", err); !errors.Is(got, ErrInvalidArgument) {
			t.Fatalf("its mapping: %v, want ErrInvalidArgument", got)
		}
	})
}

// countTx counts the script calls sent in a transaction (MULTI/EXEC) and as plain
// commands.
type countTx struct{ tx, plain int }

func isEval(cmd redis.Cmder) bool { return cmd.Name() == "evalsha" || cmd.Name() == "eval" }

func (c *countTx) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *countTx) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if isEval(cmd) {
			c.plain++
		}
		return next(ctx, cmd)
	}
}
func (c *countTx) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, cmd := range cmds {
			if isEval(cmd) {
				c.tx++
			}
		}
		return next(ctx, cmds)
	}
}

// A client that never re-sends (MaxRetries < 0) gets plain EVALSHA, no MULTI/EXEC, and
// a reply it loses still charges once and fails with ErrUnavailable; a client with
// go-redis's default retries keeps the transaction.
func TestNeverResendingClientSkipsTheTransaction(t *testing.T) {
	direct, proxy, _ := redistest.NewProxied(t)
	ctx := context.Background()
	for _, retries := range []int{-1, 0} {
		rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr, MaxRetries: retries})
		defer rdb.Close()
		var c countTx
		rdb.AddHook(&c)
		l, err := New(rdb, fmt.Sprint("plain", retries), PerHour(10), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.script.Load(ctx, direct.Client).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx); err != nil { // the first call carries the key's record (record.go)
			t.Fatal(err)
		}
		c = countTx{}
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		if wantTx := retries >= 0; (c.tx == 1) != wantTx || (c.plain == 1) == wantTx {
			t.Fatalf("MaxRetries %d: %d transactions, %d plain commands", retries, c.tx, c.plain)
		}
		if retries >= 0 {
			continue
		}
		proxy.DropReplyTo("evalsha")
		if _, err := l.Allow(ctx); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("MaxRetries %d, reply lost: %v, want ErrUnavailable", retries, err)
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 7 { // 10 less the two calls above and the lost one
			t.Fatalf("MaxRetries %d, after a lost reply: %+v, %v; want 7 remaining (charged once)", retries, res, err)
		}
	}
}
