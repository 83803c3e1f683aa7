package throttle

import (
	"context"
	"errors"
	"net"
	"os"
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
// Asserted: every error a caller sees during the move is ErrUnavailable (a call whose
// slot is moving is not the caller's fault), naming Redis's reply; callers are served
// again after the move. Reported: the grants in each phase against the rate (what the
// scripts' declared keys allow, see docs/failures.md) and each error's text.
func TestReshardIsAPause(t *testing.T) {
	tc, err := redistest.StartClusterWithReplicas(3, 0, 5*time.Second)
	if err != nil {
		sendRequireReal(t, err)
	}
	t.Cleanup(func() { // stopped by PID with the test, not with the package
		for _, s := range tc.Masters {
			s.Kill()
			_ = os.RemoveAll(s.Dir)
		}
	})
	ctx := context.Background()
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: tc.Addrs()})
	defer cc.Close()
	const rate = 50 // one per 20ms: evenly spread, so each phase can be served
	l, err := New(cc, "reshard", Limit{Rate: 1, Period: time.Second / rate})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var grants, asked []time.Time // when each permit took effect, when its Wait began
	errs := map[string]int{} // by text: each error of another type fails the test
	var foreign []error
	late := 0 // Waits whose own deadline passed first
	var slowest time.Duration // the longest call that failed ErrUnavailable
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
	slot := int(cc.ClusterKeySlot(ctx, l.stateKey()).Val())
	src, err := cc.MasterForKey(ctx, l.stateKey())
	if err != nil {
		t.Fatal(err)
	}
	var nodes []*redis.Client // every master, the source first and the target second
	nodes = append(nodes, redis.NewClient(&redis.Options{Addr: src.Options().Addr}))
	for _, m := range tc.Masters {
		if m.Addr != src.Options().Addr {
			nodes = append(nodes, redis.NewClient(&redis.Options{Addr: m.Addr}))
		}
	}
	for _, n := range nodes {
		defer n.Close()
	}
	from, to := nodes[0], nodes[1]
	ids := make([]string, len(nodes))
	for i, n := range nodes {
		if ids[i], err = n.ClusterMyID(ctx).Result(); err != nil {
			t.Fatal(err)
		}
	}
	do := func(c *redis.Client, args ...any) {
		t.Helper()
		if err := c.Do(ctx, args...).Err(); err != nil {
			t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
		}
	}

	time.Sleep(time.Second) // callers at the rate
	phases := []time.Time{time.Now()}
	do(to, "cluster", "setslot", slot, "importing", ids[0])
	do(from, "cluster", "setslot", slot, "migrating", ids[1])
	time.Sleep(hold)
	phases = append(phases, time.Now())
	keys, err := from.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(to.Options().Addr)
	if len(keys) > 0 {
		args := []any{"migrate", host, port, "", 0, 5000, "keys"}
		for _, k := range keys {
			args = append(args, k)
		}
		do(from, args...)
	}
	time.Sleep(hold)
	phases = append(phases, time.Now())
	for _, n := range nodes { // as redis-cli: the target, the source, then the others
		do(n, "cluster", "setslot", slot, "node", ids[1])
	}
	phases = append(phases, time.Now())
	time.Sleep(time.Second) // served again, by the target
	phases = append(phases, time.Now())
	stop()
	wg.Wait()

	if owner, err := cc.MasterForKey(ctx, l.stateKey()); err != nil || owner.Options().Addr != to.Options().Addr {
		t.Logf("the cluster client's map: %v %v (it reloads lazily)", owner, err)
	}
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
	for i, name := range names {
		d := phases[i+1].Sub(phases[i])
		n, booked := count(phases[i], phases[i+1])
		redistest.Figure(t, "reshard, %s: %d permits took effect in %v, %.0f%% of the rate (%d/s); %d of them booked in that time",
			name, n, d.Round(ms), 100*float64(n)/(d.Seconds()*rate), rate, booked)
	}
	for text, n := range errs {
		redistest.Figure(t, "reshard: %d × %s", n, text)
	}
	redistest.Figure(t, "reshard: the longest call that failed took %v", slowest.Round(ms))
	redistest.Figure(t, "reshard: %d Waits ran out of their own 1s deadline; %d errors of another type than ErrUnavailable", late, len(foreign))
	if len(foreign) > 0 {
		t.Errorf("errors that are not ErrUnavailable during the move: %d, the first %v", len(foreign), foreign[0])
	}
	if after, _ := count(phases[3], phases[4]); after == 0 {
		t.Errorf("no grant in the %v after the move: want the callers served again", phases[4].Sub(phases[3]).Round(ms))
	}
}
