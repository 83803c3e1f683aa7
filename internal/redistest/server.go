package redistest

import (
	"context"
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
	cmd  *exec.Cmd
}

var (
	mu      sync.Mutex
	started []*Server
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

// StartServer starts redis-server on a free 127.0.0.1 port with no persistence and the
// extra arguments given ("--cluster-enabled", "yes", ...), and waits until it answers.
// StopAll (called by Main) stops it; so does the end of the test process.
func StartServer(extra ...string) (*Server, error) {
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
		s := &Server{Addr: "127.0.0.1:" + strconv.Itoa(port), Dir: dir}
		s.args = append([]string{
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--daemonize", "no", "--loglevel", "warning",
			"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
		}, extra...)
		s.cmd = exec.Command(bin, s.args...)
		setParentDeath(s.cmd)
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
	s.cmd = exec.Command(bin, s.args...)
	setParentDeath(s.cmd)
	if err := s.cmd.Start(); err != nil {
		return err
	}
	return waitPing(s.Addr, 5*time.Second)
}

// StopAll kills every server this package started and removes their directories.
func StopAll() {
	mu.Lock()
	defer mu.Unlock()
	for _, s := range started {
		s.Kill()
		_ = os.RemoveAll(s.Dir)
	}
	started = nil
}

func waitPing(addr string, d time.Duration) error {
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
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
// every node reports cluster_state:ok.
func StartCluster(n int) ([]string, error) {
	var nodes []*Server
	for i := 0; i < n; i++ {
		s, err := StartServer("--cluster-enabled", "yes", "--cluster-config-file", fmt.Sprintf("nodes-%d.conf", i),
			"--cluster-node-timeout", "2000")
		if err != nil {
			return nil, err
		}
		nodes = append(nodes, s)
	}
	ctx := context.Background()
	var addrs []string
	for i, s := range nodes {
		addrs = append(addrs, s.Addr)
		c := redis.NewClient(&redis.Options{Addr: s.Addr})
		lo, hi := i*16384/n, (i+1)*16384/n-1
		err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err()
		if err == nil && i > 0 {
			host, port, _ := net.SplitHostPort(nodes[0].Addr)
			err = c.Do(ctx, "CLUSTER", "MEET", host, port).Err()
		}
		c.Close()
		if err != nil {
			return nil, fmt.Errorf("cluster setup on %s: %w", s.Addr, err)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		for {
			info, err := c.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") && strings.Contains(info, fmt.Sprintf("cluster_known_nodes:%d", n)) {
				break
			}
			if time.Now().After(deadline) {
				c.Close()
				return nil, fmt.Errorf("cluster on %v not ok: %v %v", addrs, info, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
		c.Close()
	}
	return addrs, nil
}
