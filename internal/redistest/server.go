package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is a redis-server process started by this package.
type Server struct {
	Addr string
	Dir  string
	args []string
	env  []string // added to the environment; nil: this process's
	cmd  *exec.Cmd
}

var (
	mu      sync.Mutex
	started []*Server
	cleanup []string // directories StopAll removes besides the servers'
)

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// RefusedAddr is an address whose every dial is refused at once: port 1 (tcpmux),
// which nothing on a test machine serves and no test server can be given. A port
// FreePort found free is not: a redis-server another suite started a moment later can
// take it (TestCoalescedHungRedis/refused got answers from one, under a parallel suite).
const RefusedAddr = "127.0.0.1:1"

// StartServer starts redis-server on a free 127.0.0.1 port with no persistence and the
// extra arguments given ("--cluster-enabled", "yes", ...), and waits until it answers.
// StopAll (called by Main) stops it; so does the end of the test process.
func StartServer(extra ...string) (*Server, error) {
	return StartServerEnv(nil, extra...)
}

// StartServerEnv is StartServer with env (KEY=value) added to the server's
// environment, e.g. to run it under libfaketime (see StartServerWithClock).
func StartServerEnv(env []string, extra ...string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "jobthrottle-redis-")
	if err != nil {
		return nil, err
	}
	for attempt := 0; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: dir, env: env}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no", "--loglevel", "warning",
			"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
		}, extra...)
		s.cmd = s.command(bin)
		if err := s.cmd.Start(); err != nil {
			return nil, err
		}
		if err := waitPing(s.Addr, 5*time.Second); err != nil {
			_ = s.cmd.Process.Kill()
			_ = s.cmd.Wait()
			if attempt < 3 {
				continue // the port was taken in between
			}
			return nil, fmt.Errorf("redis-server on %s: %w", s.Addr, err)
		}
		mu.Lock()
		started = append(started, s)
		mu.Unlock()
		return s, nil
	}
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *Server) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	}
	s.cmd = nil
}

// Restart starts the server again on the same address after Kill.
func (s *Server) Restart() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	s.cmd = s.command(bin)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	return waitPing(s.Addr, 5*time.Second)
}

func (s *Server) command(bin string) *exec.Cmd {
	cmd := exec.Command(bin, s.args...)
	if s.env != nil {
		cmd.Env = append(os.Environ(), s.env...)
	}
	setParentDeath(cmd)
	return cmd
}

// StopAll kills every server this package started and removes their directories.
func StopAll() {
	mu.Lock()
	defer mu.Unlock()
	for _, s := range started {
		s.Kill()
		_ = os.RemoveAll(s.Dir)
	}
	for _, d := range cleanup {
		_ = os.RemoveAll(d)
	}
	started, cleanup = nil, nil
}

