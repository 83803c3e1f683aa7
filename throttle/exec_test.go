package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"syscall"
	"testing"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// How a round trip is sent (send, pipeline): EVALSHA, EVAL once after NOSCRIPT,
// MULTI/EXEC unless the client never re-sends; and how its errors read (scriptError).
// (TestLostReplyChargesOnce and TestLostReplySemaphoreAndPauseOnce, in
// lostreply_test.go, check at-most-once on a real server through a proxy that drops
// replies.)

// sendReplyError is an error reply as go-redis gives it: a redis.Error.
type sendReplyError string

func (e sendReplyError) Error() string { return string(e) }
func (sendReplyError) RedisError()     {}

// scriptError maps each kind of failure to its sentinel, keeps the cause where it says
// so, and leaves the caller's own context error as it is. A request's failure is mapped
// by its code alone, never by its text: a key named "JTSTATE-x" or "WRONGTYPE-x" in a
// text changes nothing; an error Redis gave the script (code 0) reads as Redis's own.
func TestScriptErrorMapping(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		err       error
		want      error // nil: none of the package's sentinels
		keepCause bool
	}{
		{sendReplyError("JTARG head or request count"), ErrInvalidArgument, false}, // the call's as a whole
		{&failed{protocol.ErrArg, "JTARG n or its second field"}, ErrInvalidArgument, false},
		{&failed{protocol.ErrState, "{k}:l: not a jobthrottle state"}, ErrCorruptState, false},
		{&failed{protocol.ErrExceeds, "JTEXCEEDS n above the overridden limits"}, ErrExceedsLimit, false},
		{&failed{protocol.ErrAlg, "tb {k}:l"}, ErrAlgorithmMismatch, false},
		{&failed{protocol.ErrAlg, "xx {k}:l"}, ErrAlgorithmMismatch, false}, // a tag this release does not know
		{&failed{protocol.ErrAlg, "WRONGTYPE-x"}, ErrAlgorithmMismatch, false},
		{&failed{protocol.ErrState, "NOPERM {JTARG-x}:l"}, ErrCorruptState, false},
		{&failed{0, "ERR key {JTSTATE-x}:l"}, nil, true},
		{&failed{0, "NOPERM no permissions to access a key"}, ErrNoPermission, true},
		{&failed{0, "LOADING Redis is loading"}, ErrUnavailable, true},
		{sendReplyError("ERR JTSTATE sem not a zset"), nil, true}, // a text, not a code
		{sendReplyError("WRONGTYPE Operation against a key holding the wrong kind of value"), ErrCorruptState, false},
		{sendReplyError("NOPERM this user has no permissions to access one of the keys"), ErrNoPermission, true},
		{sendReplyError("ERR The user executing the script can't run this command or subcommand"), ErrNoPermission, true},
		{sendReplyError("EXECABORT Transaction discarded because of: NOPERM this user has no permissions to run the 'exec' command"), ErrNoPermission, true},
		{sendReplyError("LOADING Redis is loading the dataset in memory"), ErrUnavailable, true},
		{sendReplyError("CLUSTERDOWN The cluster is down"), ErrUnavailable, true},
		{fmt.Errorf("dial: %w", syscall.ECONNREFUSED), ErrUnavailable, true},
		{io.EOF, ErrUnavailable, true},
		{sendReplyError("ERR unknown command"), nil, true},
		{context.Canceled, nil, true},
		{fmt.Errorf("read: %w", context.DeadlineExceeded), ErrUnavailable, true}, // a timeout: a net.Error
	} {
		got := scriptError(ctx, "k", c.err)
		for _, s := range []error{ErrInvalidArgument, ErrCorruptState, ErrExceedsLimit, ErrAlgorithmMismatch, ErrNoPermission, ErrUnavailable} {
			if is := errors.Is(got, s); is != (s == c.want) {
				t.Errorf("scriptError(%q) = %v: errors.Is(%v) got %v, want %v", c.err, got, s, is, s == c.want)
			}
		}
		cause := c.err
		if f, ok := c.err.(*failed); ok && f.code == 0 { // Redis's own error, as go-redis gives one
			cause = redisError(f.text)
		}
		if is := errors.Is(got, cause); is != c.keepCause {
			t.Errorf("scriptError(%q) = %v: wraps the cause %v, want %v", c.err, got, is, c.keepCause)
		}
	}
	// ErrAlg names the algorithm whose state the key holds by its head's tag
	var ae *AlgorithmError
	if err := scriptError(ctx, "k", &failed{protocol.ErrAlg, "tb {k}:l"}); !errors.As(err, &ae) || ae.Found != TokenBucket || ae.Key != "k" {
		t.Errorf("scriptError of ErrAlg \"tb ...\": %v (%+v), want an *AlgorithmError found TokenBucket", err, ae)
	}
	// a call whose own context ended is not an outage, whatever the connection says
	done, cancel := context.WithCancel(ctx)
	cancel()
	if got := scriptError(done, "k", io.EOF); errors.Is(got, ErrUnavailable) || !errors.Is(got, io.EOF) {
		t.Errorf("scriptError with the context ended: got %v, want io.EOF without ErrUnavailable", got)
	}
}

