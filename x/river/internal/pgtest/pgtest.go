// Package pgtest gives the tests of x/river a PostgreSQL with River's tables: a
// database of its own per test, made from a template migrated once.
//
// The server is the one JOBTHROTTLE_PG_URL names (a postgres:// URL of a user that
// may create databases), or one started on a free 127.0.0.1 port when the PostgreSQL
// server binaries (initdb, postgres) are on PATH: a throwaway cluster in a temporary
// directory, run as the user "postgres" when the tests run as root (PostgreSQL
// refuses to run as root), stopped and removed by Stop. Without either the tests that
// need it are skipped with a line saying so, unless JOBTHROTTLE_REQUIRE_REAL is set
// (CI sets it), in which case they fail.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
)

// EnvURL names the environment variable of a running server's URL.
const EnvURL = "JOBTHROTTLE_PG_URL"

const template = "jobthrottle_river_template"

var (
	once    sync.Once
	baseURL string // the server, database "postgres"
	initErr error
	server  *exec.Cmd     // the server this package started; nil if none
	exited  chan struct{} // closed when it has exited
	dataDir string
)

// DB returns a pool of a new database with River's tables, dropped when the test ends,
// and its URL (for another pool, standing for another process); or skips the test (or
// fails it, under JOBTHROTTLE_REQUIRE_REAL) when no PostgreSQL can be had.
func DB(t testing.TB) (*pgxpool.Pool, string) {
	t.Helper()
	once.Do(setup)
	if initErr != nil {
		if os.Getenv("JOBTHROTTLE_REQUIRE_REAL") != "" {
			t.Fatalf("PostgreSQL required (JOBTHROTTLE_REQUIRE_REAL is set): %v", initErr)
		}
		t.Skipf("no PostgreSQL: %v", initErr)
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	name := "jt_" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := exec1(ctx, baseURL, "CREATE DATABASE "+name+" TEMPLATE "+template); err != nil {
		t.Fatalf("pgtest: creating database %s: %v", name, err)
	}
	u := withDatabase(baseURL, name)
	pool, err := pgxpool.New(ctx, u)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		pool.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := exec1(ctx, baseURL, "DROP DATABASE "+name+" WITH (FORCE)"); err != nil {
			t.Logf("pgtest: dropping database %s: %v", name, err)
		}
	})
	return pool, u
}

// Stop stops the server this package started, if any, and removes its directory; call
// it when the tests end (TestMain).
func Stop() {
	if server == nil {
		return
	}
	// SIGQUIT is PostgreSQL's immediate shutdown (pg_ctl stop -m immediate)
	_ = server.Process.Signal(syscall.SIGQUIT)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = server.Process.Kill()
		<-exited
	}
	server = nil
	_ = os.RemoveAll(dataDir)
}

// setup finds or starts the server and makes the template database.
func setup() {
	baseURL = os.Getenv(EnvURL)
	if baseURL == "" {
		if baseURL, initErr = start(); initErr != nil {
			initErr = fmt.Errorf("%s is unset and a server could not be started: %w", EnvURL, initErr)
			return
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	initErr = makeTemplate(ctx)
}

// makeTemplate creates the template database with River's tables, anew.
func makeTemplate(ctx context.Context) error {
	if err := exec1(ctx, baseURL, "DROP DATABASE IF EXISTS "+template+" WITH (FORCE)"); err != nil {
		return err
	}
	if err := exec1(ctx, baseURL, "CREATE DATABASE "+template); err != nil {
		return err
	}
	pool, err := pgxpool.New(ctx, withDatabase(baseURL, template))
	if err != nil {
		return err
	}
	defer pool.Close()
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrating River's tables: %w", err)
	}
	return nil
}

// exec1 runs one statement on a connection of its own to u.
func exec1(ctx context.Context, u, sql string) error {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	return err
}

func withDatabase(u, db string) string {
	p, err := url.Parse(u)
	if err != nil {
		return u
	}
	p.Path = "/" + db
	return p.String()
}

// start initialises a cluster in a temporary directory and starts its server on a free
// 127.0.0.1 port, as "postgres" when this process runs as root; the kernel kills the
// server if this process dies first.
func start() (string, error) {
	initdb, err := exec.LookPath("initdb")
	if err != nil {
		return "", err
	}
	bin, err := exec.LookPath("postgres")
	if err != nil {
		return "", err
	}
	var cred *syscall.Credential
	if os.Geteuid() == 0 {
		if cred, err = credential("postgres"); err != nil {
			return "", fmt.Errorf("running as root, and no user to run PostgreSQL as: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "jobthrottle-pg-")
	if err != nil {
		return "", err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return "", err
		}
	}
	data := filepath.Join(dir, "data")
	cmd := exec.Command(initdb, "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
	if out, err := cmd.CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		return "", fmt.Errorf("initdb: %v: %s", err, out)
	}
	dataDir = dir
	for attempt := 0; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return "", err
		}
		log, err := os.Create(filepath.Join(dir, "postgres.log"))
		if err != nil {
			return "", err
		}
		if cred != nil {
			_ = log.Chown(int(cred.Uid), int(cred.Gid))
		}
		cmd := exec.Command(bin, "-D", data, "-p", strconv.Itoa(port), "-k", dir,
			"-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "synchronous_commit=off",
			"-c", "full_page_writes=off", "-c", "max_connections=300")
		cmd.Stdout, cmd.Stderr = log, log
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			log.Close()
			return "", err
		}
		log.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		u := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", port)
		if err := waitReady(u, done, 30*time.Second); err != nil {
			_ = cmd.Process.Kill()
			<-done
			if attempt < 3 {
				continue // the port was taken in between
			}
			out, _ := os.ReadFile(filepath.Join(dir, "postgres.log"))
			return "", fmt.Errorf("postgres on port %d: %w: %s", port, err, out)
		}
		server, exited = cmd, done
		return u, nil
	}
}

// credential returns the user's uid and gid.
func credential(name string) (*syscall.Credential, error) {
	u, err := user.Lookup(name)
	if err != nil {
		return nil, err
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, err
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// waitReady waits until the server at u accepts a query, failing at once if it exits
// (exited closed).
func waitReady(u string, exited <-chan struct{}, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := exec1(ctx, u, "SELECT 1")
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		select {
		case <-exited:
			return errors.New("the server exited")
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
