package queue

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/leakcheck"
)

// returnsWithin fails t if fn has not returned within d: a hang shows as a
// failure naming what hung rather than as the test binary's timeout.
func returnsWithin(t *testing.T, d time.Duration, what string, fn func()) {
	t.Helper()
	done := make(chan struct{})
	go func() { defer close(done); fn() }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s did not return within %v", what, d)
	}
}

// TestCloseWithoutRun: a broker whose Run never started (the daemon closes
// it when opening the rest of the node fails) closes at once, and a Run
// after Close returns at once.
func TestCloseWithoutRun(t *testing.T) {
	leakcheck.Check(t)
	f := newFixture(t, 4)
	returnsWithin(t, 10*time.Second, "Close of a broker never Run", f.b.Close)
	returnsWithin(t, 10*time.Second, "Run after Close", f.b.Run)
}

// TestCloseStopsRunAndWakesWaiters: Close waits for a running Run, wakes a
// blocked GETJOB with ErrClosed, and leaves no goroutine behind.
func TestCloseStopsRunAndWakesWaiters(t *testing.T) {
	leakcheck.Check(t)
	f := newFixture(t, 4)
	ran := make(chan struct{})
	go func() { defer close(ran); f.b.Run() }()
	errc := make(chan error, 1)
	go func() {
		_, err := f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"q"}, Count: 1})
		errc <- err
	}()
	waitFor(t, "the GETJOB never blocked", func() bool { return f.b.Stats().BlockedClients == 1 })
	// The first Run must own the loop before the second is called: else the
	// second becomes the loop and never returns (seen on a loaded machine).
	waitFor(t, "the first Run never started", func() bool {
		f.b.mu.Lock()
		defer f.b.mu.Unlock()
		return f.b.running
	})
	// A second Run must not take Run's place (nor close done twice).
	returnsWithin(t, 10*time.Second, "a second Run", f.b.Run)
	returnsWithin(t, 10*time.Second, "Close", f.b.Close)
	<-ran
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("blocked GETJOB after Close: %v, want ErrClosed", err)
	}
}
