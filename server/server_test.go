package server

import (
	"bufio"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// startServer runs a Server on 127.0.0.1:0; the broker is set by the caller
// (nil: still loading).
func startServer(t *testing.T) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

func newBroker(t *testing.T) *queue.Broker {
	t.Helper()
	return newBrokerOn(t, vfs.NewMem())
}

// newBrokerOn runs a broker over a store on fs; both close at cleanup (after
// anything registered later, such as a server over them).
func newBrokerOn(tb testing.TB, fs vfs.FS) *queue.Broker {
	tb.Helper()
	opts := storage.TestingOptions()
	opts.FS = fs
	return runBroker(tb, "data", opts)
}

// runBroker runs a broker over a store opened on dir with opts; both close
// at cleanup (after anything registered later, such as a server over them).
func runBroker(tb testing.TB, dir string, opts storage.Options) *queue.Broker {
	tb.Helper()
	st, err := storage.Open(dir, opts)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := queue.New(queue.Options{Store: st})
	if err != nil {
		st.Close()
		tb.Fatal(err)
	}
	go b.Run()
	tb.Cleanup(func() { b.Close(); st.Close() })
	return b
}

// roundTrip writes raw RESP (or inline commands) in one write and reads n
// replies' first lines.
func roundTrip(t *testing.T, addr, raw string, n int) []string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	var out []string
	for len(out) < n {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("after %q: %v", out, err)
		}
		out = append(out, strings.TrimRight(line, "\r\n"))
	}
	return out
}

func TestLoadingUntilBrokerIsSet(t *testing.T) {
	s, addr := startServer(t)
	got := roundTrip(t, addr, "PING\r\nQLEN q\r\nINFO persistence\r\n", 3)
	if got[0] != "+PONG" || !strings.HasPrefix(got[1], "-LOADING ") || !strings.HasPrefix(got[2], "$") {
		t.Fatalf("while loading: %q", got)
	}
	s.SetBroker(newBroker(t))
	if got := roundTrip(t, addr, "QLEN q\r\n", 1); got[0] != ":0" {
		t.Fatalf("after loading: %q", got)
	}
}

// With LoadingWait, a command that arrives while the store recovers waits
// for it and gets its real answer (Disque serves nothing before its AOF is
// loaded; its test suite sends SHOW right after PING answered); PING waits
// too, so its PONG means ready. One that waits longer than LoadingWait gets
// -LOADING, and PING then PONG.
func TestLoadingWaitAnswersOnceTheBrokerIsSet(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{LoadingWait: time.Minute})
	var readers []*bufio.Reader
	for _, cmd := range []string{"PING\r\n", "QLEN q\r\n"} {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(cmd)); err != nil {
			t.Fatal(err)
		}
		// No reply within a moment: it waits for the broker.
		c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
		r := bufio.NewReader(c)
		if line, err := r.ReadString('\n'); err == nil {
			t.Fatalf("%q while loading answered %q at once; want it to wait for the broker", cmd, line)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		readers = append(readers, r)
	}
	s.SetBroker(newBroker(t))
	for i, want := range []string{"+PONG\r\n", ":0\r\n"} {
		if line, err := readers[i].ReadString('\n'); err != nil || line != want {
			t.Fatalf("command %d sent while loading: %q, %v; want %q once the broker is set", i, line, err, want)
		}
	}

	// A wait that runs out: -LOADING, and PONG for PING.
	_, addr2 := startServerOpts(t, "127.0.0.1:0", Options{LoadingWait: 50 * time.Millisecond})
	if got := roundTrip(t, addr2, "QLEN q\r\n", 1); !strings.HasPrefix(got[0], "-LOADING ") {
		t.Fatalf("QLEN while loading with a 50 ms wait: %q, want -LOADING", got)
	}
	if got := roundTrip(t, addr2, "PING\r\n", 1); got[0] != "+PONG" {
		t.Fatalf("PING while loading with a 50 ms wait: %q, want +PONG", got)
	}
}

// A pipeline of ADDJOBs shares one commit; bad ones among them still get
// their own error, in order.
func TestPipelinedAddJobsReplyInOrder(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	got := roundTrip(t, addr,
		"ADDJOB q a 0\r\nADDJOB q b 0 TTL 0\r\naddjob q c 0 BOGUS 1\r\nADDJOB q d 0\r\nQLEN q\r\nADDJOB q e 0 DELAY 5 TTL 5\r\n", 6)
	if !strings.HasPrefix(got[0], "+D-") || !strings.HasPrefix(got[3], "+D-") {
		t.Fatalf("ids: %q", got)
	}
	if got[1] != "-ERR TTL must be greater than zero" || got[2] != "-ERR syntax error" || got[4] != ":2" ||
		got[5] != "-"+errDelayTTL {
		t.Fatalf("replies: %q", got)
	}
}

func TestCloseWakesBlockedClientsAndLeaksNothing(t *testing.T) {
	b := newBroker(t)
	before := runtime.NumGoroutine() // the store's and the broker's are counted
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{})
	s.SetBroker(b)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GETJOB FROM nothing\r\n")); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().BlockedClients != 1 {
		if time.Now().After(deadline) {
			t.Fatal("client never blocked")
		}
		time.Sleep(time.Millisecond)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if b.Stats().BlockedClients != 0 {
		t.Fatal("blocked client still registered after Close")
	}
	c.Close()
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<16)
			t.Fatalf("goroutines leaked: %d before, %d after\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(time.Millisecond)
	}
}

func TestLookup(t *testing.T) {
	for _, name := range []string{"addjob", "ADDJOB", "AddJob", "getJOB"} {
		if cmd := lookup([]byte(name)); cmd == nil || cmd.name != strings.ToLower(name) {
			t.Errorf("lookup(%q) = %v", name, cmd)
		}
	}
	for _, name := range []string{"", "addjobs", "add", strings.Repeat("x", 100), "ADDJOB\x00"} {
		if cmd := lookup([]byte(name)); cmd != nil {
			t.Errorf("lookup(%q) = %s, want nil", name, cmd.name)
		}
	}
	// Every command goes through lookup: it must not allocate.
	arg := []byte("ADDJOB")
	if n := testing.AllocsPerRun(100, func() { lookup(arg) }); n != 0 {
		t.Errorf("lookup allocates %v times", n)
	}
}

// eventually polls cond until it holds, failing the test after 10 s: for
// effects the server applies just after the reply or the close a client
// sees (a hook called, a connection unregistered).
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond) // poll interval
	}
}

// TestCloseWaitsForTheCommandsRunning: Close returns only once every
// command being executed has finished.
func TestCloseWaitsForTheCommandsRunning(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{}) // its cleanup checks Serve's error
	s.SetBroker(newBroker(t))
	dialResp(t, addr).send("DEBUG SLEEP 0.3\r\n")
	running := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.running
	}
	eventually(t, "DEBUG SLEEP to run", func() bool { return running() == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := running(); n != 0 {
		t.Fatalf("Close returned with %d commands running", n)
	}
}
