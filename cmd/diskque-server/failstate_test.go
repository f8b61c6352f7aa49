package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
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

// TestCorruptIndexAnswersErrors: one damaged table of the index. SHOW of a
// job whose index block is damaged used to panic the daemon (Pebble's
// default corruption handler is fatal) and drop every client; now it
// answers -IOERR naming the file, writes are refused, the other jobs and
// every other client are served, and the node says once what to do instead
// of reopening the store in a loop.
func TestCorruptIndexAnswersErrors(t *testing.T) {
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
	corrupt, readable := 0, 0
	for _, id := range ids {
		err := c.Do(ctx, "SHOW", id).Err()
		switch {
		case err == nil:
			readable++
		case strings.HasPrefix(err.Error(), "IOERR the index is corrupt") && strings.Contains(err.Error(), ".sst"):
			corrupt++
		default:
			t.Fatalf("SHOW %s: %v, want the job or -IOERR the index is corrupt", id, err)
		}
	}
	t.Logf("SHOW: %d jobs unreadable, %d readable", corrupt, readable)
	if corrupt == 0 || readable == 0 {
		t.Fatalf("%d corrupt and %d readable jobs: the test corrupted the wrong place", corrupt, readable)
	}
	if err := c.Do(ctx, "ADDJOB", "q", "new", 0).Err(); err == nil || !strings.HasPrefix(err.Error(), "IOERR ") {
		t.Fatalf("ADDJOB on a corrupt index: %v, want -IOERR", err)
	}
	if got := doStr(t, other, "PING"); got != "PONG" {
		t.Fatalf("PING from another client: %q", got)
	}
	out := s.logs[len(s.logs)-1]
	waitUntil(t, 10*time.Second, "the log to say what to do", func() bool {
		return strings.Contains(out.String(), "restart with --rebuild-index")
	})
	if n := strings.Count(out.String(), "restart with --rebuild-index"); n != 1 {
		t.Errorf("the advice is logged %d times, want once", n)
	}
	if strings.Contains(out.String(), "reopening the store") {
		t.Errorf("the node reopened a store whose index is corrupt")
	}
	p := s.proc
	s.proc = nil // stopped here: a failed store's close may exit with 1
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
