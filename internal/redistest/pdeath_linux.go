package redistest

import (
	"os/exec"
	"syscall"
)

// setParentDeath makes the kernel kill the server when the test process dies, so an
// interrupted test run leaves no redis-server behind.
func setParentDeath(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
