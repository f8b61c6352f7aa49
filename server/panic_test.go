package server

import (
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// registerForTest adds commands to the table for one test. Server tests do
// not run in parallel, so the table is not read while it changes.
func registerForTest(t *testing.T, cmds ...*command) {
	register(cmds...)
	t.Cleanup(func() {
		for _, c := range cmds {
			delete(commands, c.name)
		}
	})
}

// TestHandlerPanicRepliesInternalError: a handler that panics (a bug) is
// answered -ERR internal error with its stack in the log, and the
// connection, the other clients and the server carry on. A handler that
// panics after writing part of its reply gets its connection closed, as
// the rest of the stream could not be trusted, and nothing else is
// disturbed.
func TestHandlerPanicRepliesInternalError(t *testing.T) {
	registerForTest(t,
		&command{name: "testpanic", arity: 1, whileLoading: true, run: func(*Server, *call) {
			panic("testpanic: a bug")
		}},
		&command{name: "testpanichalf", arity: 1, whileLoading: true, run: func(_ *Server, c *call) {
			c.conn.WriteArray(2)
			c.conn.WriteBulkString("first")
			panic("testpanichalf: a bug mid-reply")
		}},
	)
	var logs lockedBuffer
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	s.SetBroker(newBroker(t))
	rc := dialResp(t, addr)
	other := dialResp(t, addr)
	if got := rc.do("TESTPANIC"); got != "-ERR internal error" {
		t.Fatalf("TESTPANIC: %q, want -ERR internal error", got)
	}
	// The same connection goes on, in step, pipelined commands too.
	rc.send("PING\r\nTESTPANIC\r\nQLEN q\r\n")
	for _, want := range []string{"+PONG", "-ERR internal error", ":0"} {
		if got := rc.read(); got != want {
			t.Fatalf("pipeline after a panic: %q, want %q", got, want)
		}
	}
	if !strings.Contains(logs.String(), "testpanic: a bug") || !strings.Contains(logs.String(), "panic_test.go") {
		t.Fatalf("the log lacks the panic and its stack:\n%s", logs.String())
	}
	// Half a reply is out: the connection is closed, nobody else notices.
	half := dialResp(t, addr)
	half.send("TESTPANICHALF\r\n")
	half.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if rest, err := io.ReadAll(half.r); err != nil || strings.Contains(string(rest), "internal error") {
		t.Fatalf("the connection that got half a reply: read %q, %v; want it closed (EOF)", rest, err)
	}
	for _, c := range []*respConn{rc, other} {
		if got := c.do("PING"); got != "+PONG" {
			t.Fatalf("PING after the panics: %q", got)
		}
	}
}

// TestSetBrokerDrainWaitsForCommands: the drain SetBroker returns waits for
// the commands that got the old broker — here a GETJOB blocked on it, which
// only the broker's Close ends — and new commands get -LOADING meanwhile.
func TestSetBrokerDrainWaitsForCommands(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	blocked := dialResp(t, addr)
	blocked.send("GETJOB FROM q\r\n")
	eventually(t, "the GETJOB to block", func() bool { return b.Stats().BlockedClients == 1 })
	drain := s.SetBroker(nil)
	if got := dialResp(t, addr).do("QLEN q"); !strings.HasPrefix(got, "-LOADING") {
		t.Fatalf("QLEN after SetBroker(nil): %q, want -LOADING", got)
	}
	drained := make(chan struct{})
	go func() { drain(); close(drained) }()
	select {
	case <-drained:
		t.Fatal("drain returned while a GETJOB still ran on the old broker")
	case <-time.After(50 * time.Millisecond):
	}
	b.Close()
	select {
	case <-drained:
	case <-time.After(10 * time.Second):
		t.Fatal("drain did not return after the GETJOB ended")
	}
	if got := blocked.read(); !strings.HasPrefix(got, "-LOADING") {
		t.Fatalf("the blocked GETJOB got %q, want -LOADING", got)
	}
	s.SetBroker(newBroker(t))
	if got := blocked.do("QLEN q"); got != ":0" {
		t.Fatalf("QLEN on the new broker: %q", got)
	}
}
