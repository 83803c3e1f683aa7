package throttle

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A full Redis (used memory above maxmemory, under noeviction, the default policy)
// refuses every command queued in MULTI, and a script's first write of a command that
// may grow memory (SET, ZADD…). Calls that grant stay in MULTI and fail at once with
// ErrUnavailable naming OOM: Allow, Wait, TryAcquire, and Acquire, which returns the
// error rather than waiting for its deadline. Calls that are safe to repeat go again
// outside MULTI and keep working: a semaphore's Extend and Release (the release hands
// the slot to the caller queued for it), and both Inspects; an extend that went in one
// script call with an acquire goes again alone. On a redis-server and on the master of
// a Cluster that holds the key. Reported: how long the refused calls took.
func TestFullRedis(t *testing.T) {
	parallel(t)
	t.Run("redis-server", func(t *testing.T) {
		_, c := startOwnServer(t, "--maxmemory-policy", "noeviction")
		fullRedis(t, c, func(string) *redis.Client { return c })
	})
	t.Run("cluster", func(t *testing.T) {
		_, cc := redistest.OwnCluster(t)
		fullRedis(t, cc, func(key string) *redis.Client {
			node, err := cc.MasterForKey(context.Background(), key)
			if err != nil {
				t.Fatal(err)
			}
			return node
		})
	})
}

func fullRedis(t *testing.T, rdb redis.UniversalClient, nodeOf func(key string) *redis.Client) {
	ctx := context.Background()
	// (an hour's period: the Allow below still counts when Inspect reads it, however
	// long the setup took)
	l, err := New(rdb, "full", Limit{Rate: 100, Period: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s, err := NewSemaphore(rdb, "full", 2, WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Allow(ctx); err != nil {
		t.Fatal(err)
	}
	kept, freed := mustTry(t, s), mustTry(t, s)
	type acquired struct {
		lease *Lease
		err   error
	}
	queued := make(chan acquired, 1)
	actx, cancel := context.WithCancel(ctx)
	t.Cleanup(cancel)
	go func() { // queued for the slot freed below
		w, err := s.Acquire(actx)
		queued <- acquired{w, err}
	}()
	eventually(t, signalWait, "the Acquire queued", func() bool {
		st, err := s.Inspect(ctx)
		return err == nil && st.Waiting == 1
	})

	node := nodeOf(l.stateKey())
	used := infoInt(ctx, node, "memory", "used_memory")
	if err := node.ConfigSet(ctx, "maxmemory", strconv.FormatInt(used/2, 10)).Err(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.ConfigSet(context.Background(), "maxmemory", "0") })
	if err := node.Set(ctx, "{jobthrottle:full}:probe", "x", 0).Err(); err == nil || !redis.HasErrorPrefix(err, "OOM") {
		t.Fatalf("SET with maxmemory at half the memory used: %v, want OOM", err)
	}

	refused := func(what string, call func(ctx context.Context) error) {
		t.Helper()
		deadline, cancel := context.WithTimeout(ctx, signalWait)
		defer cancel()
		start := time.Now()
		err := call(deadline)
		took := time.Since(start)
		wantUnavailable(t, what+" on a full Redis", err, "OOM command not allowed")
		if errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s on a full Redis waited for its deadline: %v", what, err)
		}
		redistest.Figure(t, "%s on a full Redis: refused in %v: %v", what, took.Round(time.Microsecond), err)
	}
	refused("Allow", func(ctx context.Context) error { _, err := l.Allow(ctx); return err })
	refused("Wait", func(ctx context.Context) error { return l.Wait(ctx) })
	refused("TryAcquire", func(ctx context.Context) error { _, _, err := s.TryAcquire(ctx); return err })
	refused("Acquire", func(ctx context.Context) error { _, err := s.Acquire(ctx); return err })

	if err := kept.Extend(ctx); err != nil {
		t.Errorf("Extend on a full Redis: %v", err)
	}
	// an acquire and an extend in one script call: the acquire stays refused, the
	// extend goes again alone
	cl := s.client()
	ks := cl.key(s.t.tag)
	req := func(op int, token string) *request {
		return &request{ctx: ctx, t: s.t, ks: ks, fields: []any{op, token, token, false}, timeout: s.timeout}
	}
	res := cl.doAll([]*request{req(semAcquire, newToken()), req(semExtend, kept.ID())})
	wantUnavailable(t, "an acquire batched with an extend, on a full Redis", res[0].err, "OOM command not allowed")
	if res[1].err != nil || res[1].rep.v[0] != 1 {
		t.Errorf("an extend batched with an acquire, on a full Redis: %v, %v; want it renewed", res[1].rep.v, res[1].err)
	}
	if st, err := l.Inspect(ctx); err != nil || st.Limits[0].Used != 1 {
		t.Errorf("Limiter.Inspect on a full Redis: %+v, %v; want 1 used", st, err)
	}
	if st, err := s.Inspect(ctx); err != nil || st.Held != 2 || st.Waiting != 1 {
		t.Errorf("Semaphore.Inspect on a full Redis: %+v, %v; want 2 held, 1 waiting", st, err)
	}
	if err := freed.Release(ctx); err != nil {
		t.Errorf("Release on a full Redis: %v", err)
	}
	select {
	case a := <-queued:
		if a.err != nil {
			t.Fatalf("the queued Acquire: %v; want the lease released on the full Redis", a.err)
		}
		if err := a.lease.Release(ctx); err != nil {
			t.Errorf("Release of the lease handed over, on a full Redis: %v", err)
		}
	case <-time.After(signalWait):
		t.Fatalf("the queued Acquire got no lease within %v of the release", signalWait)
	}
	if st, err := s.Inspect(ctx); err != nil || st.Held != 1 || st.Waiting != 0 {
		t.Errorf("Semaphore.Inspect after the releases: %+v, %v; want 1 held, none waiting", st, err)
	}

	if err := node.ConfigSet(ctx, "maxmemory", "0").Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx); err != nil || !r.Allowed {
		t.Errorf("Allow once Redis has room: %+v, %v", r, err)
	}
	if err := kept.Release(ctx); err != nil {
		t.Errorf("Release once Redis has room: %v", err)
	}
}