// waitPing waits up to d for the server at addr to answer: any reply, an error too.
func waitPing(addr string, d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		var reply redis.Error // a replica cut off from its master answers MASTERDOWN
		if err == nil || errors.As(err, &reply) {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// StartCluster starts a Redis Cluster of n masters (no replicas) on free ports: it
// starts the nodes, splits the 16384 slots between them, joins them and waits until
// every node reports cluster_state:ok. Its cluster-node-timeout is ClusterNodeTimeout.
func StartCluster(n int) ([]string, error) {
	c, err := StartClusterWithReplicas(n, 0, ClusterNodeTimeout)
	if err != nil {
		return nil, err
	}
	return c.Addrs(), nil
}

// ClusterNodeTimeout is the cluster-node-timeout of the cluster the tests share (and of
// the one .ci/run starts). It has no replicas, so a node its peers mark failed takes the
// whole cluster down (CLUSTERDOWN) until they hear from it again: with 2s, a suite run
// beside other suites on this 2-core machine (load 9) saw CLUSTERDOWN at the start of an
// unrelated test. No test of the shared cluster is about failure detection; the failover
// tests start clusters of their own with short timeouts.
const ClusterNodeTimeout = 20 * time.Second

// TestCluster is a Redis Cluster started by StartClusterWithReplicas, its nodes by the
// role they were given (a failover changes roles; ask the cluster for the current ones).
type TestCluster struct {
	Masters  []*Server
	Replicas []*Server // Replicas[i*r .. i*r+r-1] replicate Masters[i]
}

// Addrs returns every node's address, masters first.
func (c *TestCluster) Addrs() []string {
	var a []string
	for _, s := range append(append([]*Server(nil), c.Masters...), c.Replicas...) {
		a = append(a, s.Addr)
	}
	return a
}

// StartClusterWithReplicas starts a Redis Cluster of n masters, each with r replicas,
// on free ports, with the given cluster-node-timeout (how long a node may be silent
// before the others fail it over): it starts the nodes, splits the 16384 slots between
// the masters, gives each node a config epoch of its own (1, 2, … as redis-cli --cluster
// create does), joins every node, makes the replicas replicate their masters, and waits
// until every node reports cluster_state:ok, knows the greatest epoch given, and every
// replica's link is up.
//
// Without epochs of their own the nodes (each at 0) settle their collisions by gossip,
// one stepping past another, and for a while a node may not know another's latest. A
// slot moved to such a node (SlotMove) can end with an epoch below the source's: CLUSTER
// SETSLOT NODE takes the target past the greatest epoch it knows of, no further. A node
// that still maps the slot to the source then tells the target (an UPDATE) to give it
// back, though the source has handed it on, and the two answer MOVED to each other for
// good.
func StartClusterWithReplicas(n, r int, nodeTimeout time.Duration) (*TestCluster, error) {
	c := &TestCluster{}
	var nodes []*Server
	for i := 0; i < n*(1+r); i++ {
		s, err := StartServer("--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10))
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, s)
	}
	c.Masters, c.Replicas = nodes[:n], nodes[n:]
	ctx := context.Background()
	host, port, _ := net.SplitHostPort(nodes[0].Addr)
	do := func(s *Server, args ...any) error {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer cl.Close()
		if err := cl.Do(ctx, args...).Err(); err != nil {
			return fmt.Errorf("cluster setup on %s: %v: %w", s.Addr, args, err)
		}
		return nil
	}
	for i, s := range nodes { // SET-CONFIG-EPOCH only before the node meets others
		if i < n {
			if err := do(s, "CLUSTER", "ADDSLOTSRANGE", i*16384/n, (i+1)*16384/n-1); err != nil {
				return nil, err
			}
		}
		if err := do(s, "CLUSTER", "SET-CONFIG-EPOCH", i+1); err != nil {
			return nil, err
		}
	}
	for _, s := range nodes[1:] {
		if err := do(s, "CLUSTER", "MEET", host, port); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(60 * time.Second) // generous: a loaded machine is slow to gossip
	known := fmt.Sprintf("cluster_known_nodes:%d\r\n", len(nodes))
	if err := waitNodes(ctx, c.Addrs(), deadline, func(info string) bool { return strings.Contains(info, known) }); err != nil {
		return nil, err
	}
	for i, s := range c.Replicas {
		m := redis.NewClient(&redis.Options{Addr: c.Masters[i/r].Addr})
		id, err := m.Do(ctx, "CLUSTER", "MYID").Text()
		m.Close()
		if err != nil {
			return nil, fmt.Errorf("cluster setup on %s: %w", s.Addr, err)
		}
		rc := redis.NewClient(&redis.Options{Addr: s.Addr})
		for {
			err = rc.Do(ctx, "CLUSTER", "REPLICATE", id).Err()
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(50 * time.Millisecond) // the replica may not know the master's id yet
		}
		if err == nil {
			for {
				info, ierr := rc.Info(ctx, "replication").Result()
				if ierr == nil && strings.Contains(info, "master_link_status:up") {
					break
				}
				if time.Now().After(deadline) {
					err = fmt.Errorf("replica link not up: %v %v", info, ierr)
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		rc.Close()
		if err != nil {
			return nil, fmt.Errorf("cluster setup on %s: %w", s.Addr, err)
		}
	}
	// every node knows the greatest epoch given: a slot's new owner takes one past it
	if err := waitNodes(ctx, c.Addrs(), deadline, func(info string) bool { return infoInt(info, "cluster_current_epoch") >= len(nodes) }); err != nil {
		return nil, err
	}
	return c, nil
}

// waitNodes waits until CLUSTER INFO on every node says cluster_state:ok and ready
// holds for it.
func waitNodes(ctx context.Context, addrs []string, deadline time.Time, ready func(info string) bool) error {
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && ready(info) {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return fmt.Errorf("cluster on %v not ok: %v %v", addrs, info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return nil
}

// infoInt returns the integer field of a CLUSTER INFO reply, or -1 without it.
func infoInt(info, field string) int {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			if n, err := strconv.Atoi(v); err == nil {
				return n
			}
		}
	}
	return -1
}
