package throttle

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/protocol"
	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// sendPlainCall runs one request of t's script as a plain command (EVALSHA outside
// MULTI/EXEC), as go-redis sends a lone command: re-sent when its reply is lost.
func sendPlainCall(ctx context.Context, rdb redis.UniversalClient, t *target, call *protocol.Request, fields ...any) ([]int64, error) {
	g := &group{t: t, reqs: []*request{{call: call, fields: fields}}}
	cmd := g.command(ctx, false)
	_ = rdb.Process(ctx, cmd)
	return cmd.Result()
}

// A reply lost after the script ran (the connection drops) must not charge twice.
// go-redis re-sends a plain command after such a loss; the scripts go in MULTI/EXEC,
// which go-redis never re-sends once written, so the call fails with ErrUnavailable
// and the permit is charged once, whatever the client's options. The first half shows
// the fault is real: the plain EVALSHA through the same proxy charges twice.
func TestLostReplyChargesOnce(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t) // rdb: go-redis defaults, 3 retries
	ctx := context.Background()

	// the fault, shown on a plain script call
	plain, err := New(rdb, "plain", PerMinute(10), WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptLoad(ctx, plain.t.script.src).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("evalsha")
	if _, err := sendPlainCall(ctx, rdb, plain.t, &protocol.Request{Op: protocol.OpAcquire, N: 1}); err != nil {
		t.Fatalf("plain call: %v", err)
	}
	if res, err := plain.AllowN(ctx, 0); proxy.Dropped() != 1 || err != nil || res.Remaining != 8 {
		t.Fatalf("plain EVALSHA after a lost reply: %+v, %v (dropped %d); want 2 permits charged for one call (8 remaining) to show the fault",
			res, err, proxy.Dropped())
	}

	cte := redis.NewClient(&redis.Options{Addr: proxy.Addr, ContextTimeoutEnabled: true}) // 3 retries too
	defer cte.Close()
	for _, client := range []struct {
		name string
		rdb  redis.UniversalClient
	}{{"defaults", rdb}, {"ContextTimeoutEnabled", cte}} {
		for _, alg := range allAlgorithms {
			what := client.name + "/" + alg.String()
			l, err := New(client.rdb, "once-"+what, PerMinute(10), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix))
			if err != nil {
				t.Fatal(err)
			}
			if err := rdb.ScriptLoad(ctx, l.t.script.src).Err(); err != nil { // so the lost reply is the script's
				t.Fatal(err)
			}
			proxy.DropReplyTo("exec")
			if _, err := l.Allow(ctx); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%s: Allow with its reply lost: got %v, want ErrUnavailable", what, err)
			}
			res, err := l.AllowN(ctx, 0)
			if err != nil {
				t.Fatal(err)
			}
			if res.Remaining != 9 {
				t.Fatalf("%s: %d permits remain after one lost call, want 9 (charged once)", what, res.Remaining)
			}
			// and a booking whose cancel reply is lost is given back once
			if _, err := l.AllowN(ctx, 9); err != nil {
				t.Fatal(err)
			}
			r, err := l.Reserve(ctx, 1, 2*time.Minute)
			if err != nil || !r.OK() {
				t.Fatalf("%s: booking: got %v, %v; want it booked", what, r, err)
			}
			r2, err := l.Reserve(ctx, 1, 2*time.Minute)
			if err != nil || !r2.OK() {
				t.Fatalf("%s: booking: got %v, %v; want it booked", what, r2, err)
			}
			due2 := time.Now().Add(r2.Delay())
			proxy.DropReplyTo("exec")
			if err := r2.Cancel(ctx); !errors.Is(err, ErrUnavailable) {
				t.Fatalf("%s: cancel with its reply lost: got %v, want ErrUnavailable", what, err)
			}
			if got := direct.Client.Exists(ctx, l.stateKey()).Val(); got != 1 {
				t.Fatalf("%s: the state key is gone, want it", what)
			}
			// the slot went back once: the next booking gets it (tolerance 1s: Delay
			// counts from when each reply came, and on a busy machine round trips differ
			// by tens of ms; slots are 6s apart at 10 a minute)
			r3, err := l.Reserve(ctx, 1, 2*time.Minute)
			if err != nil || !r3.OK() {
				t.Fatalf("%s: booking after the lost cancel: got %v, %v; want it booked", what, r3, err)
			}
			if d := time.Now().Add(r3.Delay()).Sub(due2); d > time.Second || d < -time.Second {
				t.Fatalf("%s: after a cancel whose reply was lost the next booking is due %v after the cancelled one, want the same slot", what, d)
			}
		}
	}
	redistest.Figure(t, "a lost reply (dropped by a proxy after the script ran): plain EVALSHA with go-redis retries charged 2 permits for 1 call; "+
		"the limiter (MULTI/EXEC) charged 1 for 1, and a cancel whose reply was lost gave back 1, for each of %d algorithms on 2 clients (%d replies dropped)",
		len(allAlgorithms), proxy.Dropped())
}

