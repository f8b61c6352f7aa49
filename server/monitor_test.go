package server

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"
)

// monitorLine matches a MONITOR line as readResp returns it, capturing the
// client's address and the quoted arguments.
var monitorLine = regexp.MustCompile(`^\+(\d{10,})\.(\d{6}) \[0 ([^\]]+)\] (.*)$`)

// readMonitorLine reads one line from a monitor and returns the address and
// arguments part.
func readMonitorLine(t *testing.T, mon *respConn) (addr, args string) {
	t.Helper()
	line := mon.read()
	m := monitorLine.FindStringSubmatch(line)
	if m == nil {
		t.Fatalf("not a MONITOR line: %q", line)
	}
	return m[3], m[4]
}

// doArgs sends one command as a RESP array (arguments may hold any byte)
// and reads its reply.
func (rc *respConn) doArgs(args ...string) string {
	rc.t.Helper()
	raw := make([][]byte, len(args))
	for i, a := range args {
		raw[i] = []byte(a)
	}
	rc.send(string(encodeRESP(raw)))
	return rc.read()
}

func TestMonitor(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{RequirePass: "s3cret"})
	s.SetBroker(newBroker(t))

	mon := dialResp(t, addr)
	if got := mon.do("MONITOR"); got != "-"+errNoAuth {
		t.Fatalf("MONITOR before AUTH: %q", got)
	}
	// A pipeline: the reply before MONITOR comes first, then +OK.
	mon.send("AUTH s3cret\r\nMONITOR\r\n")
	if got, ok := mon.read(), mon.read(); got != "+OK" || ok != "+OK" {
		t.Fatalf("AUTH, MONITOR: %q, %q", got, ok)
	}

	c := dialResp(t, addr)
	body := "a\"b\\c\n\r\t\a\b\x00\x7f\xffé ~"
	steps := []struct {
		args  []string
		reply string // prefix
		line  string // "" if the monitor must not see it
	}{
		{[]string{"AUTH", "s3cret"}, "+OK", `"AUTH" "(redacted)"`},
		{[]string{"ADDJOB", "q", body, "0"}, "+D-", `"ADDJOB" "q" "a\"b\\c\n\r\t\a\b\x00\x7f\xff\xc3\xa9 ~" "0"`},
		{[]string{"getjob", "NOHANG", "FROM", "q"}, "*[", `"getjob" "NOHANG" "FROM" "q"`},
		{[]string{"AUTH", "default", "wrong"}, "-ERR invalid password", `"AUTH" "(redacted)" "(redacted)"`},
		{[]string{"AUTH", "s3cret"}, "+OK", `"AUTH" "(redacted)"`},
		{[]string{"HELLO", "3", "AUTH", "default", "s3cret", "SETNAME", "x"}, "-ERR", `"HELLO" "3" "AUTH" "(redacted)" "(redacted)" "SETNAME" "x"`},
		// Admin commands are not shown (their arguments may be secrets),
		// nor commands refused before they run.
		{[]string{"CONFIG", "GET", "requirepass"}, "*", ""},
		{[]string{"CLIENT", "SETNAME", "worker"}, "+OK", ""},
		{[]string{"NOSUCH", "x"}, "-ERR unknown command", ""},
		{[]string{"QLEN"}, "-ERR wrong number", ""},
		{[]string{"QLEN", "q"}, ":0", `"QLEN" "q"`},
	}
	var want []string
	for _, st := range steps {
		if got := c.doArgs(st.args...); !strings.HasPrefix(got, st.reply) {
			t.Fatalf("%q: %q, want %q…", st.args, got, st.reply)
		}
		if st.line != "" {
			want = append(want, st.line)
		}
	}
	// Pipelined ADDJOBs share a commit, but each has its line, in order.
	c.send("ADDJOB q one 0\r\nADDJOB q two 0 TTL 60\r\nPING\r\n")
	for range 3 {
		c.read()
	}
	want = append(want, `"ADDJOB" "q" "one" "0"`, `"ADDJOB" "q" "two" "0" "TTL" "60"`, `"PING"`)

	for i, w := range want {
		from, got := readMonitorLine(t, mon)
		if from != c.c.LocalAddr().String() {
			t.Errorf("line %d from %q, want %q", i, from, c.c.LocalAddr())
		}
		if got != w {
			t.Errorf("line %d = %s\nwant     %s", i, got, w)
		}
	}

	// A monitor takes nothing but QUIT; the others' lines keep coming.
	if got := mon.do("QLEN q"); got != "-"+errMonitorMode {
		t.Errorf("QLEN from a monitor: %q", got)
	}
	c.doArgs("PING")
	if _, got := readMonitorLine(t, mon); got != `"PING"` {
		t.Errorf("after the monitor's QLEN: %s", got)
	}
	if got := mon.do("QUIT"); got != "+OK" {
		t.Errorf("QUIT: %q", got)
	}
	if !mon.closedByServer() {
		t.Error("monitor still connected after QUIT")
	}
	if s.monitors.Load() != nil {
		t.Error("monitor still registered after QUIT")
	}
}

