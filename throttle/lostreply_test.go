package throttle

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
)

// A reply lost after the script ran (the connection drops) must not charge twice.
// go-redis re-sends a plain command after such a loss; the limiter runs its scripts in
// MULTI/EXEC, which go-redis never re-sends once written, so the call fails with
// ErrUnavailable and the permit is charged once. The first half shows the fault is
// real: the plain EVALSHA through the same proxy charges twice.
func TestLostReplyChargesOnce(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t) // rdb: go-redis defaults, 3 retries
	ctx := context.Background()

	// the fault, shown on a plain script call
	keys := []string{"{" + direct.Prefix + "plain}:sw", "{" + direct.Prefix + "plain}:pause"}
	lua.SlidingWindow.Script().Load(ctx, rdb)
	proxy.DropReplyTo("evalsha")
	if err := lua.SlidingWindow.Script().Run(ctx, rdb, keys, 0, 1, 0, 1, 10, 60_000_000).Err(); err != nil {
		t.Fatalf("plain call: %v", err)
	}
	charged := direct.Client.LRange(ctx, keys[0], -1, -1).Val()
	if proxy.Dropped() != 1 || len(charged) != 1 || charged[0] != "2" {
		t.Fatalf("plain EVALSHA after a lost reply: log tail %v (dropped %d); want 2 permits charged for one call", charged, proxy.Dropped())
	}

	for _, alg := range allAlgorithms {
		l, err := New(rdb, "once"+alg.String(), PerMinute(10), WithAlgorithm(alg), WithKeyPrefix(direct.Prefix))
		if err != nil {
			t.Fatal(err)
		}
		if err := l.script.Load(ctx, rdb).Err(); err != nil { // so the lost reply is the script's
			t.Fatal(err)
		}
		proxy.DropReplyTo("exec")
		_, err = l.Allow(ctx)
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v: Allow with its reply lost: %v, want ErrUnavailable", alg, err)
		}
		res, err := l.AllowN(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		if res.Remaining != 9 {
			t.Fatalf("%v: %d permits remain after one lost call, want 9 (charged once)", alg, res.Remaining)
		}
		// and a booking whose cancel reply is lost is given back once
		l.AllowN(ctx, 9)
		r, err := l.Reserve(ctx, 1, 2*time.Minute)
		if err != nil || !r.OK() {
			t.Fatalf("%v: booking: %v %v", alg, r, err)
		}
		r2, err := l.Reserve(ctx, 1, 2*time.Minute)
		if err != nil || !r2.OK() {
			t.Fatalf("%v: booking: %v %v", alg, r2, err)
		}
		proxy.DropReplyTo("exec")
		if err := r2.Cancel(ctx); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("%v: cancel with its reply lost: %v", alg, err)
		}
		if got := direct.Client.Exists(ctx, l.keys[0]).Val(); got != 1 {
			t.Fatalf("%v: state gone", alg)
		}
		// the slot went back once: the next booking gets it (tolerance 1s: Due counts
		// from when each reply arrived, and on a busy machine the round trips differ by
		// tens of ms; slots are 6s apart at 10 a minute)
		r3, err := l.Reserve(ctx, 1, 2*time.Minute)
		if d := r3.Due().Sub(r2.Due()); err != nil || !r3.OK() || d > time.Second || d < -time.Second {
			t.Fatalf("%v: after a cancel whose reply was lost the next booking is due %v after the cancelled one", alg, d)
		}
	}
	redistest.Figure(t, "a lost reply (dropped by a proxy after the script ran): plain EVALSHA with go-redis retries charged 2 permits for 1 call; "+
		"the limiter (MULTI/EXEC) charged 1 for 1, and a cancel whose reply was lost gave back 1, for each of %d algorithms (%d replies dropped)",
		len(allAlgorithms), proxy.Dropped())
}

