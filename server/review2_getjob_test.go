package server

import (
	"bufio"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

// gatedListener: the writes of the first connection it accepts wait for
// open (a client that reads nothing for now); entered is closed at its
// first write.
type gatedListener struct {
	net.Listener
	once          sync.Once
	n             int
	open, entered chan struct{}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.n++
	if l.n != 1 {
		return c, nil
	}
	return &gatedConn{TCPConn: c.(*net.TCPConn), l: l}, nil
}

type gatedConn struct {
	*net.TCPConn
	l *gatedListener
}

func (c *gatedConn) Write(p []byte) (int, error) {
	c.l.once.Do(func() { close(c.l.entered) })
	<-c.l.open
	return c.TCPConn.Write(p)
}

// TestGetJobStuckFlushingTakesNoJob: a GETJOB about to block whose
// earlier replies cannot be written yet (its client reads nothing) is not
// a waiter while it writes them: a job added meanwhile goes to a consumer
// that is blocked and reading. Before, the waiter was registered first
// and the flush made after: the stuck connection took the job, and the
// reading consumer waited out its timeout (the job came back only at its
// RETRY).
func TestGetJobStuckFlushingTakesNoJob(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &gatedListener{Listener: inner, open: make(chan struct{}), entered: make(chan struct{})}
	s := New(Options{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	var openOnce sync.Once
	release := func() { openOnce.Do(func() { close(ln.open) }) }
	t.Cleanup(func() {
		release()
		s.Close()
		<-done
	})
	b := newBroker(t)
	s.SetBroker(b)
	addr := inner.Addr().String()

	stuck, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer stuck.Close()
	if _, err := stuck.Write([]byte("PING\r\nGETJOB TIMEOUT 10000 FROM q\r\n")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ln.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the stuck connection never wrote")
	}

	reader, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer reader.Close()
	reader.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := reader.Write([]byte("GETJOB TIMEOUT 3000 FROM q\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().BlockedClients < 1 || time.Since(deadline.Add(-10*time.Second)) < 100*time.Millisecond {
		if time.Now().After(deadline) {
			t.Fatal("the reading consumer never blocked")
		}
		time.Sleep(time.Millisecond)
	}
	roundTrip(t, addr, "ADDJOB q body 0\r\n", 1)
	line, err := bufio.NewReader(reader).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "*1") {
		t.Fatalf("the blocked, reading consumer got %q, %v; want the job", line, err)
	}
}
