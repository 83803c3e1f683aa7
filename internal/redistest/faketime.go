package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// ServerClock moves the clock of a redis-server started by StartServerWithClock: the
// server runs under libfaketime, which reads its offset from a file on every clock
// read, so Set takes effect on the server's next TIME (and on its key expiry).
type ServerClock struct {
	file string
}

// Set puts the server's wall clock offset (whole seconds) from the real one; a later
// Set replaces it, so Set(-time.Second) after Set(0) steps the clock back one second.
// CLOCK_MONOTONIC is left alone, so the server's own timers keep running.
func (c *ServerClock) Set(offset time.Duration) error {
	return os.WriteFile(c.file, []byte(fmt.Sprintf("%+d\n", int64(offset/time.Second))), 0o644)
}

var (
	fakeLibOnce sync.Once
	fakeLib     string
	fakeLibErr  error
)

// FaketimeLib returns the LD_PRELOAD value the faketime wrapper uses for libfaketime
// (e.g. "/usr/$LIB/faketime/libfaketime.so.1"), or an error when faketime is not
// installed.
func FaketimeLib() (string, error) {
	fakeLibOnce.Do(func() {
		// Where Debian and most distributions install it: no process is started. The
		// wrapper below leaves /dev/shm names behind when it is killed, and fails at
		// once for a pid that has one; pids are given out in order, so on a machine
		// with 899 such names all three tries failed in a row (every clock-skew case).
		if lib := installedFaketimeLib(); lib != "" {
			fakeLib = lib
			return
		}
		bin, err := exec.LookPath("faketime")
		if err != nil {
			fakeLibErr = fmt.Errorf("faketime is not installed (Debian package faketime): %w", err)
			return
		}
		// the wrapper fails at once ("sem_open: File exists") when a killed run left
		// /dev/shm names for the pid it got: another try gets another pid
		var out []byte
		for try := 0; try < 3; try++ {
			if out, err = exec.Command(bin, "-f", "+0", "/bin/sh", "-c", `printf %s "$LD_PRELOAD"`).Output(); err == nil && len(out) > 0 {
				break
			}
		}
		if err != nil || len(out) == 0 {
			fakeLibErr = fmt.Errorf("faketime did not say where libfaketime is: %q %v", out, err)
			return
		}
		fakeLib = strings.TrimSpace(string(out))
	})
	return fakeLib, fakeLibErr
}

// installedFaketimeLib returns the path of libfaketime.so.1 where a package installs
// it, for this machine's architecture when several are installed, or "".
func installedFaketimeLib() string {
	triplet := map[string]string{"amd64": "x86_64", "arm64": "aarch64", "386": "i386"}[runtime.GOARCH]
	var found []string
	for _, pattern := range []string{
		"/usr/lib/*/faketime/libfaketime.so.1",
		"/usr/lib64/faketime/libfaketime.so.1",
		"/usr/lib/faketime/libfaketime.so.1",
		"/usr/local/lib/faketime/libfaketime.so.1",
	} {
		m, _ := filepath.Glob(pattern)
		found = append(found, m...)
	}
	for _, lib := range found {
		if triplet != "" && strings.Contains(lib, "/"+triplet+"-") {
			return lib
		}
	}
	if len(found) > 0 && triplet == "" {
		return found[0]
	}
	for _, lib := range found {
		if !strings.Contains(filepath.Base(filepath.Dir(filepath.Dir(lib))), "-linux-") {
			return lib // not under another architecture's multiarch directory
		}
	}
	return ""
}

// StartServerWithClock starts a redis-server (as StartServer) whose wall clock the
// test moves with the returned ServerClock; it starts at the real time.
//
// The server runs with libfaketime preloaded, and glibc's malloc in front of the
// jemalloc Debian's redis-server links: libfaketime and jemalloc call each other while
// they start and deadlock (wolfcw/libfaketime#130), glibc's malloc does not.
func StartServerWithClock(extra ...string) (*Server, *ServerClock, error) {
	lib, err := FaketimeLib()
	if err != nil {
		return nil, nil, err
	}
	dir, err := os.MkdirTemp("", "jobthrottle-clock-")
	if err != nil {
		return nil, nil, err
	}
	c := &ServerClock{file: filepath.Join(dir, "faketime")}
	if err := c.Set(0); err != nil {
		return nil, nil, err
	}
	s, err := StartServerEnv([]string{
		"LD_PRELOAD=" + lib + " libc.so.6",
		"FAKETIME_TIMESTAMP_FILE=" + c.file,
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	}, extra...)
	if err != nil {
		os.RemoveAll(dir)
		return nil, nil, err
	}
	mu.Lock()
	cleanup = append(cleanup, dir)
	mu.Unlock()
	return s, c, nil
}
