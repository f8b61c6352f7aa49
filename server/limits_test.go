package server

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func TestMaxClients(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{MaxClients: 2})
	s.SetBroker(newBroker(t))
	c1, c2 := dialResp(t, addr), dialResp(t, addr)
	for _, c := range []*respConn{c1, c2} {
		if got := c.do("PING"); got != "+PONG" {
			t.Fatalf("PING = %q", got)
		}
	}
	c3 := dialResp(t, addr)
	if got := c3.do("PING"); got != "-"+errMaxClients {
		t.Fatalf("third client: %q, want -%s", got, errMaxClients)
	}
	if !c3.closedByServer() {
		t.Error("refused connection not closed")
	}
	c1.c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for s.connectedClients() != 1 {
		if time.Now().After(deadline) {
			t.Fatal("closed client still counted")
		}
		time.Sleep(time.Millisecond)
	}
	if got := dialResp(t, addr).do("PING"); got != "+PONG" {
		t.Errorf("client after one left: %q", got)
	}
}

// Oversized ADDJOBs are refused wherever they fall in a pipeline, and every
// reply keeps its place.
func TestMaxJobSize(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{MaxJobSize: 10})
	s.SetBroker(newBroker(t))
	big, exact := strings.Repeat("x", 11), strings.Repeat("y", 10)
	tooLarge := "-" + fmt.Sprintf(errJobTooLarge, 10)
	got := roundTrip(t, addr, "ADDJOB q "+big+" 0\r\nADDJOB q a 0\r\nADDJOB q "+exact+" 0\r\nADDJOB q "+big+" 0\r\n"+
		"ADDJOB q b 0\r\nADDJOB q "+big+" 0 TTL 0\r\nADDJOB q c 0 TTL 0\r\nQLEN q\r\nADDJOB q "+big+" 0\r\nQLEN q\r\n", 10)
	for i, want := range []string{tooLarge, "+D-", "+D-", tooLarge, "+D-", tooLarge,
		"-ERR TTL must be greater than zero", ":3", tooLarge, ":3"} {
		if !strings.HasPrefix(got[i], want) {
			t.Errorf("reply %d = %q, want %q… (all: %q)", i, got[i], want, got)
		}
	}
	c := dialResp(t, addr)
	if got := c.do("QPEEK q 10"); !strings.Contains(got, " $a]") || !strings.Contains(got, " $"+exact+"]") || strings.Contains(got, big) {
		t.Errorf("QPEEK = %q", got)
	}
	// As a RESP multibulk too, in a batch longer than one pipeline read.
	var raw strings.Builder
	for i := range 50 {
		body := "ok"
		if i%7 == 3 {
			body = big
		}
		fmt.Fprintf(&raw, "*4\r\n$6\r\nADDJOB\r\n$2\r\nq2\r\n$%d\r\n%s\r\n$1\r\n0\r\n", len(body), body)
	}
	c.send(raw.String())
	for i := range 50 {
		got := c.read()
		if want := "+D-"; i%7 == 3 {
			if got != tooLarge {
				t.Errorf("job %d: %q, want %q", i, got, tooLarge)
			}
		} else if !strings.HasPrefix(got, want) {
			t.Errorf("job %d: %q, want an id", i, got)
		}
	}
	if got := c.do("QLEN q2"); got != ":43" {
		t.Errorf("QLEN q2 = %q, want :43", got)
	}
}

