package throttle

import (
	"context"
	"errors"
	"net"
	"os"
	"strconv"
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
// there, and once it has moved the target does (ASK, then ASKING before MULTI; the
// key's next calls go there straight: redirect). Asserted: no call fails with a reply
// of Redis's (TRYAGAIN, ASK, MOVED, EXECABORT), and every error a caller sees is
// ErrUnavailable (a call whose slot is moving is not the caller's fault); callers are
// served again after the move. Reported: the grants in each phase against the rate,
// and each error's text.
func TestReshardIsAPause(t *testing.T) {
	tc, cc := ownCluster(t)
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
	move := newSlotMove(t, tc, cc, l.stateKey())
	time.Sleep(time.Second) // callers at the rate
	phases := []time.Time{time.Now()}
	move.begin()
	time.Sleep(hold)
	phases = append(phases, time.Now())
	move.keys()
	before := move.scriptCalls(move.nodes[0])
	time.Sleep(hold)
	atSource := move.scriptCalls(move.nodes[0]) - before
	phases = append(phases, time.Now())
	move.end()
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
// there: the source answers ASK, and the transaction goes again to the target with
// ASKING before MULTI; the key's calls after it go to the target straight. A semaphore
// whose every key exists (a lease held, a waiter queued, the key paused) and a limiter
// on the same key show it: their calls succeed in the middle of the move, and only the
// first reaches the source. (A call some of whose keys do not exist gets TRYAGAIN from
// both nodes instead.)
func TestReshardAsksTheTarget(t *testing.T) {
	tc, cc := ownCluster(t)
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
	move := newSlotMove(t, tc, cc, l.stateKey())
	for deadline := time.Now().Add(signalWait); ; time.Sleep(10 * ms) { // every key in place
		n, err := move.nodes[0].Exists(ctx, s.t.keys...).Result()
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
	move.begin()
	move.keys()
	if got, _ := move.nodes[0].Exists(ctx, s.t.keys...).Result(); got != 0 {
		t.Fatalf("%d keys left on the source after MIGRATE", got)
	}
	before := move.scriptCalls(move.nodes[0])
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
	// the first call goes the cluster client's way: its first and third tries reach
	// the source (the second goes to the target without ASKING, which answers MOVED),
	// then redirect's first; the others go to the target straight
	if got := move.scriptCalls(move.nodes[0]) - before; got > 3 {
		t.Errorf("%d script calls reached the source for %d calls with the keys on the target; want at most 3, the first call's", got, calls+2)
	}
	move.end()
	if err := lease.Release(ctx); err != nil {
		t.Fatalf("Release after the move: %v", err)
	}
	cancel()
	if err := <-waiting; !errors.Is(err, context.Canceled) {
		t.Fatalf("the queued Acquire: got %v, want context.Canceled", err)
	}
}

// ownCluster starts a Redis Cluster of 3 masters for one test, and a client of it;
// the servers are stopped by PID when the test ends.
func ownCluster(t *testing.T) (*redistest.TestCluster, *redis.ClusterClient) {
	t.Helper()
	tc, err := redistest.StartClusterWithReplicas(3, 0, 5*time.Second)
	if err != nil {
		sendRequireReal(t, err)
	}
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: tc.Addrs()})
	t.Cleanup(func() {
		cc.Close()
		for _, s := range tc.Masters {
			s.Kill()
			_ = os.RemoveAll(s.Dir)
		}
	})
	return tc, cc
}

// slotMove moves the slot of a key from its master to another, in redis-cli --cluster
// reshard's steps: begin (the target IMPORTING, the source MIGRATING), keys (MIGRATE
// every key of the slot), end (SETSLOT NODE on the target, the source, then the other).
type slotMove struct {
	t     *testing.T
	slot  int
	nodes []*redis.Client // the source, the target, the other
	ids   []string
}

func newSlotMove(t *testing.T, tc *redistest.TestCluster, cc *redis.ClusterClient, key string) *slotMove {
	t.Helper()
	ctx := context.Background()
	src, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m := &slotMove{t: t, slot: int(cc.ClusterKeySlot(ctx, key).Val())}
	m.nodes = append(m.nodes, redis.NewClient(&redis.Options{Addr: src.Options().Addr}))
	for _, s := range tc.Masters {
		if s.Addr != src.Options().Addr {
			m.nodes = append(m.nodes, redis.NewClient(&redis.Options{Addr: s.Addr}))
		}
	}
	for _, n := range m.nodes {
		id, err := n.ClusterMyID(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		m.ids = append(m.ids, id)
		t.Cleanup(func() { n.Close() })
	}
	return m
}

func (m *slotMove) do(c *redis.Client, args ...any) {
	m.t.Helper()
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		m.t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
	}
}

// scriptCalls returns how many script calls node has had, run, refused or failed
// (INFO commandstats).
func (m *slotMove) scriptCalls(node *redis.Client) int {
	m.t.Helper()
	info, err := node.Info(context.Background(), "commandstats").Result()
	if err != nil {
		m.t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(info, "\r\n") {
		name, stats, _ := strings.Cut(line, ":")
		if name != "cmdstat_evalsha" && name != "cmdstat_eval" {
			continue
		}
		for _, f := range strings.Split(stats, ",") {
			k, v, _ := strings.Cut(f, "=")
			if k == "calls" || k == "rejected_calls" || k == "failed_calls" {
				x, _ := strconv.Atoi(v)
				n += x
			}
		}
	}
	return n
}

func (m *slotMove) begin() {
	m.t.Helper()
	m.do(m.nodes[1], "cluster", "setslot", m.slot, "importing", m.ids[0])
	m.do(m.nodes[0], "cluster", "setslot", m.slot, "migrating", m.ids[1])
}

func (m *slotMove) keys() {
	m.t.Helper()
	keys, err := m.nodes[0].ClusterGetKeysInSlot(context.Background(), m.slot, 1000).Result()
	if err != nil {
		m.t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(m.nodes[1].Options().Addr)
	if len(keys) > 0 {
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		m.do(m.nodes[0], args...)
	}
}

func (m *slotMove) end() {
	m.t.Helper()
	for _, n := range m.nodes {
		m.do(n, "cluster", "setslot", m.slot, "node", m.ids[1])
	}
}
