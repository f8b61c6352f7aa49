package main

// diskque-server as a drop-in for disque-server under Disque's own test
// suite (shared/CLUSTER.md "How it is checked"): it starts each instance as
// "disque-server disque_N/disque.conf" from one working directory, with a
// config file of exactly four lines, and restarts it with the same file
// after a SIGKILL.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// freeClusterPort returns a client port P whose default bus port P + 10000
// was also free a moment ago (Disque's suite names only P).
func freeClusterPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		p := freePort(t)
		if p+busPortOffset > 65535 {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p+busPortOffset)))
		if err != nil {
			continue
		}
		ln.Close()
		return p
	}
	t.Fatal("no free port P with P + 10000 free")
	return 0
}

// disqueInstance writes work/disque_N/disque.conf, the Disque suite's four
// lines, and returns a daemon that starts "diskque-server
// disque_N/disque.conf" in work (not yet started).
func disqueInstance(t *testing.T, work string, n, port int) *daemon {
	t.Helper()
	dir := filepath.Join(work, fmt.Sprintf("disque_%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	conf := fmt.Sprintf("port %d\ndir ./disque_%d\nlogfile log.txt\nloglevel notice\n", port, n)
	if err := os.WriteFile(filepath.Join(dir, "disque.conf"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	s := &daemon{t: t, dir: dir, cwd: work, fixedPort: port,
		pre: []string{fmt.Sprintf("disque_%d/disque.conf", n)}}
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		b, _ := os.ReadFile(filepath.Join(dir, "log.txt"))
		t.Logf("disque_%d/log.txt:\n%s", n, b)
		for i, l := range s.logs {
			t.Logf("disque_%d output (run %d):\n%s", n, i+1, l.String())
		}
	})
	t.Cleanup(func() {
		if s.proc != nil {
			s.Kill()
		}
	})
	return s
}

// TestDisqueConfigDropIn: the Disque suite's config file starts the server
// (relative dir, chdir into it, the log in it); CONFIG SET
// cluster-node-timeout + CONFIG REWRITE write the file it was started with,
// and a restart after SIGKILL with the same file reads them back, its jobs
// still there.
func TestDisqueConfigDropIn(t *testing.T) {
	work := t.TempDir()
	port := freeClusterPort(t)
	s := disqueInstance(t, work, 1, port)
	s.Start()
	c := s.client(t)
	id := addJob(t, c, "q", "survives")
	if got := doStr(t, c, "CONFIG", "SET", "cluster-node-timeout", "3000"); got != "OK" {
		t.Fatalf("CONFIG SET cluster-node-timeout = %q", got)
	}
	if got := doStr(t, c, "CONFIG", "SET", "appendonly", "yes"); got != "OK" {
		t.Fatalf("CONFIG SET appendonly = %q", got)
	}
	if got := doStr(t, c, "CONFIG", "REWRITE"); got != "OK" {
		t.Fatalf("CONFIG REWRITE = %q", got)
	}
	conf, err := os.ReadFile(filepath.Join(s.dir, "disque.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range []string{fmt.Sprintf("port %d", port), "dir ./disque_1", "logfile log.txt", "cluster-node-timeout 3000"} {
		if !strings.Contains(string(conf), line+"\n") {
			t.Errorf("the rewritten disque.conf lacks %q:\n%s", line, conf)
		}
	}
	if strings.Contains(string(conf), "cluster-bus-port") {
		t.Errorf("CONFIG REWRITE wrote the default cluster-bus-port (port + 10000) as a setting:\n%s", conf)
	}

	s.Kill()
	s.Start()
	c = s.client(t)
	if got := doArr(t, c, "CONFIG", "GET", "cluster-node-timeout"); len(got) != 2 || got[1] != "3000" {
		t.Errorf("CONFIG GET cluster-node-timeout after the restart = %v, want 3000", got)
	}
	if got := doArr(t, c, "CONFIG", "GET", "cluster-bus-port"); len(got) != 2 || got[1] != strconv.Itoa(port+busPortOffset) {
		t.Errorf("CONFIG GET cluster-bus-port = %v, want %d", got, port+busPortOffset)
	}
	if got := info(t, c, "persistence")["aof_state"]; got != "on" {
		t.Errorf("aof_state = %q, want on", got)
	}
	if jobs := getJobs(t, c, "NOHANG", "FROM", "q"); len(jobs) != 1 || jobs[0].ID != id {
		t.Errorf("after SIGKILL and a restart, GETJOB = %v, want %s", jobs, id)
	}
	log, err := os.ReadFile(filepath.Join(work, "disque_1", "log.txt"))
	if err != nil || strings.Count(string(log), "ready to accept commands") != 2 {
		t.Errorf("disque_1/log.txt (%v) should hold both runs' logs:\n%s", err, log)
	}
	// The store is in disque_1 itself: nothing was written in the working
	// directory but disque_1.
	entries, _ := os.ReadDir(work)
	if len(entries) != 1 {
		t.Errorf("the working directory holds %v, want only disque_1", entries)
	}
}

// TestClusterConfigDirectives: the cluster directives are read, checked and
// reported; the secret is never shown; the bus port defaults to port +
// 10000 and port 0 picks a free one.
func TestClusterConfigDirectives(t *testing.T) {
	cfg, err := parseArgs([]string{"--port", "7712"})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.busPort() != 17712 || cfg.ClusterNodeTimeout != 15000 || cfg.ClusterSecret != "" {
		t.Errorf("defaults: bus port %d, node timeout %d, secret %q", cfg.busPort(), cfg.ClusterNodeTimeout, cfg.ClusterSecret)
	}
	for _, tc := range []struct {
		args []string
		bus  int
	}{
		{[]string{"--port", "0"}, 0},
		{[]string{"--port", "7711", "--cluster-bus-port", "0"}, 0},
		{[]string{"--port", "7711", "--cluster-bus-port", "9000"}, 9000},
		{[]string{"--port", "60000", "--cluster-bus-port", "9000"}, 9000},
	} {
		cfg, err := parseArgs(tc.args)
		if err != nil || cfg.busPort() != tc.bus {
			t.Errorf("%v: bus port %d, %v; want %d", tc.args, cfg.busPort(), err, tc.bus)
		}
	}
	for _, args := range [][]string{
		{"--cluster-node-timeout", "x"},
		{"--cluster-node-timeout", "99"},
		{"--cluster-node-timeout", "-1"},
		{"--cluster-bus-port", "65536"},
		{"--cluster-bus-port", "-1"},
		{"--port", "60000"}, // the default bus port would be 70000
	} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}

	l := &liveConfig{cfg: defaultConfig()}
	l.cfg.ClusterSecret = "s3cret"
	got := l.Get("cluster-*")
	want := []string{"cluster-node-timeout", "15000", "cluster-bus-port", "17711", "cluster-secret", redacted,
		"cluster-announce-ip", "", "cluster-announce-port", "0", "cluster-announce-bus-port", "0"}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("CONFIG GET cluster-* = %v, want %v", got, want)
	}
	if err := l.Set("cluster-secret", "other"); err == nil {
		t.Errorf("CONFIG SET cluster-secret accepted: it needs a restart")
	}
	// REWRITE writes the secret (the file is the operator's), and the bus
	// port only when set.
	out := string(rewriteConfig(nil, &l.cfg))
	if !strings.Contains(out, "cluster-secret s3cret\n") || strings.Contains(out, "cluster-bus-port") {
		t.Errorf("rewrite:\n%s", out)
	}
}
