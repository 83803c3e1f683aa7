package throttle

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// sendReplyError is an error reply as go-redis gives it: a redis.Error.
type sendReplyError string

func (e sendReplyError) Error() string { return string(e) }

func (sendReplyError) RedisError() {}

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

// Every condition of Redis that is not the caller's fault is ErrUnavailable, naming
// Redis's own reply: each reply of unavailableReplies, as miniredis gives it inside
// MULTI (refused, then EXECABORT) to a Limiter and a Semaphore; and on real servers
// the conditions themselves.
func TestUnavailableReplies(t *testing.T) {
	b := redistest.NewMiniRealTime(t)
	ctx := context.Background()
	l, err := New(b.Client, "replies", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSemaphore(b.Client, "replies", 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range unavailableReplies {
		reply := strings.TrimSpace(p) + " the server says why"
		b.SetError(reply)
		_, err := l.Allow(ctx)
		wantUnavailable(t, "Allow, "+reply, err, reply)
		_, _, err = s.TryAcquire(ctx)
		wantUnavailable(t, "TryAcquire, "+reply, err, reply)
	}
	for _, reply := range []string{"BUSYKEY Target key name already exists.", "ERR unknown command", "OOMPH not a reply Redis gives",
		"EXECABORT Transaction discarded because of: NOPERM this user has no permissions to run the 'exec' command"} {
		b.SetError(reply)
		if _, err := l.Allow(ctx); err == nil || errors.Is(err, ErrUnavailable) {
			t.Errorf("%q: got %v, want an error that is not ErrUnavailable", reply, err)
		}
	}
	b.SetError("")
	if _, err := l.Allow(ctx); err != nil {
		t.Fatal(err)
	}
}

// wantUnavailable fails the test unless err wraps ErrUnavailable and says says.
func wantUnavailable(t *testing.T, what string, err error, says string) {
	t.Helper()
	if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), says) {
		t.Errorf("%s: got %v, want ErrUnavailable saying %q", what, err, says)
	}
}

