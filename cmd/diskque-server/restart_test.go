package main

// End-to-end tests of what survives a stop: restart on the same directory,
// graceful stop under load, appendonly no, the config file and flags.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestRestart: SIGTERM and a restart on the same directory keep the node
// id, the queues in order, delayed, in-flight, nacked-with-delay and
// expiring jobs at their original times, counters and pauses.
func TestRestart(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	me := myID(t, c)

	var want []string
	var ids []string
	for i := range 20 {
		body := fmt.Sprint("r", i)
		ids = append(ids, addJob(t, c, "rq", body))
		addJob(t, c, "rq-other", body)
		if i != 7 && i != 13 {
			want = append(want, body)
		}
	}
	doInt(t, c, "ACKJOB", ids[7])
	doInt(t, c, "DELJOB", ids[13])

	// Counters.
	nk := addJob(t, c, "nq", "nacked")
	for range 2 {
		getJobs(t, c, "FROM", "nq")
		doInt(t, c, "NACK", nk)
	}
	// Pauses.
	doStr(t, c, "PAUSE", "pin", "in")
	doStr(t, c, "PAUSE", "pout", "out")
	addJob(t, c, "pout", "held")

	// Jobs with a time: DELAY 4, in flight with RETRY 4, NACK DELAY 4 and
	// TTL 5. Then let time pass so that "at the original time" and "after
	// the restart" differ by more than the tolerance.
	const tolerance = 1500 * time.Millisecond
	beforeAdd := time.Now()
	dl := addJob(t, c, "dq", "delayed", "DELAY", 4)
	afterAdd := time.Now()
	inflight := addJob(t, c, "iq", "inflight", "RETRY", 4)
	beforeGet := time.Now()
	if got := getJobs(t, c, "FROM", "iq"); len(got) != 1 || got[0].ID != inflight {
		t.Fatalf("GETJOB iq = %v", got)
	}
	afterGet := time.Now()
	backoff := addJob(t, c, "bq", "backoff")
	getJobs(t, c, "FROM", "bq")
	beforeNack := time.Now()
	doInt(t, c, "NACK", backoff, "DELAY", 4)
	afterNack := time.Now()
	beforeTTL := time.Now()
	expiring := addJob(t, c, "tq", "expiring", "TTL", 5)
	afterTTL := time.Now()
	waitUntil(t, 10*time.Second, "the timed jobs to be 2.5 s from due", func() bool {
		a, _ := show(t, c, dl)["next-awake-within"].(int64)
		r, _ := show(t, c, inflight)["next-requeue-within"].(int64)
		return a < 2500 && r < 2000 // RETRY has ± 500 ms jitter
	})

	stopping := time.Now()
	s.Restart()
	restarted := time.Now()
	t.Logf("stop and start took %v", restarted.Sub(stopping))
	c = s.client(t)

	if got := myID(t, c); got != me {
		t.Errorf("node id after restart = %s, want %s", got, me)
	}
	if n := doInt(t, c, "QLEN", "rq"); n != int64(len(want)) {
		t.Errorf("QLEN rq after restart = %d, want %d", n, len(want))
	}
	if got := bodies(getJobs(t, c, "COUNT", 100, "NOHANG", "FROM", "rq")); !slices.Equal(got, want) {
		t.Errorf("rq after restart = %v\nwant %v", got, want)
	}
	// A job added after the restart sorts after the old ones.
	addJob(t, c, "rq-other", "new")
	if got := bodies(parseJobs(t, do(t, c, "QPEEK", "rq-other", 100))); len(got) != 21 || got[0] != "r0" || got[19] != "r19" || got[20] != "new" {
		t.Errorf("rq-other after restart = %v, want r0…r19 then new", got)
	}
	if m := show(t, c, nk); m["nacks"] != int64(2) || m["state"] != "queued" {
		t.Errorf("nacked job after restart: nacks %v state %v, want 2 queued", m["nacks"], m["state"])
	}
	if got := getJobs(t, c, "WITHCOUNTERS", "FROM", "nq"); len(got) != 1 || got[0].Nacks != 2 {
		t.Errorf("GETJOB WITHCOUNTERS after restart = %+v, want nacks 2", got)
	}
	if st := doStr(t, c, "PAUSE", "pin", "state"); st != "in" {
		t.Errorf("PAUSE pin after restart = %q, want in", st)
	}
	wantErr(t, c, errPausedText, "ADDJOB", "pin", "x", 0)
	if st := doStr(t, c, "PAUSE", "pout", "state"); st != "out" {
		t.Errorf("PAUSE pout after restart = %q, want out", st)
	}
	doNil(t, c, "GETJOB", "NOHANG", "FROM", "pout")

	// The timed jobs fire at their original times.
	var firedD, firedI, firedN, firedT time.Time
	mark := func(at *time.Time, now time.Time, cond func() bool) {
		if at.IsZero() && cond() {
			*at = now
		}
	}
	waitUntil(t, 15*time.Second, "the timed jobs to fire", func() bool {
		now := time.Now()
		mark(&firedD, now, func() bool { return doInt(t, c, "QLEN", "dq") == 1 })
		mark(&firedI, now, func() bool { return doInt(t, c, "QLEN", "iq") == 1 })
		mark(&firedN, now, func() bool { return doInt(t, c, "QLEN", "bq") == 1 })
		mark(&firedT, now, func() bool { return show(t, c, expiring) == nil })
		return !firedD.IsZero() && !firedI.IsZero() && !firedN.IsZero() && !firedT.IsZero()
	})
	for _, tc := range []struct {
		what           string
		fired          time.Time
		before, after  time.Time
		early, late    time.Duration // due between before+early and after+late
		restartedDelay time.Duration // what "the timer restarted" would give
	}{
		{"DELAY 4 job queued", firedD, beforeAdd, afterAdd, 4 * time.Second, 4 * time.Second, 4 * time.Second},
		{"RETRY 4 in-flight job requeued", firedI, beforeGet, afterGet, 3500 * time.Millisecond, 4500 * time.Millisecond, 3500 * time.Millisecond},
		{"NACK DELAY 4 job queued", firedN, beforeNack, afterNack, 4 * time.Second, 4 * time.Second, 4 * time.Second},
		{"TTL 5 job expired", firedT, beforeTTL, afterTTL, 5 * time.Second, 5 * time.Second, 5 * time.Second},
	} {
		t.Logf("%s %v after it was set", tc.what, tc.fired.Sub(tc.before))
		if tc.fired.Before(tc.before.Add(tc.early-100*time.Millisecond)) || tc.fired.After(tc.after.Add(tc.late+tolerance)) {
			t.Errorf("%s %v after it was set, want %v..%v (+%v)", tc.what, tc.fired.Sub(tc.before), tc.early, tc.late, tolerance)
		}
		if !tc.fired.Before(restarted.Add(tc.restartedDelay)) {
			t.Errorf("%s %v after the restart: the timer restarted", tc.what, tc.fired.Sub(restarted))
		}
	}
	got := getJobs(t, c, "WITHCOUNTERS", "FROM", "iq")
	if len(got) != 1 || got[0].ID != inflight || got[0].AdditionalDeliveries != 1 {
		t.Errorf("requeued in-flight job = %+v, want additional-deliveries 1", got)
	}
	if got := getJobs(t, c, "FROM", "dq"); len(got) != 1 || got[0].ID != dl {
		t.Errorf("delayed job after restart = %+v", got)
	}
	if got := getJobs(t, c, "WITHCOUNTERS", "FROM", "bq"); len(got) != 1 || got[0].ID != backoff || got[0].Nacks != 1 {
		t.Errorf("NACK DELAY job after restart = %+v, want nacks 1", got)
	}

	// And once more: a second restart changes nothing.
	s.Restart()
	c = s.client(t)
	if got := myID(t, c); got != me {
		t.Errorf("node id after the second restart = %s, want %s", got, me)
	}
	if n := doInt(t, c, "QLEN", "rq-other"); n != 21 {
		t.Errorf("QLEN rq-other after the second restart = %d, want 21", n)
	}
	if n := doInt(t, c, "QLEN", "rq"); n != 0 {
		t.Errorf("QLEN rq after the second restart = %d, want 0 (all delivered)", n)
	}
}

