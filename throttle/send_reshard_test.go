package throttle

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jobthrottle/jobthrottle/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// A Redis Cluster moving a limiter's slot to another master, while callers Wait on it
// at 50 per second (one per 20ms): the move is done as redis-cli --cluster reshard does it, step by
// step, each phase held 600ms (about what the tool takes for one slot): the target
// IMPORTING and the source MIGRATING with every key still on the source; then the
// keys MIGRATEd; then the slot given to the target (SETSLOT NODE on every node).
//
// A plain limiter's call names one key, so the source serves it while the key is
// there, and once it has moved the target does (the source answers ASK, and go-redis's
// cluster client sends the transaction to the target, ASKING before MULTI). Asserted:
// no call fails with a reply
// of Redis's (TRYAGAIN, ASK, MOVED, EXECABORT), and every error a caller sees is
// ErrUnavailable (a call whose slot is moving is not the caller's fault); callers are
// served again after the move. Reported: the grants in each phase against the rate,
// and each error's text.
func TestReshardIsAPause(t *testing.T) {
	parallel(t)
	tc, cc := redistest.OwnCluster(t)
	ctx := context.Background()
	const rate = 50 // one per 20ms: evenly spread, so each phase can be served
	l, err := New(cc, "reshard", Limit{Rate: 1, Period: time.Second / rate})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var grants, asked []time.Time // when each permit took effect, when its Wait began
	errs := map[string]int{}      // by text: each error of another type fails the test
	var foreign, replied []error  // errors of another type; errors of a reply of Redis's
	late := 0                     // Waits whose own deadline passed first
	var slowest time.Duration     // the longest call that failed ErrUnavailable
	run, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for run.Err() == nil {
				wctx, cancel := context.WithTimeout(run, time.Second)
				start := time.Now()
				err := l.Wait(wctx)
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					grants, asked = append(grants, time.Now()), append(asked, start)
				case run.Err() != nil:
				case errors.Is(err, ErrUnavailable):
					if rerr := redis.Error(nil); errors.As(err, &rerr) {
						replied = append(replied, err)
					}
					errs[err.Error()]++
					slowest = max(slowest, time.Since(start))
				case errors.Is(err, context.DeadlineExceeded): // its own second passed
					late++
				default:
					foreign = append(foreign, err)
				}
				mu.Unlock()
				if err != nil {
					time.Sleep(10 * ms) // as a caller backing off
				}
			}
		}()
	}

	const hold = 600 * ms
	move := redistest.NewSlotMove(t, tc, cc, l.stateKey())
	time.Sleep(time.Second) // callers at the rate
	phases := []time.Time{time.Now()}
	move.Begin()
	time.Sleep(hold)
	phases = append(phases, time.Now())
	move.Keys()
	before := move.ScriptCalls(move.Source())
	time.Sleep(hold)
	atSource := move.ScriptCalls(move.Source()) - before
	phases = append(phases, time.Now())
	move.End()
	phases = append(phases, time.Now())
	time.Sleep(time.Second) // served again, by the target
	phases = append(phases, time.Now())
	stop()
	wg.Wait()

	count := func(a, b time.Time) (took, booked int) {
		for i, g := range grants {
			if !g.Before(a) && g.Before(b) {
				took++
				if !asked[i].Before(a) {
					booked++
				}
			}
		}
		return took, booked
	}
	names := []string{"keys on the source, slot migrating", "keys on the target, slot migrating", "slot handed over", "after the move"}
	report := func(name string, a, b time.Time) {
		d := b.Sub(a)
		n, booked := count(a, b)
		redistest.Figure(t, "reshard, %s: %d permits took effect in %v, %.0f%% of the rate (%d/s); %d of them booked in that time",
			name, n, d.Round(ms), 100*float64(n)/(d.Seconds()*rate), rate, booked)
	}
	for i, name := range names {
		report(name, phases[i], phases[i+1])
	}
	report("the whole move", phases[0], phases[3])
	for text, n := range errs {
		redistest.Figure(t, "reshard: %d × %s", n, text)
	}
	redistest.Figure(t, "reshard: the longest call that failed took %v", slowest.Round(ms))
	redistest.Figure(t, "reshard: %d Waits ran out of their own 1s deadline; %d errors of another type than ErrUnavailable", late, len(foreign))
	redistest.Figure(t, "reshard: %d script calls reached the source with the keys on the target", atSource)
	if len(replied) > 0 {
		t.Errorf("calls refused by Redis during the move: %d, the first %v; want every call served", len(replied), replied[0])
	}
	if len(foreign) > 0 {
		t.Errorf("errors that are not ErrUnavailable during the move: %d, the first %v", len(foreign), foreign[0])
	}
	if after, _ := count(phases[3], phases[4]); after == 0 {
		t.Errorf("no grant in the %v after the move: want the callers served again", phases[4].Sub(phases[3]).Round(ms))
	}
}