// Semaphore calls and Pause run at most once too. A Release whose reply is lost freed
// its slot once and reports ErrUnavailable, never ErrLeaseLost; on a plain EVALSHA
// (the first half) go-redis's retry ran the release again, which found the lease gone
// and answered "not held": the lease reported lost although its release worked. A Pause
// whose reply is lost fails with ErrUnavailable and the pause it set stands.
func TestLostReplySemaphoreAndPauseOnce(t *testing.T) {
	direct, proxy, rdb := redistest.NewProxied(t) // rdb: go-redis defaults, 3 retries
	ctx := context.Background()

	// the fault, shown on a plain script call: a release that worked answers "not held"
	tag := "{" + direct.Prefix + "plainsem}"
	keys := []string{tag + ":sem", tag + ":semq", tag + ":semx", tag + ":pause"}
	id := strings.Repeat("ab", 16)
	if err := lua.Semaphore.Script().Run(ctx, rdb, keys, semAcquire, id, 1, 60_000_000, 0).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("evalsha")
	v, err := lua.Semaphore.Script().Run(ctx, rdb, keys, semRelease, id, 1, 60_000_000, 0).Int64Slice()
	if err != nil || proxy.Dropped() != 1 || len(v) != 3 || v[0] != 0 {
		t.Fatalf("plain EVALSHA release after a lost reply: %v, %v (dropped %d); want ok 0: the retry found the lease released", v, err, proxy.Dropped())
	}

	s, err := NewSemaphore(rdb, "semonce", 2, WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.script.Load(ctx, rdb).Err(); err != nil { // so the lost reply is the script's
		t.Fatal(err)
	}
	a, _, err := s.TryAcquire(ctx)
	if err != nil || a == nil {
		t.Fatalf("TryAcquire: %v %v", a, err)
	}
	b, _, err := s.TryAcquire(ctx)
	if err != nil || b == nil {
		t.Fatalf("TryAcquire: %v %v", b, err)
	}
	proxy.DropReplyTo("exec")
	if err := a.Release(ctx); !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Release with its reply lost: %v, want ErrUnavailable (not ErrLeaseLost)", err)
	}
	if held := direct.Client.ZRange(ctx, s.keys[0], 0, -1).Val(); len(held) != 1 || held[0] != b.ID() {
		t.Fatalf("leases after one lost release: %v, want only the other lease %s (released once)", held, b.ID())
	}
	proxy.DropReplyTo("exec")
	if err := b.Extend(ctx); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Extend with its reply lost: %v, want ErrUnavailable", err)
	}
	if err := b.Release(ctx); err != nil {
		t.Fatalf("Release after a lost Extend: %v (the extension ran once, the lease is live)", err)
	}

	l, err := New(rdb, "pauseonce", PerMinute(10), WithKeyPrefix(direct.Prefix))
	if err != nil {
		t.Fatal(err)
	}
	if err := lua.Pause.Script().Load(ctx, rdb).Err(); err != nil {
		t.Fatal(err)
	}
	proxy.DropReplyTo("exec")
	if err := l.Pause(ctx, time.Minute); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Pause with its reply lost: %v, want ErrUnavailable (it ran in MULTI/EXEC)", err)
	}
	if ttl := direct.Client.PTTL(ctx, l.keys[1]).Val(); ttl <= 50*time.Second || ttl > time.Minute {
		t.Fatalf("pause key's TTL after a Pause whose reply was lost: %v, want about 1m (set once)", ttl)
	}
	if res, err := l.Allow(ctx); err != nil || res.Allowed {
		t.Fatalf("Allow during the pause: %+v, %v; want denied", res, err)
	}
	redistest.Figure(t, "a lost reply on semaphore calls and Pause: plain EVALSHA release with go-redis retries answered "+
		"'not held' for a release that worked; Lease.Release (MULTI/EXEC) freed the slot once and returned ErrUnavailable, "+
		"Extend and Pause ran once (%d replies dropped)", proxy.Dropped())
}
