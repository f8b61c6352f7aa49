package testtool

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
)

// recorder is a TB that notes what was called; Skipf and Fatalf stop the
// calling goroutine as testing's do.
type recorder struct {
	logged, skipped, failed string
}

func (r *recorder) Helper()                   {}
func (r *recorder) Logf(f string, a ...any)   { r.logged = fmt.Sprintf(f, a...) }
func (r *recorder) Skipf(f string, a ...any)  { r.skipped = fmt.Sprintf(f, a...); runtime.Goexit() }
func (r *recorder) Fatalf(f string, a ...any) { r.failed = fmt.Sprintf(f, a...); runtime.Goexit() }
func run(fn func(*recorder) string) (*recorder, string) {
	r := &recorder{}
	var got string
	done := make(chan struct{})
	go func() {
		defer close(done)
		got = fn(r)
	}()
	<-done
	return r, got
}

// TestMissingProgram: outside CI a missing program skips (Require) or is
// left out with a log line (Optional); under CI both fail the test.
func TestMissingProgram(t *testing.T) {
	const missing = "diskque-no-such-program"
	t.Setenv("PATH", t.TempDir())
	for _, ci := range []string{"", "false", "0"} {
		t.Setenv("CI", ci)
		if r, _ := run(func(r *recorder) string { return Require(r, missing) }); r.skipped == "" || r.failed != "" {
			t.Errorf("CI=%q: Require of a missing program: %+v, want a skip", ci, r)
		}
		if r, got := run(func(r *recorder) string { return Optional(r, missing) }); got != "" || r.failed != "" || !strings.Contains(r.logged, missing) {
			t.Errorf("CI=%q: Optional of a missing program: %q, %+v, want \"\" and a log line", ci, got, r)
		}
	}
	for _, ci := range []string{"true", "1", "yes"} {
		t.Setenv("CI", ci)
		for name, fn := range map[string]func(TB, string) string{"Require": Require, "Optional": Optional} {
			r, _ := run(func(r *recorder) string { return fn(r, missing) })
			if r.skipped != "" || !strings.Contains(r.failed, missing+" not installed") {
				t.Errorf("CI=%q: %s of a missing program: %+v, want a failure", ci, name, r)
			}
		}
	}
}

// TestPresentProgram: a program on PATH is found, under CI or not.
func TestPresentProgram(t *testing.T) {
	dir := t.TempDir()
	prog := filepath.Join(dir, "diskque-fake-tool")
	if err := os.WriteFile(prog, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	for _, ci := range []string{"", "true"} {
		t.Setenv("CI", ci)
		for name, fn := range map[string]func(TB, string) string{"Require": Require, "Optional": Optional} {
			r, got := run(func(r *recorder) string { return fn(r, "diskque-fake-tool") })
			if got != prog || r.skipped != "" || r.failed != "" {
				t.Errorf("CI=%q: %s = %q, %+v; want %s", ci, name, got, r, prog)
			}
		}
	}
}
