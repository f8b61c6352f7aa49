//go:build unix

package bench

import (
	"os/exec"
	"syscall"
)

// detach puts the server in its own process group, so a Ctrl-C at the
// terminal reaches only the benchmark, which then stops the server itself.
func detach(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
}