// While a slot migrates, a call whose keys have all moved to the target is served
// there: the source answers ASK, and go-redis's cluster client sends the transaction to
// the target at once, ASKING before MULTI. A semaphore whose every key exists (a lease
// held, a waiter queued, the key paused) and a limiter on the same key show it: their
// calls succeed in the middle of the move, and each reaches the source once, for its
// ASK: nothing is tried again there. (Each call asks the source first, as the cluster
// spec has clients do while a slot migrates: the move costs a call one round trip more,
// with no backoff. A call some of whose keys do not exist gets TRYAGAIN from both nodes
// instead.)
func TestReshardAsksTheTarget(t *testing.T) {
	parallel(t)
	tc, cc := redistest.OwnCluster(t)
	ctx := context.Background()
	s, err := NewSemaphore(cc, "asked", 1, WithLeaseTTL(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	lease := mustTry(t, s)
	queued, cancel := context.WithCancel(ctx)
	defer cancel()
	waiting := make(chan error, 1)
	go func() { _, err := s.Acquire(queued); waiting <- err }()
	l, err := New(cc, "asked", PerSecond(1))
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Pause(ctx, time.Minute); err != nil {
		t.Fatal(err)
	}
	move := redistest.NewSlotMove(t, tc, cc, l.stateKey())
	for deadline := time.Now().Add(signalWait); ; time.Sleep(10 * ms) { // every key in place
		n, err := move.Source().Exists(ctx, s.t.keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == int64(len(s.t.keys)) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of the semaphore's keys %v exist, want all", n, s.t.keys)
		}
	}
	move.Begin()
	move.Keys()
	if got, _ := move.Source().Exists(ctx, s.t.keys...).Result(); got != 0 {
		t.Fatalf("%d keys left on the source after MIGRATE", got)
	}
	before := move.ScriptCalls(move.Source())
	got, wait, err := s.TryAcquire(ctx)
	if err != nil || got != nil {
		t.Fatalf("TryAcquire while the slot migrates, its keys on the target: got %v, %v, %v; want no lease (paused), no error", got, wait, err)
	}
	if err := lease.Extend(ctx); err != nil {
		t.Fatalf("Extend while the slot migrates: %v", err)
	}
	const calls = 10
	for i := range calls {
		if r, err := l.Allow(ctx); err != nil || r.Allowed {
			t.Fatalf("Allow %d while the slot migrates, its key on the target: got %v, %v; want denied (paused), no error", i+1, r, err)
		}
	}
	// one ASK per call, and one more for each script's first call: the target answers
	// its EVALSHA NOSCRIPT, and the EVAL goes the same way
	if got, want := move.ScriptCalls(move.Source())-before, calls+2+2; got > want {
		t.Errorf("%d script calls reached the source for %d calls with the keys on the target; want at most %d, one per call and one per script's first", got, calls+2, want)
	}
	move.End()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after the move: %v", err)
	}
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("the queued Acquire: got %v, want context.Canceled", err)
	}
}

// A limiter's slot migrating to a node just added to the cluster, as scaling out does
// (CLUSTER MEET, then redis-cli --cluster reshard to it): the new node owns no slot yet,
// so the cluster client's slot map (CLUSTER SLOTS) does not list it. A plain limiter is
// still served all through the move: once its key is on the new node, the source's ASK
// sends its transaction there (go-redis's cluster client adds a node it is sent to).
func TestReshardToANewNode(t *testing.T) {
	parallel(t)
	tc, cc := redistest.OwnCluster(t)
	ctx := context.Background()
	l, err := New(cc, "scaleout", PerSecond(1000))
	if err != nil {
		t.Fatal(err)
	}
	if r, err := l.Allow(ctx); err != nil || !r.Allowed {
		t.Fatalf("Allow before the move: %v, %v", r, err)
	}
	s, err := redistest.StartServer("--cluster-enabled", "yes", "--cluster-config-file", "nodes-new.conf")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Kill() })
	node := redis.NewClient(&redis.Options{Addr: s.Addr})
	t.Cleanup(func() { node.Close() })
	src, err := cc.MasterForKey(ctx, l.stateKey())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(src.Options().Addr)
	if err := node.ClusterMeet(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * ms) { // the setup: gossip
		joined := true
		for _, a := range append(tc.Addrs(), s.Addr) {
			c := redis.NewClient(&redis.Options{Addr: a})
			info, err := c.ClusterInfo(ctx).Result()
			c.Close()
			joined = joined && err == nil && strings.Contains(info, "cluster_known_nodes:4") && strings.Contains(info, "cluster_state:ok")
		}
		if joined {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the new node did not join the cluster")
		}
	}
	slot := cc.ClusterKeySlot(ctx, l.stateKey()).Val()
	srcID, err := src.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	newID, err := node.ClusterMyID(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	do := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
		}
	}
	do(node, "cluster", "setslot", slot, "importing", srcID)
	do(src, "cluster", "setslot", slot, "migrating", newID)
	nhost, nport, _ := net.SplitHostPort(s.Addr)
	do(src, "migrate", nhost, nport, "", 0, 5000, "keys", l.stateKey())
	for i := range 3 {
		if r, err := l.Allow(ctx); err != nil || !r.Allowed {
			t.Fatalf("Allow %d while the slot migrates to the new node, the key on it: %v, %v; want allowed", i+1, r, err)
		}
	}
	do(node, "cluster", "setslot", slot, "node", newID)
	do(src, "cluster", "setslot", slot, "node", newID)
	if r, err := l.Allow(ctx); err != nil || !r.Allowed {
		t.Fatalf("Allow after the move: %v, %v; want allowed", r, err)
	}
}
