package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDataDirRemovedIdlesAndStops: the data directory vanishes under a
// running server, whose AOF segment is still open (so writes still reach
// it) but whose index can no longer create a file. The first index flush
// that fails fails the store: writes get -IOERR, reads go on, the server
// idles with a few log lines (it used to retry the flush in a loop, at more
// than a core and tens of thousands of ERROR lines a second), and SIGTERM
// ends it within 10 s (it used to wait for ever for that flush).
func TestDataDirRemovedIdlesAndStops(t *testing.T) {
	s := startServer(t, "--appendfsync", "always", "--loglevel", "warning")
	c := s.client(t)
	ctx := context.Background()
	for range 50 {
		addJob(t, c, "q", "before")
	}
	if err := os.RemoveAll(s.dir); err != nil {
		t.Fatal(err)
	}
	addJob(t, c, "q", "after") // the open segment takes it
	// A full collection checkpoints: the index flush meets the missing
	// directory.
	do(t, c, "BGREWRITEAOF")
	acked := int64(51)
	waitUntil(t, 20*time.Second, "ADDJOB to be refused with -IOERR", func() bool {
		err := c.Do(ctx, "ADDJOB", "q", "x", 0).Err()
		if err == nil {
			acked++ // until the flush fails, the AOF still takes jobs
		}
		return err != nil && strings.HasPrefix(err.Error(), "IOERR ")
	})
	// Clients get a short, stable text (it used to carry the error chain
	// and the paths under the data directory); the log has the detail.
	const ioerr = "IOERR the store failed (a disk error); writes are refused until the disk works again"
	if err := c.Do(ctx, "ADDJOB", "q", "x", 0).Err(); err == nil || err.Error() != ioerr {
		t.Errorf("ADDJOB on the failed store: %v, want %q", err, ioerr)
	}
	if !strings.Contains(s.logs[len(s.logs)-1].String(), s.dir) {
		t.Errorf("the log does not name the data directory:\n%s", lastLines(s.logs[len(s.logs)-1].String(), 10))
	}
	// INFO says that writes fail.
	if p := info(t, c, "persistence"); p["aof_state"] != "failed" || p["aof_last_write_status"] != "err" {
		t.Errorf("INFO persistence of the failed store: %v", p)
	}
	if n := doInt(t, c, "QLEN", "q"); n != acked {
		t.Errorf("QLEN on the failed store = %d, want %d", n, acked)
	}
	// Idle: few lines, however long it stays like this. (A window to
	// observe, not a wait for anything: the loop wrote thousands of lines
	// in it.)
	logged := func() int { return strings.Count(s.logs[len(s.logs)-1].String(), "\n") }
	before := logged()
	time.Sleep(time.Second)
	if n := logged() - before; n > 5 {
		t.Errorf("the failed server logged %d lines in a second:\n%s", n, lastLines(s.logs[len(s.logs)-1].String(), 10))
	}
	if n := logged(); n > 30 {
		t.Errorf("%d log lines since the start", n)
	}
	p := s.proc
	s.proc = nil // stopped here, not by the cleanup
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.exited:
		t.Logf("exit status %d after SIGTERM", p.cmd.ProcessState.ExitCode())
	case <-time.After(shutdownTimeout):
		_ = p.cmd.Process.Kill()
		<-p.exited
		t.Fatalf("the server did not exit within %v of SIGTERM", shutdownTimeout)
	}
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// TestWatchShutdown: the shutdown watchdog exits with status 1 when the
// graceful path does not finish in time or a second signal comes, and does
// nothing once it finished.
func TestWatchShutdown(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	stage := func() string { return "closing the store" }
	run := func(signals chan os.Signal, finished chan struct{}, timeout time.Duration) chan int {
		exited := make(chan int, 1)
		go func() {
			watchShutdown(log, signals, finished, timeout, stage, func(code int) { exited <- code })
			close(exited)
		}()
		return exited
	}
	// Not finished in time.
	if code, ok := <-run(make(chan os.Signal), make(chan struct{}), time.Millisecond); !ok || code != 1 {
		t.Errorf("timeout: exit %d (%v), want 1", code, ok)
	}
	// A second signal.
	signals := make(chan os.Signal, 1)
	signals <- syscall.SIGINT
	if code, ok := <-run(signals, make(chan struct{}), time.Hour); !ok || code != 1 {
		t.Errorf("second signal: exit %d (%v), want 1", code, ok)
	}
	// Finished.
	finished := make(chan struct{})
	close(finished)
	if code, ok := <-run(make(chan os.Signal), finished, time.Hour); ok {
		t.Errorf("finished: exit %d, want none", code)
	}
}