// A full Redis (above maxmemory, under noeviction) refuses a call queued in MULTI with OOM;
// the call fails ErrUnavailable naming it.
func TestUnavailableWhenFull(t *testing.T) {
	_, c := startOwnServer(t, "--maxmemory-policy", "noeviction")
	ctx := context.Background()
	l, err := New(c, "full", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	for i := range 10 { // 1 MB of data, then a maxmemory below it
		if err := c.Set(ctx, "ballast-"+itoa(i), strings.Repeat("x", 100<<10), 0).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ConfigSet(ctx, "maxmemory", "512kb").Err(); err != nil {
		t.Fatal(err)
	}
	_, err = l.Allow(ctx)
	wantUnavailable(t, "Allow on a full Redis", err, "OOM command not allowed")
	redistest.Figure(t, "a full Redis: %v", err)
}

// A Redis running another client's long script answers BUSY once the script has run
// past busy-reply-threshold; a call then fails ErrUnavailable naming it.
func TestUnavailableWhileBusy(t *testing.T) {
	_, c := startOwnServer(t, "--busy-reply-threshold", "50")
	ctx := context.Background()
	l, err := New(c, "busy", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	stop := busyScript(t, c, time.Second)
	defer stop()
	_, err = l.Allow(ctx)
	wantUnavailable(t, "Allow while another script runs", err, "BUSY")
	redistest.Figure(t, "a busy Redis: %v", err)
}

// busyScript runs a script on a connection of its own that keeps the server busy for d
// (read-only, so SCRIPT KILL may end it), and returns once the server answers BUSY;
// the function it returns ends the script and waits for it.
func busyScript(t *testing.T, c *redis.Client, d time.Duration) (stop func()) {
	t.Helper()
	ctx := context.Background()
	spin := redis.NewClient(&redis.Options{Addr: c.Options().Addr, ReadTimeout: -1, MaxRetries: -1})
	done := make(chan error, 1)
	go func() {
		done <- spin.Eval(ctx, `local t = redis.call('TIME'); local stop = t[1] * 1000000 + t[2] + tonumber(ARGV[1])
			repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop`, nil, d.Microseconds()).Err()
	}()
	probe := redis.NewClient(&redis.Options{Addr: c.Options().Addr, MaxRetries: -1})
	for deadline := time.Now().Add(signalWait); ; time.Sleep(5 * ms) {
		if err := probe.Ping(ctx).Err(); err != nil && strings.HasPrefix(err.Error(), "BUSY") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never answered BUSY within %v", signalWait)
		}
	}
	return func() {
		_ = probe.ScriptKill(ctx).Err()
		<-done
		probe.Close()
		spin.Close()
	}
}

// A replica refuses writes with READONLY, and, cut off from its master with
// replica-serve-stale-data no, answers MASTERDOWN; a server at maxclients closes the
// connection (Redis writes "ERR max number of clients reached" first, which go-redis
// reads only if its own first write came before the close). Each is ErrUnavailable.
func TestUnavailableReplicaAndMaxclients(t *testing.T) {
	parallel(t)
	ctx := context.Background()
	master, _ := startOwnServer(t)
	host, port, _ := strings.Cut(master.Addr, ":")
	_, replica := startOwnServer(t, "--replicaof", host, port, "--replica-serve-stale-data", "no")
	for deadline := time.Now().Add(signalWait); ; time.Sleep(10 * ms) {
		info, _ := replica.Info(ctx, "replication").Result()
		if strings.Contains(info, "master_link_status:up") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the replica's link is not up within %v", signalWait)
		}
	}
	l, err := New(replica, "replica", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Allow(ctx)
	wantUnavailable(t, "Allow on a replica", err, "READONLY")
	redistest.Figure(t, "a replica: %v", err)

	master.Kill()
	killed := time.Now()
	for deadline := time.Now().Add(signalWait); ; time.Sleep(10 * ms) {
		_, err = l.Allow(ctx)
		if err != nil && strings.Contains(err.Error(), "MASTERDOWN") || time.Now().After(deadline) {
			break
		}
	}
	wantUnavailable(t, "Allow on a replica whose master is down", err, "MASTERDOWN")
	redistest.Figure(t, "a replica cut off, %v after its master was killed: %v", time.Since(killed).Round(ms), err)

	full, held := startOwnServer(t, "--maxclients", "1")
	if err := held.Ping(ctx).Err(); err != nil { // the one connection allowed
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: full.Addr})
	defer c.Close()
	l, err = New(c, "maxclients", PerSecond(5))
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Allow(ctx)
	if !errors.Is(err, ErrUnavailable) {
		t.Errorf("Allow at maxclients: got %v, want ErrUnavailable", err)
	}
	redistest.Figure(t, "at maxclients: %v", err)
}

// A go-redis client closed (a worker shutting down) is ErrUnavailable naming
// redis.ErrClosed for every call made through it afterwards, as for a call in flight as
// it closed (whose connection closes under it: "use of closed network connection"), so
// the failure policy and the middlewares' hand-backs treat both alike. Before, a call
// made after the close got an error of no type of this package's, which a job
// middleware took for a failure of the job.
func TestClosedClientIsUnavailable(t *testing.T) {
	redistest.Each(t, func(t *testing.T, b *redistest.Backend) {
		ctx := context.Background()
		addrs, cluster := b.Addrs()
		rdb := redistest.Dial(addrs, cluster)
		l, err := New(rdb, "closed", PerHour(1), WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		open, err := New(rdb, "closed-open", PerHour(1), WithKeyPrefix(b.Prefix), WithFailurePolicy(FailOpen))
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSemaphore(rdb, "closed", 1, WithKeyPrefix(b.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		lease := mustTry(t, s)
		if err := rdb.Close(); err != nil {
			t.Fatal(err)
		}
		short, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		for _, c := range []struct {
			name string
			call func() error
		}{
			{"Allow", func() error { _, err := l.Allow(ctx); return err }},
			{"Wait", func() error { return l.Wait(short) }},
			{"Reserve", func() error { _, err := l.Reserve(ctx, 1, time.Hour); return err }},
			{"Limiter.Inspect", func() error { _, err := l.Inspect(ctx); return err }},
			{"Pause", func() error { return l.Pause(ctx, time.Second) }},
			{"TryAcquire", func() error { _, _, err := s.TryAcquire(ctx); return err }},
			{"Acquire", func() error { _, err := s.Acquire(short); return err }},
			{"Extend", func() error { return lease.Extend(ctx) }},
			{"Release", func() error { return lease.Release(ctx) }},
			{"Semaphore.Inspect", func() error { _, err := s.Inspect(ctx); return err }},
		} {
			if err := c.call(); !errors.Is(err, ErrUnavailable) || !errors.Is(err, redis.ErrClosed) {
				t.Errorf("%s on a closed client: %v, want ErrUnavailable naming redis.ErrClosed", c.name, err)
			}
		}
		if r, err := open.Allow(ctx); err != nil || !r.Allowed {
			t.Errorf("FailOpen Allow on a closed client: %+v, %v; want granted by the policy", r, err)
		}
	})
}