// Semaphore calls and Pause run at most once too. A Release whose reply is lost freed
// its slot once and reports ErrUnavailable, never ErrLeaseLost; on a plain EVALSHA
// (the first half) go-redis's retry ran the release again, which found the lease gone
// and answered "not held": the lease reported lost although its release worked. A Pause
// whose reply is lost fails with ErrUnavailable and the pause it set stands, once.
func TestLostReplySemaphoreAndPauseOnce(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t) // rdb: go-redis defaults, 3 retries
	ctx := context.Background()

	// the fault, shown on a plain script call: a release that worked answers "not held"
	ps, err := NewSemaphore(rdb, "plainsem", 1, WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptLoad(ctx, ps.t.script.src).Err(); err != nil {
		t.Fatal(err)
	}
	id := strings.Repeat("ab", 16)
	if v, err := sendPlainCall(ctx, rdb, ps.t, nil, semAcquire, id, id, 0); err != nil || v[0] != 1 {
		t.Fatalf("plain acquire: got %v, %v; want a lease", v, err)
	}
	proxy.DropReplyTo("evalsha")
	v, err := sendPlainCall(ctx, rdb, ps.t, nil, semRelease, id, "", 0)
	if err != nil || proxy.Dropped() != 1 || v[0] != 0 {
		t.Fatalf("plain EVALSHA release after a lost reply: got %v, %v (dropped %d); want ok 0 (the retry found the lease released) to show the fault",
			v, err, proxy.Dropped())
	}

	s, err := NewSemaphore(rdb, "semonce", 2, WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	a, b := mustTry(t, s), mustTry(t, s)
	proxy.DropReplyTo("exec")
	if err := a.Release(ctx); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Release with its reply lost: got %v, want ErrUnavailable (not ErrLeaseLost)", err)
	}
	if held := direct.Client.ZRange(ctx, s.t.keys[0], 0, -1).Val(); len(held) != 1 || held[0] != b.ID() {
		t.Fatalf("leases after one lost release: got %v, want only the other lease %s (released once)", held, b.ID())
	}
	proxy.DropReplyTo("exec")
	if err := b.Extend(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Extend with its reply lost: got %v, want ErrUnavailable", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatalf("Release after a lost Extend: got %v, want nil (the extension ran once, the lease is live)", err)
	}

	l, err := New(rdb, "pauseonce", PerMinute(10), WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := rdb.ScriptLoad(ctx, l.t.script.src).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("exec")
	if err := l.Pause(ctx, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Pause with its reply lost: got %v, want ErrUnavailable (it ran in MULTI/EXEC)", err)
	}
	if ttl := direct.Client.PTTL(ctx, l.stateKey()).Val(); ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("the state's TTL after a Pause on an idle key whose reply was lost: got %v, want about 1m (the pause set)", ttl)
	}
	if res, err := l.Allow(ctx); err != nil || res.Allowed {
		t.Fatalf("Allow during the pause: got %+v, %v; want denied", res, err)
	}
	redistest.Figure(t, "a lost reply on semaphore calls and Pause: plain EVALSHA release with go-redis retries answered "+
		"'not held' for a release that worked; Lease.Release (MULTI/EXEC) freed the slot once and returned ErrUnavailable, "+
		"Extend and Pause ran once (%d replies dropped)", proxy.Dropped())
}

// On a Redis Cluster, a call whose slot has moved since the cluster client read the slot
// map, and whose reply is then lost: the source answers MOVED (the transaction refused,
// EXECABORT), go-redis's cluster client sends it again to the target, which runs it,
// and the reply is lost (a proxy in front of the target closes the connection). The call
// fails with ErrUnavailable and the permit is charged once: nothing sends the
// transaction a third time.
func TestLostReplyAfterAMoveChargesOnce(t *testing.T) {
	parallel(t)
	tc, admin := redistest.OwnCluster(t)
	ctx := context.Background()
	probe, err := New(admin, "movedlost", PerMinute(10))
	if err != nil {
		t.Fatal(err)
	}
	move := redistest.NewSlotMove(t, tc, admin, probe.stateKey())
	target := move.Target().Options().Addr
	proxy, err := redistest.NewProxy(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: tc.Addrs(),
		Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
			if addr == target {
				addr = proxy.Addr
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		}})
	t.Cleanup(func() { cc.Close() })
	l, err := New(cc, "movedlost", PerMinute(10))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx); err != nil { // the cluster client reads the slot map
		t.Fatal(err)
	}
	if err := move.Target().ScriptLoad(ctx, l.t.script.src).Err(); err != nil { // so the lost reply is the script's
		t.Fatal(err)
	}
	move.Begin()
	move.Keys()
	move.End()
	proxy.DropReplyTo("evalsha")
	if _, err := l.Allow(ctx); !errors.Is(err, ErrUnavailable) {
		t.Errorf("Allow after the move, its reply lost: got %v, want ErrUnavailable", err)
	}
	if proxy.Dropped() != 1 {
		t.Fatalf("%d replies dropped, want 1", proxy.Dropped())
	}
	res, err := l.AllowN(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if res.Remaining != 8 {
		t.Fatalf("%d permits remain after one call and one whose reply was lost, want 8 (each charged once)", res.Remaining)
	}
}