func TestClientCommands(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	a, b := dialResp(t, addr), dialResp(t, addr)
	for _, tc := range []struct{ cmd, want string }{
		{"CLIENT GETNAME", "$-1"},
		{"CLIENT SETNAME worker-1", "+OK"},
		{"CLIENT GETNAME", "$worker-1"},
		{"CLIENT SETNAME", "-ERR wrong number of arguments for 'client|setname' command"},
		{"CLIENT SETINFO LIB-NAME go-redis", "-ERR unknown CLIENT subcommand 'SETINFO'"},
		{"CLIENT KILL 1.2.3.4:5", "-" + errNoSuchClient},
		{"CLIENT KILL ID 99999", ":0"},
		{"CLIENT KILL ID x", "-ERR client-id should be greater than 0"},
		{"CLIENT KILL BOGUS 1", "-" + errSyntax},
	} {
		if got := a.do(tc.cmd); got != tc.want {
			t.Errorf("%s = %q, want %q", tc.cmd, got, tc.want)
		}
	}
	a.send("*3\r\n$6\r\nCLIENT\r\n$7\r\nSETNAME\r\n$5\r\na b c\r\n")
	if got := a.read(); got != "-"+errClientName {
		t.Errorf("SETNAME with spaces = %q", got)
	}
	bID := b.do("CLIENT ID")
	if got := b.do("PING"); got != "+PONG" {
		t.Fatal(got)
	}
	list := a.do("CLIENT LIST")
	lines := strings.Split(strings.TrimSuffix(strings.TrimPrefix(list, "$"), "\n"), "\n")
	if len(lines) != 2 {
		t.Fatalf("CLIENT LIST = %q, want 2 lines", list)
	}
	aAddr, bAddr := a.c.LocalAddr().String(), b.c.LocalAddr().String()
	wantA := "addr=" + aAddr + " name=worker-1 age="
	if !strings.HasPrefix(lines[0], "id=") || !strings.Contains(lines[0], wantA) || !strings.HasSuffix(lines[0], " cmd=client") {
		t.Errorf("CLIENT LIST line 1 = %q, want %q… cmd=client", lines[0], wantA)
	}
	wantB := fmt.Sprintf("id=%s addr=%s name= age=", strings.TrimPrefix(bID, ":"), bAddr)
	if !strings.HasPrefix(lines[1], wantB) || !strings.HasSuffix(lines[1], " cmd=ping") || !strings.Contains(lines[1], " idle=") {
		t.Errorf("CLIENT LIST line 2 = %q, want %q… cmd=ping", lines[1], wantB)
	}
	// KILL by address closes the other connection.
	if got := a.do("CLIENT KILL " + bAddr); got != "+OK" {
		t.Fatalf("CLIENT KILL addr = %q", got)
	}
	if !b.closedByServer() {
		t.Error("killed client still connected")
	}
	// KILL ID: the caller is spared unless SKIPME no.
	c := dialResp(t, addr)
	cID := strings.TrimPrefix(c.do("CLIENT ID"), ":")
	aID := strings.TrimPrefix(a.do("CLIENT ID"), ":")
	if got := a.do("CLIENT KILL ID " + cID); got != ":1" {
		t.Fatalf("CLIENT KILL ID = %q", got)
	}
	if !c.closedByServer() {
		t.Error("client killed by id still connected")
	}
	if got := a.do("CLIENT KILL ID " + aID); got != ":0" {
		t.Errorf("CLIENT KILL ID self = %q, want :0 (SKIPME yes)", got)
	}
	a.send("CLIENT KILL ID " + aID + " SKIPME no\r\nPING\r\n")
	if got := a.read(); got != ":1" {
		t.Errorf("CLIENT KILL ID self SKIPME no = %q", got)
	}
	if !a.closedByServer() {
		t.Error("self-killed client still connected, or PING ran after the kill")
	}
}

// A client blocked in GETJOB that is killed is not served a job later.
func TestClientKillBlocked(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	blocked := dialResp(t, addr)
	blocked.send("GETJOB FROM kq\r\n")
	deadline := time.Now().Add(10 * time.Second)
	for b.Stats().BlockedClients != 1 {
		if time.Now().After(deadline) {
			t.Fatal("client never blocked")
		}
		time.Sleep(time.Millisecond)
	}
	killer := dialResp(t, addr)
	if got := killer.do("CLIENT KILL " + blocked.c.LocalAddr().String()); got != "+OK" {
		t.Fatalf("kill = %q", got)
	}
	for b.Stats().BlockedClients != 0 {
		if time.Now().After(deadline) {
			t.Fatal("killed client still blocked")
		}
		time.Sleep(time.Millisecond)
	}
	if got := killer.do("ADDJOB kq x 0"); !strings.HasPrefix(got, "+D-") {
		t.Fatal(got)
	}
	if got := killer.do("QLEN kq"); got != ":1" {
		t.Errorf("QLEN = %q: the job went to a killed client", got)
	}
}

func TestDebugSleepStallsOnlyThatConnection(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	slow, fast := dialResp(t, addr), dialResp(t, addr)
	start := time.Now()
	slow.send("DEBUG SLEEP 0.5\r\nPING\r\n")
	if got := fast.do("PING"); got != "+PONG" {
		t.Fatal(got)
	}
	fastDone := time.Since(start)
	if got := slow.read(); got != "+OK" {
		t.Fatalf("DEBUG SLEEP = %q", got)
	}
	slept := time.Since(start)
	if got := slow.read(); got != "+PONG" {
		t.Fatal(got)
	}
	if slept < 500*time.Millisecond || fastDone >= slept {
		t.Errorf("slept %v, other client answered after %v", slept, fastDone)
	}
	for _, cmd := range []string{"DEBUG SLEEP", "DEBUG SLEEP x", "DEBUG SLEEP -1", "DEBUG SLEEP nan", "DEBUG SLEEP NaN", "DEBUG SLEEP inf"} {
		if got := fast.do(cmd); !strings.HasPrefix(got, "-ERR ") {
			t.Errorf("%s = %q, want an error", cmd, got)
		}
	}
}

