// Package redistest gives tests the Redis servers they run against: miniredis with a
// clock the test sets, a real redis-server and a 3-node Redis Cluster.
//
// Real servers come from REDIS_ADDR and REDIS_CLUSTER_ADDRS (comma-separated) when
// set, or are started on free 127.0.0.1 ports when redis-server is on PATH. Without
// either the real cases are skipped with a log line saying so, unless
// JOBTHROTTLE_REQUIRE_REAL is set (CI sets it), in which case they fail.
package redistest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Main runs the tests of a package and stops the servers they started; call it from
// TestMain: func TestMain(m *testing.M) { redistest.Main(m) }.
func Main(m *testing.M) {
	code := m.Run()
	StopAll()
	os.Exit(code)
}

// Parallel lets n of a package's parallel tests run at once, unless the command line
// sets -test.parallel: for packages whose parallel tests wait on clocks and servers
// more than they compute, so that more of them than GOMAXPROCS (go test's default)
// keep the CPU busy. Call it from TestMain, before Main.
func Parallel(n int) {
	flag.Parse()
	set := false
	flag.Visit(func(f *flag.Flag) { set = set || f.Name == "test.parallel" })
	if !set {
		_ = flag.Set("test.parallel", strconv.Itoa(max(n, runtime.GOMAXPROCS(0))))
	}
}

// Kind names a backend.
type Kind string

const (
	Mini       Kind = "miniredis"
	Standalone Kind = "redis"
	Cluster    Kind = "cluster"
)

// Backend is one Redis to run a test against.
type Backend struct {
	Kind   Kind
	Client redis.UniversalClient
	// Mini is the miniredis server, for the miniredis backend only.
	Mini *miniredis.Miniredis
	// Prefix is a key prefix unique to this test; the test's keys under it are deleted
	// when the test ends.
	Prefix string

	clock   *commandClock // a real-time miniredis's clock; nil otherwise
	refusal *refusal      // SetError's state, made by its first call
}

// Real reports whether the backend is a real redis-server.
func (b *Backend) Real() bool { return b.Kind != Mini }

// Addrs returns where another client or process reaches the backend's server: its
// address, or the cluster's nodes (cluster true). Dial connects to them.
func (b *Backend) Addrs() (addrs []string, cluster bool) {
	switch c := b.Client.(type) {
	case *redis.ClusterClient:
		return c.Options().Addrs, true
	case *redis.Client:
		return []string{c.Options().Addr}, false
	}
	panic(fmt.Sprintf("redistest: backend client of unknown type %T", b.Client))
}

// Dial returns a new client of addrs (see Backend.Addrs), with the backends' clients'
// ClientTimeout and go-redis's other defaults: a cluster client when cluster is set,
// else a client of addrs[0]. The caller closes it. (With a 3s read timeout, a
// fleet test's child processes got "i/o timeout" from miniredis at load 17.)
func Dial(addrs []string, cluster bool) redis.UniversalClient {
	if cluster {
		return redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: ClientTimeout, WriteTimeout: ClientTimeout})
	}
	return redis.NewClient(&redis.Options{Addr: addrs[0], ReadTimeout: ClientTimeout, WriteTimeout: ClientTimeout})
}

var (
	standaloneOnce sync.Once
	standaloneAddr string
	standaloneErr  error
	clusterOnce    sync.Once
	clusterAddrs   []string
	clusterErr     error
)

// StandaloneAddr returns the address of a real redis-server, starting one if needed.
func StandaloneAddr() (string, error) {
	standaloneOnce.Do(func() {
		if a := os.Getenv("REDIS_ADDR"); a != "" {
			standaloneAddr = a
			return
		}
		s, err := StartServer()
		if err != nil {
			standaloneErr = fmt.Errorf("REDIS_ADDR is unset and redis-server could not be started: %w", err)
			return
		}
		standaloneAddr = s.Addr
	})
	return standaloneAddr, standaloneErr
}

// ClusterAddrs returns the addresses of a real Redis Cluster, starting one if needed.
func ClusterAddrs() ([]string, error) {
	clusterOnce.Do(func() {
		if a := os.Getenv("REDIS_CLUSTER_ADDRS"); a != "" {
			clusterAddrs = strings.Split(a, ",")
			return
		}
		clusterAddrs, clusterErr = StartCluster(3)
		if clusterErr != nil {
			clusterErr = fmt.Errorf("REDIS_CLUSTER_ADDRS is unset and a cluster could not be started: %w", clusterErr)
		}
	})
	return clusterAddrs, clusterErr
}

// unavailable skips (or, under JOBTHROTTLE_REQUIRE_REAL, fails) a test that needs a
// real server it could not get; skip begins the skip's log line.
func unavailable(t testing.TB, err error, skip string) {
	t.Helper()
	if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
		t.Fatalf("real Redis required (JOBTHROTTLE_REQUIRE_REAL is set): %v", err)
	}
	t.Skipf("%s: %v", skip, err)
}

// noRealRedis is unavailable's skip line for a case that also runs on miniredis.
const noRealRedis = "no real Redis, this case runs on miniredis only"