func TestAppendMonitorLine(t *testing.T) {
	at := time.Unix(1700000000, 123456789)
	got := string(appendMonitorLine(nil, at, "127.0.0.1:54321", [][]byte{[]byte("ADDJOB"), []byte("q"), []byte("body"), []byte("0")}))
	if want := "+1700000000.123456 [0 127.0.0.1:54321] \"ADDJOB\" \"q\" \"body\" \"0\"\r\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	got = string(appendMonitorLine(nil, time.Unix(5, 7000), "[::1]:1", [][]byte{[]byte("auth"), []byte("pw")}))
	if want := "+5.000007 [0 [::1]:1] \"auth\" \"(redacted)\"\r\n"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// A monitor that never reads must not slow the others down: once its
// unsent output passes the limit it is disconnected, with a log line.
func TestMonitorThatDoesNotReadIsDropped(t *testing.T) {
	var logs lockedBuffer
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{
		MonitorBufferLimit: 256 << 10,
		Logger:             slog.New(slog.NewTextHandler(&logs, nil)),
	})
	s.SetBroker(newBroker(t))

	mon := dialResp(t, addr)
	if tcp, ok := mon.c.(*net.TCPConn); ok {
		_ = tcp.SetReadBuffer(4 << 10) // less for the kernel to absorb
	}
	if got := mon.do("MONITOR"); got != "+OK" {
		t.Fatalf("MONITOR: %q", got)
	}
	// From here on the monitor reads nothing. Each ADDJOB's line is about
	// 4×8 KiB (every body byte escaped as \x00): the kernel's socket
	// buffers fill, then the monitor's own.
	c := dialResp(t, addr)
	cmd := string(encodeRESP([][]byte{[]byte("ADDJOB"), []byte("q"), make([]byte, 8<<10), []byte("0"), []byte("TTL"), []byte("600")}))
	batch := strings.Repeat(cmd, 16)
	deadline := time.Now().Add(30 * time.Second)
	for s.monitors.Load() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the monitor was never dropped")
		}
		c.send(batch)
		for range 16 {
			if got := c.read(); !strings.HasPrefix(got, "+D-") { // read's own deadline: 10s
				t.Fatalf("ADDJOB: %q", got)
			}
		}
	}
	if !strings.Contains(logs.String(), "monitor client dropped") {
		t.Errorf("no log line for the dropped monitor: %q", logs.String())
	}
	// Its connection is closed: reading what was sent ends in EOF (or a
	// reset), not a timeout.
	mon.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := io.Copy(io.Discard, mon.r)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("monitor connection still open: %v", err)
	}
	// The others are served as before.
	if got := c.do("QLEN q"); !strings.HasPrefix(got, ":") {
		t.Errorf("QLEN after the drop: %q", got)
	}
}