// TestGracefulStop: SIGTERM under load and with a blocked client exits 0
// promptly, and every ADDJOB that got an id survives the restart, in order.
func TestGracefulStop(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)

	blocked := make(chan error, 1)
	bc := s.client(t)
	go func() {
		_, err := bc.Do(context.Background(), "GETJOB", "FROM", "never").Result()
		blocked <- err
	}()
	waitBlocked(t, c, 1)

	load := startProducers(t, s, 4, "gq")
	defer load.stop()
	waitUntil(t, 30*time.Second, "300 acknowledged ADDJOBs", func() bool { return load.total.Load() >= 300 })
	s.Stop() // checks the exit code is 0
	load.stop()
	select {
	case err := <-blocked:
		t.Logf("the blocked GETJOB got %v at shutdown", err)
	case <-time.After(10 * time.Second):
		t.Errorf("a blocked GETJOB did not return after the server stopped")
	}

	s.Start()
	checkSurvivors(t, s.client(t), "gq", load.acked)
}

// TestAppendOnlyNo: memory only, everything is gone after a restart
// (documented), and nothing is written to the directory.
func TestAppendOnlyNo(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--appendonly", "no")
	c := s.client(t)
	if inf := info(t, c, "persistence"); inf["aof_enabled"] != "0" || inf["aof_state"] != "off" || inf["loading"] != "0" {
		t.Errorf("INFO persistence with appendonly no = %v", inf)
	}
	id := addJob(t, c, "q", "volatile")
	addJob(t, c, "q", "volatile2")
	doStr(t, c, "PAUSE", "q", "out")

	s.Restart()
	c = s.client(t)
	if n := doInt(t, c, "QLEN", "q"); n != 0 {
		t.Errorf("QLEN after a restart with appendonly no = %d, want 0", n)
	}
	doNil(t, c, "SHOW", id)
	if st := doStr(t, c, "PAUSE", "q", "state"); st != "none" {
		t.Errorf("pause after a restart with appendonly no = %q, want none", st)
	}
	if n := info(t, c, "jobs")["registered_jobs"]; n != "0" {
		t.Errorf("registered_jobs = %s, want 0", n)
	}
	entries, err := os.ReadDir(s.dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("appendonly no wrote to --dir: %v", names)
	}
}

