// Package testtool finds the outside programs that some tests drive or
// compare against: redis-server (bench's redis runs beside diskque's) and
// redis-cli (the daemon driven as a user would). .ci/run installs them.
//
// Outside CI a missing program skips the test (go test -v shows why);
// under CI — the CI environment variable set to anything but "", "0",
// "false" or "no", as CI runners do — it fails the test instead, so a comparison
// that CI claims to run can never skip unseen. CI=1 make test checks the
// same on a developer's machine.
package testtool

import (
	"os"
	"os/exec"
	"strings"
)

// TB is the part of testing.TB that Require and Optional use.
type TB interface {
	Helper()
	Logf(format string, args ...any)
	Skipf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// InCI reports whether the tests run under CI (the CI variable).
func InCI() bool {
	switch strings.ToLower(os.Getenv("CI")) {
	case "", "0", "false", "no":
		return false
	}
	return true
}

// Require returns the path of program name on PATH. A missing program
// skips the test, or fails it under CI.
func Require(t TB, name string) string {
	t.Helper()
	return lookPath(t, name, func() { t.Skipf("%s not installed (under CI this fails)", name) })
}

// Optional is Require for a test that has a part without name: it returns
// "" when name is missing (logging so), and fails the test under CI.
func Optional(t TB, name string) string {
	t.Helper()
	return lookPath(t, name, func() {
		t.Logf("%s not installed: its part of the test is left out (under CI this fails)", name)
	})
}

// lookPath returns the path of name, or "" after failing the test under CI
// or calling missing elsewhere.
func lookPath(t TB, name string, missing func()) string {
	t.Helper()
	p, err := exec.LookPath(name)
	switch {
	case err == nil:
		return p
	case InCI():
		t.Fatalf("%s not installed, and CI must run this test (.ci/run installs it): %v", name, err)
	default:
		missing()
	}
	return ""
}