func TestShutdown(t *testing.T) {
	var called atomic.Int32
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{OnShutdown: func() { called.Add(1) }})
	s.SetBroker(newBroker(t))
	c := dialResp(t, addr)
	c.send("SHUTDOWN NOSAVE\r\nPING\r\n")
	if !c.closedByServer() {
		t.Error("SHUTDOWN replied or left the connection open")
	}
	eventually(t, "OnShutdown to be called", func() bool { return called.Load() == 1 })
	if got := dialResp(t, addr).do("SHUTDOWN BOGUS"); got != "-"+errSyntax {
		t.Errorf("SHUTDOWN BOGUS = %q", got)
	}
}

// Without OnShutdown, SHUTDOWN closes the server: Serve returns.
func TestShutdownClosesServer(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	c := dialResp(t, addr)
	c.send("SHUTDOWN\r\n")
	if !c.closedByServer() {
		t.Error("connection not closed")
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		closing := s.closing
		s.mu.Unlock()
		if closing {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("server not closed by SHUTDOWN")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCommandTable(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	c := dialResp(t, addr)
	if got := c.do("COMMAND COUNT"); got != fmt.Sprintf(":%d", len(commands)) {
		t.Errorf("COMMAND COUNT = %q, want %d", got, len(commands))
	}
	all := c.do("COMMAND")
	for _, want := range []string{"*[$addjob :-4 *[+write +denyoom +fast] :0 :0 :0]", "*[$qlen :2 *[+readonly +fast] :0 :0 :0]",
		"*[$auth :-2 *[", "*[$shutdown :-1 *[+admin"} {
		if !strings.Contains(all, want) {
			t.Errorf("COMMAND lacks %q: %.300q…", want, all)
		}
	}
	if n := strings.Count(all, "*[$"); n != len(commands) {
		t.Errorf("COMMAND has %d entries, want %d", n, len(commands))
	}
	if got := c.do("COMMAND DOCS"); got != "*[]" {
		t.Errorf("COMMAND DOCS = %q", got)
	}
	if got := c.do("COMMAND INFO getjob nosuch"); got != "*[*[$getjob :-3 *[+write +fast] :0 :0 :0] $-1]" {
		t.Errorf("COMMAND INFO = %q", got)
	}
	if got := c.do("COMMAND BOGUS"); !strings.HasPrefix(got, "-ERR unknown COMMAND subcommand") {
		t.Errorf("COMMAND BOGUS = %q", got)
	}
}

// TestSlowConsumerBlocksOnlyItself: a client pipelines GETJOBs for 12 MB of
// bodies and does not read. Its replies are written out as they pass the
// output limit (handle), so its goroutine waits on its socket instead of
// buffering them all; other clients are served meanwhile, and when it
// reads, every reply is there, complete and in order.
func TestSlowConsumerBlocksOnlyItself(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	other := dialResp(t, addr)
	body := strings.Repeat("b", 60_000)
	const n = 200
	for i := range n {
		if got := other.doArgs("ADDJOB", "slow", fmt.Sprintf("%03d", i)+body, "0"); !strings.HasPrefix(got, "+D-") {
			t.Fatal(got)
		}
	}
	slow := dialResp(t, addr)
	var pipeline strings.Builder
	for range n {
		pipeline.WriteString("GETJOB NOHANG COUNT 1 FROM slow\r\n")
	}
	slow.send(pipeline.String())
	// The slow client has not read a byte; once its GETJOBs have begun,
	// the server still serves others (a stuck write would hold nothing
	// they need).
	eventually(t, "the slow client's GETJOBs to begin", func() bool { return other.do("QLEN slow") != ":200" })
	if got := other.do("PING"); got != "+PONG" {
		t.Fatalf("PING beside a slow consumer: %q", got)
	}
	for i := range n {
		got := slow.read()
		if want := fmt.Sprintf("%03d", i); !strings.Contains(got, want+body) {
			t.Fatalf("reply %d: %.80q, want body %s…", i, got, want)
		}
	}
	if got := other.do("QLEN slow"); got != ":0" {
		t.Fatalf("QLEN after the slow consumer read everything: %q", got)
	}
}