// Epoch is where the miniredis clock starts: a fixed, recognisable time.
var Epoch = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// ClientTimeout is the read and write timeout of the backends' clients, in place of
// go-redis's 3s: with two busy loops beside the suite on this 2-core machine, servers
// and miniredis once went unanswered past 3s, and calls that test no timeout failed
// with "i/o timeout". Tests of timeouts build clients of their own.
const ClientTimeout = 30 * time.Second

// NewMini returns a miniredis backend whose clock stands at Epoch; TTLs follow the
// clock (ClockTTL), so moving it with SetTime expires keys as Redis would.
func NewMini(t testing.TB) *Backend {
	t.Helper()
	m := miniredis.RunT(t)
	m.SetTime(Epoch)
	m.ClockTTL(true)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: ClientTimeout, WriteTimeout: ClientTimeout})
	t.Cleanup(func() { c.Close() })
	return &Backend{Kind: Mini, Client: c, Mini: m, Prefix: uniquePrefix(t)}
}

// NewMiniRealTime returns a miniredis backend on the real clock, for tests that
// sleep (briefly) and run the production scripts. Its clock stands still while a
// command runs, as Redis's does while a script runs (see commandClock); make it fail
// with b.SetError.
func NewMiniRealTime(t testing.TB) *Backend {
	t.Helper()
	m := miniredis.RunT(t)
	clock := &commandClock{m: m, last: time.Now()}
	m.SetTime(clock.last)
	m.ClockTTL(true)
	m.Server().SetPreHook(clock.hook)
	c := redis.NewClient(&redis.Options{Addr: m.Addr(), ReadTimeout: ClientTimeout, WriteTimeout: ClientTimeout})
	t.Cleanup(func() { c.Close() })
	return &Backend{Kind: Mini, Client: c, Mini: m, Prefix: uniquePrefix(t), clock: clock}
}

// EachRealTime is Each with miniredis on the real clock.
func EachRealTime(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	for _, k := range []Kind{Mini, Standalone, Cluster} {
		t.Run(string(k), func(t *testing.T) {
			b := NewMiniRealTime
			if k != Mini {
				b = func(t testing.TB) *Backend { return New(t, k) }
			}
			f(t, b(t))
		})
	}
}

// NewStandalone returns the real redis-server backend, or skips the test.
func NewStandalone(t testing.TB) *Backend {
	t.Helper()
	addr, err := StandaloneAddr()
	if err != nil {
		unavailable(t, err, noRealRedis)
	}
	c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: ClientTimeout, WriteTimeout: ClientTimeout})
	b := &Backend{Kind: Standalone, Client: c, Prefix: uniquePrefix(t)}
	t.Cleanup(func() { b.deleteKeys(); c.Close() })
	return b
}

// NewProxied returns the real redis-server backend (direct: its test prefix, and a
// client past the proxy), a Proxy in front of it that can delay or lose replies, and a
// client through the proxy with go-redis's defaults (3 retries); all close with the
// test. Without a real server it skips the test, as NewStandalone.
func NewProxied(t testing.TB) (direct *Backend, proxy *Proxy, rdb *redis.Client) {
	t.Helper()
	direct = NewStandalone(t)
	proxy, err := NewProxy(direct.Client.(*redis.Client).Options().Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	rdb = redis.NewClient(&redis.Options{Addr: proxy.Addr})
	t.Cleanup(func() { rdb.Close() })
	return direct, proxy, rdb
}

// NewCluster returns the real Redis Cluster backend, or skips the test.
func NewCluster(t testing.TB) *Backend {
	t.Helper()
	addrs, err := ClusterAddrs()
	if err != nil {
		unavailable(t, err, noRealRedis)
	}
	c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ReadTimeout: ClientTimeout, WriteTimeout: ClientTimeout})
	b := &Backend{Kind: Cluster, Client: c, Prefix: uniquePrefix(t)}
	t.Cleanup(func() { b.deleteKeys(); c.Close() })
	return b
}

// Each runs f as a subtest on miniredis, the real server and the cluster.
func Each(t *testing.T, f func(t *testing.T, b *Backend)) {
	t.Helper()
	for _, k := range []Kind{Mini, Standalone, Cluster} {
		t.Run(string(k), func(t *testing.T) { f(t, New(t, k)) })
	}
}

// New returns a backend of kind k (skipping the test if it is a real one that is
// not available).
func New(t testing.TB, k Kind) *Backend {
	t.Helper()
	switch k {
	case Standalone:
		return NewStandalone(t)
	case Cluster:
		return NewCluster(t)
	}
	return NewMini(t)
}

func uniquePrefix(t testing.TB) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "jt-test-" + hex.EncodeToString(b[:]) + ":"
}

// deleteKeys removes every key under the backend's prefix ("{<prefix>…").
func (b *Backend) deleteKeys() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	del := func(ctx context.Context, c *redis.Client) error {
		iter := c.Scan(ctx, 0, "{"+b.Prefix+"*", 1000).Iterator()
		for iter.Next(ctx) {
			c.Del(ctx, iter.Val())
		}
		return iter.Err()
	}
	switch c := b.Client.(type) {
	case *redis.ClusterClient:
		_ = c.ForEachMaster(ctx, del)
	case *redis.Client:
		_ = del(ctx, c)
	}
}
