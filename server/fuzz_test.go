package server

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
)

// FuzzCommands drives random argument vectors through every command handler
// of a real Server over TCP and checks that each one gets exactly one
// well-formed RESP2 reply within fuzzReplyTimeout, and that the connection
// still answers PING afterwards. A handler panic crashes the test process,
// which is the point.
//
// An input is split into arguments on fuzzSep. The first argument picks the
// command: a registered name (any case) is used as is; a single byte b picks
// fuzzNames()[b % len]; anything else is sent raw (the unknown
// command path). An argument fuzzIDMark+k is replaced by the id of job k%n of
// a small pool of real jobs, so that the id-taking commands get past the
// id check. Commands that would end the server or the connection, or block,
// are left out or defused (see fuzzArgs).
//
// The server and its in-memory store live for the whole fuzz process: state
// carries over from one input to the next, so a failure found by the fuzzer
// may need the inputs before it to reproduce.
func FuzzCommands(f *testing.F) {
	for _, seed := range fuzzSeeds() {
		f.Add(fuzzVec(seed...))
	}
	h := newFuzzHarness(f)
	f.Fuzz(func(t *testing.T, data []byte) {
		h.run(t, data)
	})
}

const (
	fuzzSep          = 0x00
	fuzzIDMark       = 0x01
	fuzzReplyTimeout = 5 * time.Second
	fuzzPoolQueue    = "fuzz-pool"
	fuzzPoolSize     = 4
	// fuzzFlushEvery bounds the store's growth: every so many inputs it is
	// flushed and the pool refilled, so scans stay fast.
	fuzzFlushEvery = 2000
	// fuzzMaxDepth and fuzzMaxElems bound what the reply parser accepts.
	fuzzMaxDepth = 8
	fuzzMaxElems = 1 << 20
)

// fuzzExcluded are never picked: they end the server or the connection.
// (MONITOR is fuzzed: run checks the monitor and starts a new connection.)
var fuzzExcluded = map[string]bool{"shutdown": true, "quit": true}

