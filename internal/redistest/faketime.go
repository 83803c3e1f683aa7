package redistest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
