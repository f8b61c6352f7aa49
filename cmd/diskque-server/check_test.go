package main

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/diskque/diskque/wal"
)

// runCheckBin runs `diskque-server check` and returns its output and exit
// status.
func runCheckBin(t *testing.T, args ...string) (string, int) {
	t.Helper()
	out, err := exec.Command(serverBin, append([]string{"check"}, args...)...).CombinedOutput()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return string(out), 0
	case errors.As(err, &ee):
		return string(out), ee.ExitCode()
	}
	t.Fatalf("check: %v", err)
	return "", -1
}

// TestDamagedAOFRefusesToStartAndCheckRepairs: a byte flipped in the fsynced
// part of the AOF (appendfsync always) makes the server refuse to start with
// a message naming the segment and the offset and pointing to `check`, and
// change nothing; `check` reports the damage (exit 1), `check --repair`
// replaces the damaged span and finds the directory sound (exit 0), and the
// server then starts with every job whose record was not in the span.
func TestDamagedAOFRefusesToStartAndCheckRepairs(t *testing.T) {
	s := startServer(t, "--appendfsync", "always")
	c := s.client(t)
	const n = 200
	var ids []string
	for i := range n {
		ids = append(ids, addJob(t, c, "q", strings.Repeat(string(rune('a'+i%26)), 200)))
	}
	s.Kill()
	aof := filepath.Join(s.dir, "aof")
	segs, err := wal.ListSegments(wal.DefaultOptions().FS, aof)
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments: %v, %v", segs, err)
	}
	last := filepath.Join(aof, segs[len(segs)-1].Name)
	b, err := os.ReadFile(last)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x10
	if err := os.WriteFile(last, b, 0o644); err != nil {
		t.Fatal(err)
	}
	list := func() []string {
		es, _ := os.ReadDir(aof)
		var names []string
		for _, e := range es {
			names = append(names, e.Name())
		}
		sort.Strings(names)
		return names
	}
	before := list()

	out, err := exec.Command(serverBin, "--port", "0", "--dir", s.dir).CombinedOutput()
	if err == nil {
		t.Fatalf("the server started on a damaged aof:\n%s", out)
	}
	for _, want := range []string{segs[len(segs)-1].Name, "not a torn write", "nothing was changed", "diskque-server check --dir"} {
		if !strings.Contains(string(out), want) {
			t.Fatalf("the refusal does not say %q:\n%s", want, out)
		}
	}
	if got, _ := os.ReadFile(last); !bytes.Equal(got, b) || strings.Join(list(), " ") != strings.Join(before, " ") {
		t.Fatal("a refused start changed the aof directory")
	}

	report, code := runCheckBin(t, "--dir", s.dir)
	if code != 1 || !strings.Contains(report, "damage: "+segs[len(segs)-1].Name) || !strings.Contains(report, "refuses to start") {
		t.Fatalf("check: exit %d, want 1 and the damage:\n%s", code, report)
	}
	report, code = runCheckBin(t, "--dir", s.dir, "--repair")
	if code != 0 || !strings.Contains(report, "repaired "+segs[len(segs)-1].Name) || !strings.HasSuffix(strings.TrimSpace(report), "OK") {
		t.Fatalf("check --repair: exit %d, want 0:\n%s", code, report)
	}
	if _, err := os.Stat(last + ".broken"); err != nil {
		t.Fatalf("the damaged original was not kept: %v", err)
	}

	s.Start()
	c = s.client(t)
	found := 0
	for _, id := range ids {
		if _, err := c.Do(t.Context(), "SHOW", id).Result(); err == nil {
			found++
		}
	}
	if found < n-2 { // none lost if the flipped byte was in a sync mark
		t.Fatalf("%d of %d jobs after the repair, want all but the one or two whose records were in the span", found, n)
	}
}