// fuzzNames is the sorted list of the registered commands the fuzzer picks
// from. (A function: commands is filled by init, after package variables.)
func fuzzNames() []string {
	var names []string
	for name := range commands {
		if !fuzzExcluded[name] {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	return names
}

func fuzzVec(args ...string) []byte {
	return []byte(strings.Join(args, string(rune(fuzzSep))))
}

// fuzzID is the argument that stands for pool job k (k+'0': not the
// separator).
func fuzzID(k byte) string { return string([]byte{fuzzIDMark, '0' + k}) }

func fuzzSeeds() [][]string {
	return [][]string{
		{"ping"},
		{"PING", "hello"},
		{"ping", "a", "b"},
		{"hello"},
		{"hello", "3"},
		{"info"},
		{"info", "jobs"},
		{"info", "bogus"},
		{"time"},
		{"time", "x"},
		{"command"},
		{"command", "count"},
		{"command", "info", "addjob", "nosuch"},
		{"command", "docs"},
		{"command", "\r\nbogus"},
		{"cluster", "myid"},
		{"cluster", "nodes"},
		{"cluster", "info"},
		{"cluster", "meet", "1.2.3.4", "7711"},
		{"debug", "sleep", "0"},
		{"debug", "sleep", "nan"},
		{"debug", "sleep", "-1"},
		{"debug", "bogus"},
		{"auth", "secret"},
		{"auth", "default", "secret"},
		{"client", "list"},
		{"client", "info"},
		{"client", "id"},
		{"client", "setname", "fuzzer"},
		{"client", "getname"},
		{"client", "setname", "bad name"},
		{"client", "setinfo", "lib-name", "x"},
		{"addjob", "q", "body", "0"},
		{"addjob", "q", "body", "0", "REPLICATE", "1", "RETRY", "0", "TTL", "60", "DELAY", "1", "MAXLEN", "100", "ASYNC"},
		{"addjob", "q", "body", "-1"},
		{"addjob", "q", "body", "0", "DELAY", "10", "TTL", "5"},
		{"addjob", "q", "body", "0", "TTL"},
		{"addjob", "q", "body", "0", "REPLICATE", "3", "RETRY", "0"},
		{"getjob", "from", "q"},
		{"getjob", "withcounters", "count", "3", "timeout", "1", "from", "q", fuzzPoolQueue},
		{"getjob", "count", "0", "from", "q"},
		{"getjob", "q"},
		{"ackjob", fuzzID(0)},
		{"fastack", fuzzID(1), "D-bogus"},
		{"deljob", fuzzID(2)},
		{"enqueue", fuzzID(3)},
		{"dequeue", fuzzID(0), fuzzID(1)},
		{"nack", fuzzID(1), "DELAY", "2"},
		{"nack", "DELAY", "2"},
		{"nack", fuzzID(2), "DELAY", "-2"},
		{"working", fuzzID(3)},
		{"working", "nope"},
		{"show", fuzzID(0)},
		{"show", "D-00000000-000000000000000000000000-0000"},
		{"ackjob", "D-\r\n\x7f\xff0000-000000000000000000000000-ffff", fuzzID(2)},
		{"working", fuzzID(2)},
		{"show", fuzzID(1)},
		{"show", fuzzID(2)},
		{"qlen", fuzzPoolQueue},
		{"qpeek", fuzzPoolQueue, "-2"},
		{"qpeek", "q", "x"},
		{"qstat", fuzzPoolQueue},
		{"qstat", "nosuch"},
		{"pause", "q", "in", "out"},
		{"pause", "q", "none", "bcast"},
		{"pause", "q", "state"},
		{"pause", "q", "sideways"},
		{"qscan", "count", "1", "busyloop", "minlen", "0", "maxlen", "10", "importrate", "0"},
		{"qscan", "qbogus"},
		{"qscan", "0", "0"},
		{"jscan", "0", "count", "2", "queue", fuzzPoolQueue, "state", "queued", "state", "delayed", "reply", "all"},
		{"jscan", "busyloop", "state", "active", "reply", "id"},
		{"jscan", "state", "\r\nweird"},
		{"jscan", "jAAAA"},
		{"debug", "flushall"},
		{"monitor"},
		{"MONITOR", "x"},
		{"nosuchcommand", "x"},
		{"\x05", "x", "y"},
	}
}

type fuzzHarness struct {
	addr   string
	broker *queue.Broker
	conn   net.Conn
	r      *bufio.Reader
	names  []string
	inputs int
	pool   [fuzzPoolSize]string
}

func newFuzzHarness(f *testing.F) *fuzzHarness {
	b := newBrokerOn(f, vfs.NewMem())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		f.Fatal(err)
	}
	s := New(Options{})
	s.SetBroker(b)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	h := &fuzzHarness{addr: ln.Addr().String(), broker: b, names: fuzzNames()}
	f.Cleanup(func() {
		if h.conn != nil {
			h.conn.Close()
		}
		s.Close()
		if err := <-done; err != nil {
			f.Errorf("serve: %v", err)
		}
	})
	if err := h.dial(); err != nil {
		f.Fatal(err)
	}
	if err := h.refillPool(true); err != nil {
		f.Fatal(err)
	}
	return h
}

func (h *fuzzHarness) dial() error {
	c, err := net.Dial("tcp", h.addr)
	if err != nil {
		return err
	}
	h.conn, h.r = c, bufio.NewReader(c)
	return nil
}

// refillPool replaces the pool jobs that no longer exist (all of them when
// all is set) with fresh ones in varied states: queued, active (delivered
// from a queue of its own), delayed, and queued.
func (h *fuzzHarness) refillPool(all bool) error {
	b := h.broker
	for k := range h.pool {
		if !all && h.pool[k] != "" {
			if _, _, err := b.Job(h.pool[k]); !errors.Is(err, queue.ErrNoJob) {
				continue
			}
		}
		r := queue.AddRequest{Queue: fuzzPoolQueue, Body: []byte("pool-" + strconv.Itoa(k)),
			TTL: 3600, Retry: 60, Replicate: 1}
		switch k {
		case 1:
			r.Queue = fuzzPoolQueue + "-active"
		case 2:
			r.Delay = 600
		}
		// The fuzzer may have paused the queue.
		if _, err := b.Pause(r.Queue, 0); err != nil {
			return err
		}
		res := b.AddJobs([]queue.AddRequest{r})
		if res[0].Err != nil {
			return fmt.Errorf("pool job %d: %w", k, res[0].Err)
		}
		h.pool[k] = res[0].ID
		if k == 1 {
			if _, err := b.GetJobs(context.Background(), queue.GetRequest{
				Queues: []string{r.Queue}, Count: 1, NoHang: true}); err != nil {
				return err
			}
		}
	}
	return nil
}

// fuzzArgs turns an input into the argument vector to send, or nil to skip
// it.
func (h *fuzzHarness) fuzzArgs(data []byte) [][]byte {
	args := bytes.Split(data, []byte{fuzzSep})
	name := strings.ToLower(string(args[0]))
	switch {
	case commands[name] != nil:
	case len(args[0]) == 1:
		name = h.names[int(args[0][0])%len(h.names)]
		args[0] = []byte(name)
	}
	if fuzzExcluded[name] {
		return nil
	}
	for i := 1; i < len(args); i++ {
		if len(args[i]) == 2 && args[i][0] == fuzzIDMark {
			args[i] = []byte(h.pool[int(args[i][1])%len(h.pool)])
		}
	}
	sub := ""
	if len(args) > 1 {
		sub = strings.ToLower(string(args[1]))
	}
	switch {
	case name == "getjob":
		// Never block.
		args = slices.Insert(args, 1, []byte("NOHANG"))
	case name == "client" && sub == "kill":
		return nil // the only client it could kill is ours
	case name == "debug" && sub == "sleep" && len(args) == 3:
		// Keep the error paths (and NaN), defuse real sleeps.
		if v, err := strconv.ParseFloat(string(args[2]), 64); err == nil && v > 0.001 && v <= 1e6 {
			args[2] = []byte("0")
		}
	}
	return args
}

func (h *fuzzHarness) run(t *testing.T, data []byte) {
	h.inputs++
	if h.inputs%fuzzFlushEvery == 0 {
		if err := h.broker.FlushAll(); err != nil {
			t.Fatalf("flushall: %v", err)
		}
		if err := h.refillPool(true); err != nil {
			t.Fatal(err)
		}
	}
	args := h.fuzzArgs(data)
	if args == nil {
		return
	}
	if bytes.IndexByte(data, fuzzIDMark) >= 0 {
		if err := h.refillPool(false); err != nil {
			t.Fatal(err)
		}
	}
	if h.conn == nil {
		if err := h.dial(); err != nil {
			t.Fatal(err)
		}
	}
	fail := func(format string, a ...any) {
		h.conn.Close()
		h.conn = nil // the next input gets a fresh connection
		t.Fatalf("args %q: %s", args, fmt.Sprintf(format, a...))
	}

	reply, err := h.roundTrip(encodeRESP(args))
	if err != nil {
		fail("reply: %v", err)
	}
	t.Logf("%q -> %s", args, reply)
	name := strings.ToLower(string(args[0]))
	cmd := commands[name]
	switch {
	case cmd == nil:
		if !reply.isError("ERR unknown command ") {
			fail("unknown command answered %s", reply)
		}
	case cmd.arity > 0 && len(args) != cmd.arity || cmd.arity < 0 && len(args) < -cmd.arity:
		if !reply.isError("ERR wrong number of arguments") {
			fail("wrong arity answered %s", reply)
		}
	}

	if cmd != nil && cmd.name == "monitor" && reply.kind == '+' {
		// The connection is a monitor now (no other client sends anything,
		// so no line arrives): it refuses PING and takes QUIT. The next
		// input gets a fresh connection.
		if r, err := h.roundTrip(encodeRESP([][]byte{[]byte("PING")})); err != nil || !r.isError(errMonitorMode) {
			fail("PING from a monitor: %v %v", r, err)
		}
		if r, err := h.roundTrip(encodeRESP([][]byte{[]byte("QUIT")})); err != nil || r.kind != '+' {
			fail("QUIT from a monitor: %v %v", r, err)
		}
		h.conn.Close()
		h.conn = nil
		return
	}

	pong, err := h.roundTrip(encodeRESP([][]byte{[]byte("PING")}))
	if err != nil {
		fail("PING after: %v", err)
	}
	if pong.kind != '+' || pong.str != "PONG" {
		fail("PING after: got %s", pong)
	}
}

// roundTrip sends raw and reads exactly one reply: nothing may follow it.
func (h *fuzzHarness) roundTrip(raw []byte) (*respValue, error) {
	if err := h.conn.SetDeadline(time.Now().Add(fuzzReplyTimeout)); err != nil {
		return nil, err
	}
	if _, err := h.conn.Write(raw); err != nil {
		return nil, err
	}
	v, err := readRESP(h.r, 0)
	if err != nil {
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, fmt.Errorf("no reply within %v (hang?): %w", fuzzReplyTimeout, err)
		}
		return nil, err
	}
	if n := h.r.Buffered(); n > 0 {
		extra, _ := h.r.Peek(min(n, 200))
		return nil, fmt.Errorf("%d unexpected bytes after the reply %s: %q", n, v, extra)
	}
	return v, nil
}

