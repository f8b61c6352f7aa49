package main

import (
	"context"
	"log/slog"
	"os"
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
