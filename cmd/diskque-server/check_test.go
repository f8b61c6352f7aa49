package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/diskque/diskque/wal"
	"github.com/redis/go-redis/v9"
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

// TestLostIndexIsRebuiltExactly: a server whose checkpoints have removed
// segments from the middle of its AOF — churn that held the deliveries,
// requeues and acks of jobs whose bodies are older — loses its index (rm -r
// index/), or is asked to rebuild it (--rebuild-index): it starts, rebuilds
// the index from what the AOF holds, and every job, queue and pause is as it
// was: acked jobs stay gone, delivered ones stay delivered.
func TestLostIndexIsRebuiltExactly(t *testing.T) {
	s := startServer(t, "--aof-segment-size", "64kb", "--gc-interval", "0")
	c := s.client(t)
	body := strings.Repeat("b", 300)
	var keep []string
	for range 150 {
		keep = append(keep, addJob(t, c, "keep", body, "RETRY", 600))
	}
	churn := func(n int) {
		for range n {
			id := addJob(t, c, "churn", body)
			if got := getJobs(t, c, "NOHANG", "FROM", "churn"); len(got) != 1 || got[0].ID != id {
				t.Fatalf("GETJOB churn = %v", got)
			}
			doInt(t, c, "ACKJOB", id)
		}
	}
	churn(300)
	got := getJobs(t, c, "NOHANG", "COUNT", 100, "FROM", "keep") // delivered, in a churn segment
	churn(300)
	for _, j := range got[:30] {
		doInt(t, c, "NACK", j.ID) // back in the queue, nacks 1
	}
	for _, j := range got[30:40] {
		doInt(t, c, "ACKJOB", j.ID) // gone, their bodies in the oldest segments
	}
	doStr(t, c, "PAUSE", "paused-queue", "in")
	churn(300)
	snapshot := func(c *redis.Client) map[string]string {
		out := map[string]string{}
		for _, id := range keep {
			m := show(t, c, id)
			if m == nil {
				out[id] = "gone"
				continue
			}
			out[id] = fmt.Sprint(m["state"], m["queue"], m["nacks"], m["additional-deliveries"], m["body"])
		}
		out["qlen"] = fmt.Sprint(doInt(t, c, "QLEN", "keep"))
		out["jobs"] = info(t, c, "jobs")["registered_jobs"]
		return out
	}
	want := snapshot(c)
	s.Stop() // the checkpoint removes the dead churn segments
	if err := os.RemoveAll(filepath.Join(s.dir, "index")); err != nil {
		t.Fatal(err)
	}
	for _, restart := range []func(){
		func() { s.Start() },
		func() { s.flags = append(s.flags, "--rebuild-index"); s.Start() },
	} {
		restart()
		c = s.client(t)
		if got := snapshot(c); !maps.Equal(got, want) {
			t.Fatalf("after the rebuild:\n%v\nwant\n%v", got, want)
		}
		if v, err := c.Do(t.Context(), "ADDJOB", "paused-queue", "x", 0).Result(); err == nil {
			t.Fatalf("ADDJOB to a queue paused in input: %v", v)
		}
		out := s.logs[len(s.logs)-1].String()
		if !strings.Contains(out, "rebuilt from the append-only file") {
			t.Fatalf("no rebuild in the log:\n%s", out)
		}
		s.Stop()
	}
}
