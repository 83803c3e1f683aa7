package throttle

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
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

// sendDials is a go-redis hook that counts failed dials.
type sendDials struct{ failed atomic.Int64 }

func (d *sendDials) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }
func (d *sendDials) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (d *sendDials) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := next(ctx, network, addr)
		if err != nil {
			d.failed.Add(1)
		}
		return conn, err
	}
}

// A refused dial fails the call at once, naming the refusal (go-redis alone dials five
// times 100ms apart per try, and tries four times: 2.08s a call with its defaults):
// with a minute between go-redis's dials, a call has its error when the first dial has
// failed, the second not yet made. The error wraps ErrUnavailable and the refusal,
// and not context.DeadlineExceeded (the deadline did not pass).
func TestRefusedDialFailsFast(t *testing.T) {
	for _, withDeadline := range []bool{false, true} {
		rdb := redis.NewClient(&redis.Options{Addr: redistest.RefusedAddr, DialerRetryTimeout: time.Minute})
		defer rdb.Close()
		l, err := New(rdb, "refused", PerSecond(10))
		if err != nil {
			t.Fatal(err)
		}
		var dials sendDials // inside the library's hook: counted before the call can end
		rdb.AddHook(&dials)
		ctx, cancel := context.Background(), context.CancelFunc(func() {})
		if withDeadline {
			ctx, cancel = context.WithTimeout(ctx, time.Hour)
		}
		_, err = l.Allow(ctx)
		cancel()
		if n := dials.failed.Load(); n != 1 {
			t.Errorf("deadline %v: the call returned after %d failed dials, want 1 (the first)", withDeadline, n)
		}
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, context.DeadlineExceeded) ||
			!strings.Contains(err.Error(), "connection refused") {
			t.Errorf("deadline %v: got %v, want ErrUnavailable naming the refusal", withDeadline, err)
		}
		wantOnePrefix(t, "a refused dial", err)
	}
	// the figure with go-redis's defaults
	rdb := redis.NewClient(&redis.Options{Addr: redistest.RefusedAddr})
	defer rdb.Close()
	l, err := New(rdb, "refused", PerSecond(10))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = l.Allow(context.Background())
	redistest.Figure(t, "a refused Redis, go-redis's defaults: Allow took %v: %v", time.Since(start).Round(time.Microsecond), err)
}

// A call cut by its deadline while go-redis still retries names the cause it saw:
// a cluster client whose every node refuses (its slot map cannot load: no dial of a
// node to end the call with), and a client of a server that resets every connection
// (go-redis retries it, a minute apart here). The error wraps ErrUnavailable,
// context.DeadlineExceeded and the cause, and says it.
func TestCutByDeadlineNamesTheCause(t *testing.T) {
	reset := sendResettingServer(t)
	for _, c := range []struct {
		name, says string
		cause      error
		rdb        redis.UniversalClient
	}{
		{"cluster refused", "connection refused", syscall.ECONNREFUSED,
			redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{redistest.RefusedAddr}, DialerRetryTimeout: time.Minute})},
		{"reset", "connection reset", syscall.ECONNRESET,
			redis.NewClient(&redis.Options{Addr: reset, MinRetryBackoff: time.Minute, MaxRetryBackoff: time.Minute})},
	} {
		t.Run(c.name, func(t *testing.T) {
			defer c.rdb.Close()
			l, err := New(c.rdb, "cut", PerSecond(10))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			_, err = l.Allow(ctx)
			if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, c.cause) ||
				!strings.Contains(err.Error(), c.says) {
				t.Fatalf("the first call, cut by its deadline: got %v, want ErrUnavailable and context.DeadlineExceeded, saying %q", err, c.says)
			}
			wantOnePrefix(t, c.name, err)
			redistest.Figure(t, "%s: %v", c.name, err)
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
}