func encodeRESP(args [][]byte) []byte {
	var b []byte
	b = fmt.Appendf(b, "*%d\r\n", len(args))
	for _, a := range args {
		b = fmt.Appendf(b, "$%d\r\n", len(a))
		b = append(b, a...)
		b = append(b, '\r', '\n')
	}
	return b
}

// respValue is one RESP2 reply.
type respValue struct {
	kind  byte // + - : $ *
	str   string
	n     int64
	null  bool
	elems []*respValue
}

func (v *respValue) isError(prefix string) bool {
	return v.kind == '-' && strings.HasPrefix(v.str, prefix)
}

func (v *respValue) String() string {
	switch {
	case v.null:
		return string(v.kind) + "-1"
	case v.kind == ':':
		return ":" + strconv.FormatInt(v.n, 10)
	case v.kind == '*':
		parts := make([]string, len(v.elems))
		for i, e := range v.elems {
			parts[i] = e.String()
		}
		return "[" + strings.Join(parts, " ") + "]"
	}
	return string(v.kind) + strconv.Quote(truncate(v.str, 200))
}

// readLine reads a line ended by CRLF, with no CR or LF inside.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	if len(line) < 2 || line[len(line)-2] != '\r' {
		return "", fmt.Errorf("line not ended by CRLF: %q", line)
	}
	line = line[:len(line)-2]
	if strings.ContainsAny(line, "\r\n") {
		return "", fmt.Errorf("CR or LF inside a line: %q", line)
	}
	return line, nil
}