// TestConfigFile: a config file as the first argument, include, comments,
// and flags that win over the file.
func TestConfigFile(t *testing.T) {
	t.Parallel()
	cfgDir := t.TempDir()
	extra := filepath.Join(cfgDir, "extra.conf")
	if err := os.WriteFile(extra, []byte("appendfsync no\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	conf := filepath.Join(cfgDir, "diskque.conf")
	if err := os.WriteFile(conf, []byte("# diskque test config\n\nport 1\nappendonly yes\nappendfsync everysec\ninclude extra.conf\nloglevel warning\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	s := startServerConfig(t, serverConfig{pre: []string{conf}, flags: []string{"--appendfsync", "always"}})
	c := s.client(t)
	if inf := info(t, c, "persistence"); inf["aof_fsync"] != "always" || inf["aof_enabled"] != "1" {
		t.Errorf("INFO persistence = %v, want aof_fsync always (the flag wins over the file)", inf)
	}
	if inf := info(t, c, "server"); inf["tcp_port"] != strconv.Itoa(s.port) {
		t.Errorf("tcp_port = %s, want %d (the flag wins over the file)", inf["tcp_port"], s.port)
	}
	addJob(t, c, "q", "x")

	// The include alone (no flag) sets appendfsync no; pidfile and logfile
	// from the command line; SIGINT stops gracefully too.
	s.Stop()
	pidfile := filepath.Join(cfgDir, "diskque.pid")
	logfile := filepath.Join(cfgDir, "diskque.log")
	s.flags = []string{"--pidfile", pidfile, "--logfile", logfile, "--loglevel", "notice"}
	s.Start()
	if b, err := os.ReadFile(pidfile); err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(s.proc.cmd.Process.Pid) {
		t.Errorf("pidfile = %q, %v; want %d", b, err, s.proc.cmd.Process.Pid)
	}
	if b, err := os.ReadFile(logfile); err != nil || !strings.Contains(string(b), "ready to accept commands") {
		t.Errorf("logfile = %q, %v", b, err)
	}
	defer func() {
		if t.Failed() {
			b, _ := os.ReadFile(logfile)
			t.Logf("logfile:\n%s", b)
		}
	}()
	c = s.client(t)
	if inf := info(t, c, "persistence"); inf["aof_fsync"] != "no" {
		t.Errorf("aof_fsync = %q, want no from the included file", inf["aof_fsync"])
	}
	if n := doInt(t, c, "QLEN", "q"); n != 1 {
		t.Errorf("QLEN after restart = %d, want 1", n)
	}
	s.stopWith(syscall.SIGINT)
	if _, err := os.Stat(pidfile); !os.IsNotExist(err) {
		t.Errorf("pidfile still there after the stop: %v", err)
	}
}

// TestBadFlags: invalid flags exit 2 with a message, never start.
func TestBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"--appendfsync", "sometimes"},
		{"--appendonly", "maybe"},
		{"--port", "70000"},
		{"--bogus", "1"},
		{"--port"},
		{"stray", "arg"},
	} {
		cmd := exec.Command(serverBin, append(args, "--dir", t.TempDir())...)
		out, err := cmd.CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() == 0 {
			t.Errorf("diskque-server %v: %v, want a non-zero exit\n%s", args, err, out)
			continue
		}
		if !strings.Contains(string(out), "diskque-server:") {
			t.Errorf("diskque-server %v printed %q, want an explanation", args, out)
		}
	}
	out, err := exec.Command(serverBin, "--help").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "usage: diskque-server") {
		t.Errorf("--help: %v\n%s", err, out)
	}
}