// A script that answers what the scripts never do (a reply too short for its requests,
// an error's text out of the reply's bounds) fails each of its requests with
// ErrUnexpectedReply, and so does one whose reply is no array of integers.
func TestUnexpectedReply(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		for _, c := range []struct {
			name, src string
			want      error
		}{
			{"too short", "return {1, 0, 0, 0, 0, 0}", ErrUnexpectedReply},
			{"error text out of bounds", "return {-1, 1, 50, 3, 0, 0, 0}", ErrUnexpectedReply},
			{"error text of negative length", "return {-1, 1, 8, -1, 0, 0, 0}", ErrUnexpectedReply},
			{"error text inside the requests' integers", "return {-1, 1, 2, 3, 0, 0, 0}", ErrUnexpectedReply},
			{"not integers", "return {1, 'x', 0, 0, 0, 0, 0}", ErrUnexpectedReply},
			{"a nil", "return {1, false, 0, 0, 0, 0, 0}", ErrUnexpectedReply},
		} {
			l, err := New(b.Client, "odd", PerSecond(5), WithKeyPrefix(b.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			l.useScript(scriptOf("local t = redis.call('TIME') " + c.src))
			_, err = l.Allow(ctx)
			if err == nil || c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("%s: got %v, want %v", c.name, err, c.want)
			}
			t.Logf("%s: %v", c.name, err)
		}
	})
}

// A script the server does not have (a restart or SCRIPT FLUSH lost it) runs by EVAL,
// once, then by EVALSHA again; a script's own errors come back mapped.
func TestNoScriptRunsEvalOnce(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		l, err := New(b.Client, "once", PerHour(10), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := scriptFlush(ctx, b.Client); err != nil {
			t.Fatal(err)
		}
		var evals sendScriptCalls // EVALs sent, answered or not
		b.Client.AddHook(sendPipeHook(func(cmds []redis.Cmder) {
			for _, cmd := range cmds {
				if cmd.Name() == "eval" {
					evals.n.Add(1)
				}
			}
		}))
		for want := 9; want >= 8; want-- { // the first by EVAL, the second by EVALSHA
			res, err := l.Allow(ctx)
			if err != nil || res.Remaining != want {
				t.Fatalf("Allow #%d: got %+v, %v; want %d remaining (run once)", 10-want, res, err, want)
			}
			if got := evals.n.Load(); got != 1 {
				t.Fatalf("after Allow #%d: %d calls by EVAL, want 1 (the first, after NOSCRIPT)", 10-want, got)
			}
		}
		fail, err := New(b.Client, "once-fails", PerHour(10), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		fail.useScript(scriptOf("local t = redis.call('TIME') return redis.error_reply('JTARG test')"))
		if _, err := fail.Allow(ctx); !errors.Is(err, ErrInvalidArgument) {
			t.Fatalf("a script that fails: got %v, want its JTARG reply as ErrInvalidArgument", err)
		}
		if got := evals.n.Load(); got != 2 {
			t.Fatalf("%d calls by EVAL, want 2 (the failing script, new to the server, once)", got)
		}
	})
}

// sendTxCount counts the script calls sent in a transaction (MULTI/EXEC) and those sent
// as plain commands.
type sendTxCount struct {
	mu        sync.Mutex
	tx, plain int
}

func (c *sendTxCount) see(cmds []redis.Cmder) {
	c.mu.Lock()
	defer c.mu.Unlock()
	multi := false
	for _, cmd := range cmds {
		switch {
		case cmd.Name() == "multi":
			multi = true
		case sendIsEval(cmd) && multi:
			c.tx++
		case sendIsEval(cmd):
			c.plain++
		}
	}
}

func (c *sendTxCount) get() (tx, plain int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tx, c.plain
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
		var c sendTxCount
		rdb.AddHook(sendPipeHook(c.see))
		l, err := New(rdb, fmt.Sprint("plain", retries), PerHour(10), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := direct.Client.ScriptLoad(ctx, l.t.script.src).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := l.Allow(ctx); err != nil {
			t.Fatal(err)
		}
		tx, plain := c.get()
		if wantTx := retries >= 0; (tx == 1) != wantTx || (plain == 1) == wantTx {
			t.Fatalf("MaxRetries %d: got %d transactions, %d plain calls; want a transaction %v", retries, tx, plain, wantTx)
		}
		if retries >= 0 {
			continue
		}
		proxy.DropReplyTo("evalsha")
		if _, err := l.Allow(ctx); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("MaxRetries %d, reply lost: got %v, want ErrUnavailable", retries, err)
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil || res.Remaining != 8 { // 10 less the call above and the lost one
			t.Fatalf("MaxRetries %d, after a lost reply: got %+v, %v; want 8 remaining (charged once)", retries, res, err)
		}
	}
}