// parseRESPInt parses a RESP integer strictly: decimal, optional '-', no
// '+', no leading zeros.
func parseRESPInt(s string) (int64, error) {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || len(digits) > 1 && digits[0] == '0' || s == "-0" {
		return 0, fmt.Errorf("bad integer %q", s)
	}
	for i := 0; i < len(digits); i++ {
		if digits[i] < '0' || digits[i] > '9' {
			return 0, fmt.Errorf("bad integer %q", s)
		}
	}
	return strconv.ParseInt(s, 10, 64)
}

func readRESP(r *bufio.Reader, depth int) (*respValue, error) {
	if depth > fuzzMaxDepth {
		return nil, fmt.Errorf("reply nested deeper than %d", fuzzMaxDepth)
	}
	line, err := readLine(r)
	if err != nil {
		return nil, err
	}
	if line == "" {
		return nil, errors.New("empty reply line")
	}
	v := &respValue{kind: line[0], str: line[1:]}
	switch v.kind {
	case '+':
		return v, nil
	case '-':
		if v.str == "" {
			return nil, errors.New("empty error reply")
		}
		return v, nil
	case ':':
		v.n, err = parseRESPInt(v.str)
		return v, err
	case '$':
		n, err := parseRESPInt(v.str)
		if err != nil {
			return nil, err
		}
		if n == -1 {
			v.null = true
			return v, nil
		}
		if n < 0 || n > 512<<20 {
			return nil, fmt.Errorf("bad bulk length %d", n)
		}
		buf := make([]byte, n+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		if buf[n] != '\r' || buf[n+1] != '\n' {
			return nil, fmt.Errorf("bulk of %d bytes not followed by CRLF: %q", n, buf[n:])
		}
		v.str = string(buf[:n])
		return v, nil
	case '*':
		n, err := parseRESPInt(v.str)
		if err != nil {
			return nil, err
		}
		if n == -1 {
			v.null = true
			return v, nil
		}
		if n < 0 || n > fuzzMaxElems {
			return nil, fmt.Errorf("bad array length %d", n)
		}
		v.elems = make([]*respValue, 0, min(n, 1024))
		for range n {
			e, err := readRESP(r, depth+1)
			if err != nil {
				return nil, err
			}
			v.elems = append(v.elems, e)
		}
		return v, nil
	}
	return nil, fmt.Errorf("unknown reply type %q in %q", v.kind, line)
}
