package throttle

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/waiter"
	"github.com/redis/go-redis/v9"
)

// Errors name their cause: what made Redis unreachable (a refused dial, a reset
// connection), Redis's own refusal (NOPERM), each under the package's prefix, once.

// wantOnePrefix fails the test unless err's message starts with "jobthrottle: " and
// says it nowhere else.
func wantOnePrefix(t *testing.T, what string, err error) {
	t.Helper()
	if msg := err.Error(); !strings.HasPrefix(msg, "jobthrottle: ") || strings.Count(msg, "jobthrottle: ") != 1 {
		t.Errorf("%s: got %q, want it to start with \"jobthrottle: \" and say it once", what, msg)
	}
}

// A call that gets go-redis's failure names it, and a call cut by its deadline after it
// names the last failure seen (the library watches nothing of the Redis client itself:
// a call cut before go-redis reports anything says only that no reply came): a client
// of a refused port, a cluster client whose every node refuses, a client of a server
// that resets every connection (what go-redis reports of it: EOF). The errors wrap ErrUnavailable and the cause, the cut
// one context.DeadlineExceeded too, each under one prefix.
func TestErrorsNameTheCause(t *testing.T) {
	parallel(t)
	reset := sendResettingServer(t)
	for _, c := range []struct {
		name, says string
		cause      error
		rdb        redis.UniversalClient
	}{
		{"refused", "connection refused", syscall.ECONNREFUSED, redis.NewClient(&redis.Options{Addr: redistest.RefusedAddr})},
		{"cluster refused", "connection refused", syscall.ECONNREFUSED,
			redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{redistest.RefusedAddr}})},
		// go-redis retries the read a reset cut, and the retry's EOF is what it reports
		{"reset", "EOF", io.EOF, redis.NewClient(&redis.Options{Addr: reset})},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer c.rdb.Close()
			l, err := New(c.rdb, "cause", PerSecond(10), WithCallTimeout(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			_, err = l.Allow(context.Background())
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, c.cause) || errors.Is(err, context.DeadlineExceeded) ||
				!strings.Contains(err.Error(), c.says) {
				t.Fatalf("a call that gets go-redis's failure: got %v, want ErrUnavailable saying %q", err, c.says)
			}
			wantOnePrefix(t, c.name, err)
			redistest.Figure(t, "%s, go-redis's defaults: Allow took %v: %v", c.name, time.Since(start).Round(time.Millisecond), err)
			ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
			defer cancel()
			if _, err = l.Allow(ctx); errors.Is(err, context.DeadlineExceeded) { // cut (else go-redis failed fast)
				if !errors.Is(err, ErrUnavailable) || !errors.Is(err, c.cause) || !strings.Contains(err.Error(), c.says) {
					t.Fatalf("a call cut by its deadline after it: got %v, want ErrUnavailable and context.DeadlineExceeded, saying %q", err, c.says)
				}
			} else if !errors.Is(err, ErrUnavailable) || !errors.Is(err, c.cause) {
				t.Fatalf("a call after it: got %v, want ErrUnavailable naming the cause", err)
			}
			wantOnePrefix(t, c.name+", cut", err)
		})
	}
}

// sendResettingServer listens on a free port and resets every connection once it has
// read from it; it stops with the test.
func sendResettingServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				buf := make([]byte, 4096)
				_, _ = c.Read(buf)
				_ = c.(*net.TCPConn).SetLinger(0) // close with a reset
				c.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

// A Redis user without a permission the library needs gets ErrNoPermission with
// Redis's own text: a command refused (no EVALSHA) or a key refused (not under the
// prefix its rules allow), for a Limiter and a Semaphore.
func TestNoPermissionSaysWhat(t *testing.T) {
	_, admin := startOwnServer(t)
	ctx := context.Background()
	for _, c := range []struct {
		user, rules string
	}{
		{"noevalsha", strings.Replace(ACLRules("jt-acl:"), " +evalsha", "", 1)},
		{"otherkeys", ACLRules("elsewhere:")},
	} {
		if err := admin.Do(ctx, append([]any{"ACL", "SETUSER", c.user, "on", ">pw"}, sendFields(c.rules)...)...).Err(); err != nil {
			t.Fatal(err)
		}
		rdb := redis.NewClient(&redis.Options{Addr: admin.Options().Addr, Username: c.user, Password: "pw"})
		defer rdb.Close()
		l, err := New(rdb, "k", PerSecond(10), WithKeyPrefix("jt-acl:"))
		if err != nil {
			t.Fatal(err)
		}
		s, err := NewSemaphore(rdb, "k", 2, WithKeyPrefix("jt-acl:"))
		if err != nil {
			t.Fatal(err)
		}
		_, err = l.Allow(ctx)
		_, _, serr := s.TryAcquire(ctx)
		for what, err := range map[string]error{"Allow": err, "TryAcquire": serr} {
			var rerr redis.Error
			if !errors.Is(err, ErrNoPermission) || !errors.As(err, &rerr) || !strings.Contains(err.Error(), "NOPERM") {
				t.Errorf("%s, user %s: got %v, want ErrNoPermission wrapping Redis's NOPERM", what, c.user, err)
				continue
			}
			wantOnePrefix(t, what+" of user "+c.user, err)
			t.Logf("%s, user %s: %v", what, c.user, err)
		}
	}
}

// sendFields splits rules into the arguments of ACL SETUSER.
func sendFields(rules string) []any {
	var out []any
	for _, f := range strings.Fields(rules) {
		out = append(out, f)
	}
	return out
}

// The errors that wrap another package's sentinel carry the prefix too: a Wait whose
// permits would come after its deadline, one held by this process's Pause past it, a
// nil Limiter's Reserve.
func TestWaiterErrorsCarryThePrefix(t *testing.T) {
	b := redistest.NewMini(t)
	ctx := context.Background()
	l, err := New(b.Client, "prefixed", PerHour(1), WithKeyPrefix(b.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	err = l.Wait(short)
	if !errors.Is(err, waiter.ErrWouldExceedDeadline) {
		t.Fatalf("Wait for a permit an hour away with a minute left: got %v, want waiter.ErrWouldExceedDeadline", err)
	}
	wantOnePrefix(t, "Wait past its deadline", err)
	if err := l.Pause(ctx, time.Hour); err != nil {
		t.Fatal(err)
	}
	err = l.Wait(short)
	if !errors.Is(err, waiter.ErrWouldExceedDeadline) {
		t.Fatalf("Wait while this process holds the key an hour: got %v, want waiter.ErrWouldExceedDeadline", err)
	}
	wantOnePrefix(t, "Wait held past its deadline", err)
	var none *Limiter
	_, err = none.Reserve(ctx, 1, 0)
	if !errors.Is(err, waiter.ErrNilReserver) {
		t.Fatalf("Reserve of a nil Limiter: got %v, want waiter.ErrNilReserver", err)
	}
	wantOnePrefix(t, "Reserve of a nil Limiter", err)
	err = none.Wait(ctx)
	if !errors.Is(err, waiter.ErrNilReserver) {
		t.Fatalf("Wait of a nil Limiter: got %v, want waiter.ErrNilReserver", err)
	}
	wantOnePrefix(t, "Wait of a nil Limiter", err)
}
