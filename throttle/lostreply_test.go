package throttle

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/jobthrottle/jobthrottle/lua"
	"github.com/redis/go-redis/v9"
)

// A reply lost after the script ran (the connection drops) must not charge twice.
// go-redis re-sends a plain command after such a loss; the limiter runs its scripts in
// MULTI/EXEC, which go-redis never re-sends once written, so the call fails with
// ErrUnavailable and the permit is charged once. The first half shows the fault is
// real: the plain EVALSHA through the same proxy charges twice.
func TestLostReplyChargesOnce(t *testing.T) {
	addr, err := redistest.StandaloneAddr()
	if err != nil {
		t.Skipf("needs a real redis-server: %v", err)
	}
	proxy, err := redistest.NewProxy(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Close()
	rdb := redis.NewClient(&redis.Options{Addr: proxy.Addr}) // go-redis defaults: 3 retries
	defer rdb.Close()
	direct := redistest.NewStandalone(t)
	ctx := context.Background()

	// the fault, shown on a plain script call
	keys := []string{"{" + direct.Prefix + "plain}:sw", "{" + direct.Prefix + "plain}:pause"}
	lua.SlidingWindow.Load(ctx, rdb)
	proxy.DropReplyTo("evalsha")
	if err := lua.SlidingWindow.Run(ctx, rdb, keys, 0, 1, 0, 1, 10, 60_000_000).Err(); err != nil {
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
		// the slot went back once: the next booking gets it (tolerance: the calls' own
		// round trips, well under 20ms here)
		r3, err := l.Reserve(ctx, 1, 2*time.Minute)
		if d := r3.Due().Sub(r2.Due()); err != nil || !r3.OK() || d > 20*time.Millisecond || d < -20*time.Millisecond {
			t.Fatalf("%v: after a cancel whose reply was lost the next booking is due %v after the cancelled one", alg, d)
		}
	}
	redistest.Figure(t, "a lost reply (dropped by a proxy after the script ran): plain EVALSHA with go-redis retries charged 2 permits for 1 call; "+
		"the limiter (MULTI/EXEC) charged 1 for 1, and a cancel whose reply was lost gave back 1, for each of %d algorithms (%d replies dropped)",
		len(allAlgorithms), proxy.Dropped())
}
