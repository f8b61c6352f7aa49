//go:build !unix

package bench

import "os/exec"

// detach is a no-op where process groups are not available.
func detach(cmd *exec.Cmd) {}
