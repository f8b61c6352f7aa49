package server

import (
	"bufio"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// writeCountingListener counts the writes the server makes on the
// connections it accepts. Its connections keep the TCP socket's
// SyscallConn (embedded), so watchPeer watches them as it does real ones.
type writeCountingListener struct {
	net.Listener
	writes atomic.Int64
}

func (l *writeCountingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &writeCountingConn{TCPConn: c.(*net.TCPConn), writes: &l.writes}, nil
}

type writeCountingConn struct {
	*net.TCPConn
	writes *atomic.Int64
}

func (c *writeCountingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.TCPConn.Write(p)
}

func startCountingServer(t *testing.T) (*Server, string, *writeCountingListener) {
	t.Helper()
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &writeCountingListener{Listener: inner}
	s := New(Options{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, inner.Addr().String(), ln
}

// TestBlockingGetJobServedAtOnceWritesOnce: a blocking GETJOB that finds a
// job queued is answered in the pipeline's one write, like any command:
// the flush of earlier replies (and the hang-up watcher) are for a GETJOB
// that does block. It wrote twice before (the ADDJOB's reply flushed on
// its own ahead of the GETJOB).
func TestBlockingGetJobServedAtOnceWritesOnce(t *testing.T) {
	s, addr, ln := startCountingServer(t)
	s.SetBroker(newBroker(t))
	got := roundTrip(t, addr, "ADDJOB q body 0\r\nGETJOB FROM q\r\n", 5)
	if !strings.HasPrefix(got[0], "+D-") || got[1] != "*1" || got[2] != "*3" {
		t.Fatalf("replies: %q", got)
	}
	if n := ln.writes.Load(); n != 1 {
		t.Fatalf("%d writes for one pipeline's replies, want 1", n)
	}
}

// TestBlockedGetJobFlushesEarlierRepliesAndWatchesHangUp: a GETJOB that
// blocks first sends the replies of the commands pipelined before it, and
// a client that hangs up while blocked is not served: the job added later
// stays queued.
func TestBlockedGetJobFlushesEarlierRepliesAndWatchesHangUp(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("PING\r\nGETJOB FROM q\r\n")); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "+PONG\r\n" {
		t.Fatalf("before the GETJOB blocks, read %q, %v; want +PONG", line, err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().BlockedClients != 1 {
		if time.Now().After(deadline) {
			t.Fatal("client never blocked")
		}
		time.Sleep(time.Millisecond)
	}
	c.Close()
	for b.Stats().BlockedClients != 0 {
		if time.Now().After(deadline) {
			t.Fatal("a client that hung up is still blocked")
		}
		time.Sleep(time.Millisecond)
	}
	if got := roundTrip(t, addr, "ADDJOB q body 0\r\nQLEN q\r\n", 2); got[1] != ":1" {
		t.Fatalf("after the blocked client hung up: %q, want the job still queued", got)
	}
}
