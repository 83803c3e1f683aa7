package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// OwnCluster starts a Redis Cluster of 3 masters (no replicas) for one test, and a
// client of it with go-redis's defaults; the servers are stopped by PID when the test
// ends. Without redis-server it skips the test, or fails it under
// JOBTHROTTLE_REQUIRE_REAL.
func OwnCluster(t testing.TB) (*TestCluster, *redis.ClusterClient) {
	t.Helper()
	tc, err := StartClusterWithReplicas(3, 0, 5*time.Second)
	if err != nil {
		unavailable(t, fmt.Errorf("a Redis Cluster of its own: %w", err), "skipped")
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

// SlotMove moves the slot of a key from its master to another, in redis-cli --cluster
// reshard's steps: Begin (the target IMPORTING, the source MIGRATING), Keys (MIGRATE
// every key of the slot), End (SETSLOT NODE on the target, the source, then the other).
type SlotMove struct {
	t     testing.TB
	slot  int
	nodes []*redis.Client // the source, the target, the other
	ids   []string
}

// NewSlotMove prepares the move of key's slot, of the cluster tc (cc a client of it),
// from its master to another master. Its clients close when the test ends.
func NewSlotMove(t testing.TB, tc *TestCluster, cc *redis.ClusterClient, key string) *SlotMove {
	t.Helper()
	ctx := context.Background()
	src, err := cc.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m := &SlotMove{t: t, slot: int(cc.ClusterKeySlot(ctx, key).Val())}
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

// Source returns a client of the node the slot moves from.
func (m *SlotMove) Source() *redis.Client { return m.nodes[0] }

// Target returns a client of the node the slot moves to.
func (m *SlotMove) Target() *redis.Client { return m.nodes[1] }

func (m *SlotMove) do(c *redis.Client, args ...any) {
	m.t.Helper()
	if err := c.Do(context.Background(), args...).Err(); err != nil {
		m.t.Fatalf("%v on %s: %v", args, c.Options().Addr, err)
	}
}

// ScriptCalls returns how many script calls node has had, run, refused or failed
// (INFO commandstats).
func (m *SlotMove) ScriptCalls(node *redis.Client) int {
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

// Begin sets the slot IMPORTING on the target, then MIGRATING on the source.
func (m *SlotMove) Begin() {
	m.t.Helper()
	m.do(m.nodes[1], "cluster", "setslot", m.slot, "importing", m.ids[0])
	m.do(m.nodes[0], "cluster", "setslot", m.slot, "migrating", m.ids[1])
}

// Keys MIGRATEs every key of the slot (up to 1000) from the source to the target.
func (m *SlotMove) Keys() {
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

// End gives the slot to the target: SETSLOT NODE on the target, the source, then the
// other master. The target goes first, as in Redis's resharding steps and redis-cli's
// reshard: a source told first redirects the slot to a target still importing it,
// which redirects it back until it is told too.
func (m *SlotMove) End() {
	m.t.Helper()
	for _, n := range []*redis.Client{m.Target(), m.Source(), m.nodes[2]} {
		m.do(n, "cluster", "setslot", m.slot, "node", m.ids[1])
	}
}