// TestCorruptIndexIsRebuilt: one damaged index table used to make the
// first SHOW that touched it panic the process (exit 2, every client
// dropped). Now the read that meets the damage answers -IOERR the index is
// corrupt, other clients carry on, and the node sets the index aside and
// rebuilds it from the append-only file by itself (-LOADING meanwhile):
// then every job is back, exactly, and writes work again.
func TestCorruptIndexIsRebuilt(t *testing.T) {
	s := startServer(t, "--loglevel", "warning")
	c := s.client(t)
	var ids []string
	for i := range 2000 {
		ids = append(ids, addJob(t, c, "q", fmt.Sprintf("job-%d", i)))
	}
	s.Stop() // the checkpoint writes the index into one table
	tables, err := filepath.Glob(filepath.Join(s.dir, "index", "*.sst"))
	if err != nil || len(tables) != 1 {
		t.Fatalf("index tables %v (%v), want one", tables, err)
	}
	b, err := os.ReadFile(tables[0])
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/7] ^= 0xff // a data block of job keys
	if err := os.WriteFile(tables[0], b, 0o644); err != nil {
		t.Fatal(err)
	}
	s.Start()
	c, other := s.client(t), s.client(t)
	ctx := context.Background()
	corrupt := 0
	for _, id := range ids {
		err := c.Do(ctx, "SHOW", id).Err()
		switch {
		case err == nil:
		case err.Error() == "IOERR the index is corrupt; writes are refused until it is rebuilt from the append-only file":
			corrupt++ // the file is named in the log (below), not to clients
		case strings.HasPrefix(err.Error(), "LOADING "): // the rebuild has begun
		default:
			t.Fatalf("SHOW %s: %v, want the job, -IOERR the index is corrupt, or -LOADING", id, err)
		}
		if corrupt > 0 {
			break
		}
	}
	if corrupt == 0 {
		t.Fatal("no SHOW met the damage: the test corrupted the wrong place")
	}
	if got := doStr(t, other, "PING"); got != "PONG" {
		t.Fatalf("PING from another client: %q", got)
	}
	out := s.logs[len(s.logs)-1]
	waitUntil(t, 10*time.Second, "the log to name the damaged table", func() bool {
		return strings.Contains(out.String(), filepath.Base(tables[0]))
	})
	waitUntil(t, 60*time.Second, "the index to be rebuilt", func() bool {
		return strings.Contains(out.String(), "the index was rebuilt from the append-only file")
	})
	waitUntil(t, 10*time.Second, "the server to serve again", func() bool {
		return c.Do(ctx, "QLEN", "q").Err() == nil
	})
	for _, id := range ids {
		if err := c.Do(ctx, "SHOW", id).Err(); err != nil {
			t.Fatalf("SHOW %s after the rebuild: %v", id, err)
		}
	}
	if n := doInt(t, c, "QLEN", "q"); n != int64(len(ids)) {
		t.Fatalf("QLEN %d after the rebuild, want %d", n, len(ids))
	}
	addJob(t, c, "q", "after the rebuild")
	if aside, _ := filepath.Glob(filepath.Join(s.dir, "index.broken-*")); len(aside) != 1 {
		t.Fatalf("the corrupt index was not kept aside: %v", aside)
	}
}

// TestRestartOnFullDisk: the disk under a running server (appendfsync
// always) fills up — here another file takes all its free space — and the
// server is killed (SIGKILL) and started again on the full disk. It used to
// die at start-up in Pebble's Open (MANIFEST flush failed: no space left on
// device), every time until space was added. Now it starts read-only,
// serves GETJOB, SHOW and QLEN, refuses ADDJOB with -NOSPACE and, once space
// is freed, takes ADDJOBs again without a restart; no acknowledged job is
// lost. (A kill while an AOF write was failing leaves a torn tail, whose
// repair at start-up needs space: that case waits for a read-only wal.Open.)
func TestRestartOnFullDisk(t *testing.T) {
	mnt := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=100m", "tmpfs", mnt).CombinedOutput(); err != nil {
		t.Skipf("this test fills a small filesystem and cannot mount one (root and tmpfs needed): %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", mnt).Run() })
	s := startServerConfig(t, serverConfig{dir: filepath.Join(mnt, "data"),
		flags: []string{"--appendfsync", "always", "--min-free-disk", "0", "--aof-segment-size", "1mb"}})
	c := s.client(t)
	ctx := context.Background()
	var acked []string
	for i := range 200 {
		acked = append(acked, addJob(t, c, "q", fmt.Sprintf("job-%d", i)))
	}
	// Fill the disk: a file takes every free byte.
	filler := filepath.Join(mnt, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 1<<20)
	for n := len(chunk); n > 0; { // smaller writes for the last bytes
		if _, err := f.Write(chunk[:n]); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("filling the disk: %v", err)
			}
			n /= 2
		}
	}
	f.Close()
	var st syscall.Statfs_t
	if err := syscall.Statfs(mnt, &st); err != nil {
		t.Fatal(err)
	}
	t.Logf("%d jobs acknowledged, then the disk filled up: %d bytes free", len(acked), st.Bavail*uint64(st.Bsize))
	s.Kill()

	s.Start() // on the full disk
	c = s.client(t)
	if n := doInt(t, c, "QLEN", "q"); n != int64(len(acked)) {
		t.Fatalf("QLEN on the full disk = %d, want %d", n, len(acked))
	}
	for _, id := range acked {
		if v := doArr(t, c, "SHOW", id); len(v) != 30 {
			t.Fatalf("SHOW %s on the full disk: %d elements", id, len(v))
		}
	}
	if got := getJobs(t, c, "NOHANG", "COUNT", 5, "FROM", "q"); len(got) != 5 {
		t.Fatalf("GETJOB on the full disk: %d jobs, want 5", len(got))
	}
	if err := c.Do(ctx, "ADDJOB", "q", "more", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "NOSPACE ") {
		t.Fatalf("ADDJOB on the full disk: %v, want -NOSPACE", err)
	}
	if out := s.logs[len(s.logs)-1].String(); strings.Contains(out, "pebble: fatal") || strings.Contains(out, "panic") {
		t.Fatalf("the start on a full disk reached Pebble's fatal path:\n%s", out)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, 20*time.Second, "ADDJOB to be accepted once space is freed", func() bool {
		id, err := c.Do(ctx, "ADDJOB", "q", "after", 0).Text()
		if err == nil {
			acked = append(acked, id)
		}
		return err == nil
	})
	for _, id := range acked {
		if v := doArr(t, c, "SHOW", id); len(v) != 30 {
			t.Fatalf("SHOW %s after space came back: %d elements", id, len(v))
		}
	}
	if n := doInt(t, c, "QLEN", "q"); n != int64(len(acked)) {
		t.Fatalf("QLEN after space came back = %d, want %d", n, len(acked))
	}
}
