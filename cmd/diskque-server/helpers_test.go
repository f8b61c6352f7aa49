package main

// End-to-end test harness: TestMain builds the diskque-server binary once
// (with -race when the tests run with -race, so the detector covers the
// server too), and every test starts its own server process on a free
// port of 127.0.0.1 with its own data directory.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/leakcheck"
	"github.com/redis/go-redis/v9"
)

// serverBin is the diskque-server binary TestMain built.
var serverBin string

func TestMain(m *testing.M) {
	// go-redis logs dial failures of clients whose server a test stopped.
	redis.SetLogger(quietLogger{})
	dir, err := os.MkdirTemp("", "diskque-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	serverBin = filepath.Join(dir, "diskque-server")
	args := []string{"build", "-o", serverBin}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, ".")
	build := exec.Command(goTool(), args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: go %s: %v\n", strings.Join(args, " "), err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	// leakcheck.Main: the in-process tests (node, live) must leave no
	// store, broker, collector or connection goroutine behind.
	code := leakcheck.Main(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

// quietLogger drops go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// goTool finds the go command: on PATH, else in the toolchain that built
// this test.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}

// Timeouts of the harness. Generous: the server may be built with -race on
// a loaded 2-core machine.
const (
	readyTimeout = 30 * time.Second
	stopTimeout  = 30 * time.Second
)

// syncBuffer collects a process's output; safe for concurrent use.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// daemon is one node's data directory and the process serving it, if any.
// Restart keeps the directory.
type daemon struct {
	t     *testing.T
	dir   string
	pre   []string // arguments before the flags (a config file)
	flags []string // extra --directive value flags
	proc  *process
	logs  []*syncBuffer // output of every process run on dir
	addr  string        // 127.0.0.1:port of the running process
	port  int
	// fixedPort, when set, is the port the config file (pre) names: Start
	// passes no --port, --bind or --dir of its own, and runs the process in
	// cwd (Disque's test suite: "disque-server disque_N/disque.conf").
	fixedPort int
	cwd       string
	// host, when set, is the address the node binds and is reached at
	// instead of 127.0.0.1 (a node of a fault-proxied cluster).
	host string
}

// process is one run of the binary.
type process struct {
	cmd    *exec.Cmd
	out    *syncBuffer
	exited chan struct{} // closed once Wait returns
}

// serverConfig tunes startServer.
type serverConfig struct {
	pre   []string
	flags []string
	dir   string
	host  string // bind and reach the node here; "" = 127.0.0.1
}

// startServer starts a server on a fresh t.TempDir() with the given extra
// flags ("--appendfsync", "always", …) and stops it (SIGTERM, exit code 0)
// at cleanup.
func startServer(t *testing.T, flags ...string) *daemon {
	t.Helper()
	return startServerConfig(t, serverConfig{flags: flags})
}

func startServerConfig(t *testing.T, cfg serverConfig) *daemon {
	t.Helper()
	s := &daemon{t: t, dir: cfg.dir, pre: cfg.pre, flags: cfg.flags, host: cfg.host}
	if s.dir == "" {
		s.dir = t.TempDir()
	}
	// Cleanups run last-registered first: the logs are printed after the
	// stop, so they include the shutdown (and any race report).
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for i, l := range s.logs {
			t.Logf("server output (run %d of %d on %s):\n%s", i+1, len(s.logs), s.dir, l.String())
		}
	})
	t.Cleanup(func() {
		if s.proc != nil {
			s.Stop()
		}
	})
	s.Start()
	return s
}

// freePort returns a port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return port
}

// Start runs the binary on s.dir and waits until it answers PING and INFO
// says loading:0. A port taken in the meantime is retried with another.
func (s *daemon) Start() {
	t := s.t
	t.Helper()
	if s.proc != nil {
		t.Fatal("server already running")
	}
	host := s.host
	if host == "" {
		host = "127.0.0.1"
	}
	for attempt := 1; ; attempt++ {
		port := s.fixedPort
		args := slices.Clone(s.pre)
		if port == 0 {
			port = freePort(t)
			args = append(args, "--port", strconv.Itoa(port), "--bind", host, "--dir", s.dir)
			// A free bus port, not port + 10000 (which may be taken, or
			// above 65535); a test's own --cluster-bus-port comes later and
			// wins.
			args = append(args, "--cluster-bus-port", "0")
		}
		args = append(args, s.flags...)
		cmd := exec.Command(serverBin, args...)
		cmd.Dir = s.cwd
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatalf("start %s: %v", serverBin, err)
		}
		p := &process{cmd: cmd, out: out, exited: make(chan struct{})}
		go func() {
			_ = cmd.Wait()
			close(p.exited)
		}()
		s.logs = append(s.logs, out)
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		err := waitReady(addr, p.exited, readyTimeout)
		if err == nil {
			s.proc, s.addr, s.port = p, addr, port
			return
		}
		select {
		case <-p.exited:
			if strings.Contains(out.String(), "address already in use") && attempt < 5 && s.fixedPort == 0 {
				t.Logf("port %d taken, retrying", port)
				continue
			}
		default:
			_ = cmd.Process.Kill()
			<-p.exited
		}
		t.Fatalf("server on %s not ready: %v", addr, err)
	}
}

// waitReady polls addr until PING answers PONG and INFO has loading:0.
func waitReady(addr string, exited <-chan struct{}, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return errors.New("server exited")
		default:
		}
		last = probeReady(addr)
		if last == nil {
			return nil
		}
		time.Sleep(10 * time.Millisecond) // poll interval
	}
	return fmt.Errorf("not ready after %v: %v", timeout, last)
}

func probeReady(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.WriteString(c, "PING\r\nINFO\r\n"); err != nil {
		return err
	}
	r := bufio.NewReader(c)
	pong, err := readReply(r)
	if err != nil {
		return err
	}
	if pong.kind != '+' || pong.str != "PONG" {
		return fmt.Errorf("PING: %v", pong)
	}
	info, err := readReply(r)
	if err != nil {
		return err
	}
	if info.kind != '$' || !strings.Contains(info.str, "\r\nloading:0\r\n") {
		return fmt.Errorf("INFO: still loading or unexpected: %.80q", info.str)
	}
	return nil
}

// Stop sends SIGTERM, waits for the process and checks it exited with 0.
func (s *daemon) Stop() {
	s.t.Helper()
	s.stopWith(syscall.SIGTERM)
}

// stopWith sends sig, waits for the process and checks it exited with 0.
func (s *daemon) stopWith(sig os.Signal) {
	t := s.t
	t.Helper()
	p := s.proc
	if p == nil {
		t.Fatal("server not running")
	}
	s.proc = nil
	select {
	case <-p.exited:
		t.Errorf("server exited before %v: %v", sig, p.cmd.ProcessState)
		return
	default:
	}
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Errorf("%v: %v", sig, err)
	}
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Errorf("server did not exit within %v of %v; killing it", stopTimeout, sig)
		_ = p.cmd.Process.Kill()
		<-p.exited
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("server exit code after %v = %d, want 0", sig, code)
	}
	if out := p.out.String(); strings.Contains(out, "WARNING: DATA RACE") {
		t.Errorf("the race detector found a data race in the server (output logged below)")
	}
}

// Kill sends SIGKILL and waits for the process: a crash.
func (s *daemon) Kill() {
	t := s.t
	t.Helper()
	p := s.proc
	if p == nil {
		t.Fatal("server not running")
	}
	s.proc = nil
	if err := p.cmd.Process.Kill(); err != nil {
		t.Errorf("SIGKILL: %v", err)
	}
	<-p.exited
}

// Restart stops the server gracefully and starts it again on the same
// directory (on a new port: take new clients).
func (s *daemon) Restart() {
	s.t.Helper()
	s.Stop()
	s.Start()
}

// client returns a go-redis client speaking RESP2 without the CLIENT
// SETINFO handshake, closed at cleanup. It never retries a command.
func (s *daemon) client(t *testing.T) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{
		Addr:            s.addr,
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1,
		ReadTimeout:     30 * time.Second,
		WriteTimeout:    10 * time.Second,
		PoolSize:        4,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// do runs a command that must succeed and returns its reply.
func do(t *testing.T, c *redis.Client, args ...any) any {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

// doNil runs a command whose reply must be a null (bulk or array).
func doNil(t *testing.T, c *redis.Client, args ...any) {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	if !errors.Is(err, redis.Nil) {
		t.Fatalf("%v = %#v, %v; want a null reply", args, v, err)
	}
}

// doErr runs a command whose reply must be an error and returns its text
// (without the leading '-').
func doErr(t *testing.T, c *redis.Client, args ...any) string {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		t.Fatalf("%v = %#v, %v; want an error reply", args, v, err)
	}
	return rerr.Error()
}

// wantErr runs a command whose reply must be exactly the error want.
func wantErr(t *testing.T, c *redis.Client, want string, args ...any) {
	t.Helper()
	if got := doErr(t, c, args...); got != want {
		t.Errorf("%v = -%s\nwant -%s", args, got, want)
	}
}

func doInt(t *testing.T, c *redis.Client, args ...any) int64 {
	t.Helper()
	v := do(t, c, args...)
	n, ok := v.(int64)
	if !ok {
		t.Fatalf("%v = %#v, want an integer", args, v)
	}
	return n
}

func doStr(t *testing.T, c *redis.Client, args ...any) string {
	t.Helper()
	v := do(t, c, args...)
	s, ok := v.(string)
	if !ok {
		t.Fatalf("%v = %#v, want a string", args, v)
	}
	return s
}

func doArr(t *testing.T, c *redis.Client, args ...any) []any {
	t.Helper()
	v := do(t, c, args...)
	a, ok := v.([]any)
	if !ok {
		t.Fatalf("%v = %#v, want an array", args, v)
	}
	return a
}

// jobIDRe is SPEC.md's job id: D-<8 hex>-<24 base64>-<4 hex>.
var jobIDRe = regexp.MustCompile(`^D-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-[0-9a-f]{4}$`)

// addJob runs ADDJOB queue body 0 opts… and checks the id's shape.
func addJob(t *testing.T, c *redis.Client, queue, body string, opts ...any) string {
	t.Helper()
	args := append([]any{"ADDJOB", queue, body, 0}, opts...)
	id := doStr(t, c, args...)
	if !jobIDRe.MatchString(id) {
		t.Fatalf("ADDJOB id %q does not match %s", id, jobIDRe)
	}
	return id
}

// job is one element of a GETJOB or QPEEK reply.
type job struct {
	Queue, ID, Body             string
	Nacks, AdditionalDeliveries int64
	Counters                    bool
}

// parseJobs reads a GETJOB/QPEEK reply: an array of [queue, id, body] or,
// with WITHCOUNTERS, of 7-element arrays.
func parseJobs(t *testing.T, v any) []job {
	t.Helper()
	arr, ok := v.([]any)
	if !ok {
		t.Fatalf("jobs reply %#v is not an array", v)
	}
	out := make([]job, len(arr))
	for i, e := range arr {
		f, ok := e.([]any)
		if !ok || (len(f) != 3 && len(f) != 7) {
			t.Fatalf("job %d = %#v, want 3 or 7 elements", i, e)
		}
		j := job{Queue: f[0].(string), ID: f[1].(string), Body: f[2].(string)}
		if len(f) == 7 {
			if f[3] != "nacks" || f[5] != "additional-deliveries" {
				t.Fatalf("job %d = %#v, want nacks at 3 and additional-deliveries at 5", i, f)
			}
			j.Nacks, j.AdditionalDeliveries, j.Counters = f[4].(int64), f[6].(int64), true
		}
		out[i] = j
	}
	return out
}

// getJobs runs GETJOB with args and parses the reply; a null reply is nil.
func getJobs(t *testing.T, c *redis.Client, args ...any) []job {
	t.Helper()
	v, err := c.Do(context.Background(), append([]any{"GETJOB"}, args...)...).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatalf("GETJOB %v: %v", args, err)
	}
	return parseJobs(t, v)
}

// showNames are SHOW's 15 field names, in SPEC order.
var showNames = []string{"id", "queue", "state", "repl", "ttl", "ctime", "delay", "retry", "nacks",
	"additional-deliveries", "nodes-delivered", "nodes-confirmed", "next-requeue-within",
	"next-awake-within", "body"}

// show runs SHOW id and returns its fields by name, checking the 30
// elements come in SPEC order (clients read them by position). nil if the
// job is unknown (null bulk).
func show(t *testing.T, c *redis.Client, id string) map[string]any {
	t.Helper()
	v, err := c.Do(context.Background(), "SHOW", id).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatalf("SHOW %s: %v", id, err)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) != 30 {
		t.Fatalf("SHOW %s = %#v, want 30 elements", id, v)
	}
	m := map[string]any{}
	for i, name := range showNames {
		if arr[2*i] != name {
			t.Fatalf("SHOW %s element %d = %#v, want %q", id, 2*i, arr[2*i], name)
		}
		m[name] = arr[2*i+1]
	}
	return m
}

// info returns INFO's key:value pairs.
func info(t *testing.T, c *redis.Client, section ...any) map[string]string {
	t.Helper()
	s := doStr(t, c, append([]any{"INFO"}, section...)...)
	m := map[string]string{}
	for _, line := range strings.Split(s, "\r\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && !strings.HasPrefix(line, "#") {
			m[k] = v
		}
	}
	return m
}

// waitUntil polls cond every few milliseconds until it holds, failing the
// test after timeout. It returns when cond first held.
func waitUntil(t *testing.T, timeout time.Duration, what string, cond func() bool) time.Time {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
}

// waitBlocked waits until INFO reports n blocked clients.
func waitBlocked(t *testing.T, c *redis.Client, n int) {
	t.Helper()
	want := strconv.Itoa(n)
	waitUntil(t, 10*time.Second, "blocked_clients:"+want, func() bool {
		return info(t, c, "clients")["blocked_clients"] == want
	})
}

// reply is one RESP2 reply read off a raw connection.
type reply struct {
	kind byte   // '+', '-', ':', '$', '*'
	str  string // simple string, error text, bulk
	n    int64  // integer
	arr  []reply
	null bool // $-1 or *-1
}

func (r reply) String() string {
	switch {
	case r.null:
		return string(r.kind) + "-1"
	case r.kind == ':':
		return ":" + strconv.FormatInt(r.n, 10)
	case r.kind == '*':
		parts := make([]string, len(r.arr))
		for i, e := range r.arr {
			parts[i] = e.String()
		}
		return "*[" + strings.Join(parts, " ") + "]"
	}
	return string(r.kind) + strconv.Quote(r.str)
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (reply, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return reply{}, err
	}
	if !strings.HasSuffix(line, "\r\n") || len(line) < 3 {
		return reply{}, fmt.Errorf("malformed reply line %q", line)
	}
	kind, rest := line[0], line[1:len(line)-2]
	switch kind {
	case '+', '-':
		return reply{kind: kind, str: rest}, nil
	case ':':
		n, err := strconv.ParseInt(rest, 10, 64)
		return reply{kind: kind, n: n}, err
	case '$':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return reply{}, err
		}
		if n < 0 {
			return reply{kind: kind, null: true}, nil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return reply{}, err
		}
		return reply{kind: kind, str: string(b[:n])}, nil
	case '*':
		n, err := strconv.Atoi(rest)
		if err != nil {
			return reply{}, err
		}
		if n < 0 {
			return reply{kind: kind, null: true}, nil
		}
		out := reply{kind: kind, arr: make([]reply, n)}
		for i := range out.arr {
			if out.arr[i], err = readReply(r); err != nil {
				return reply{}, err
			}
		}
		return out, nil
	}
	return reply{}, fmt.Errorf("unknown reply type in %q", line)
}

// rawConn is a plain TCP connection to the server.
type rawConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func (s *daemon) raw(t *testing.T) *rawConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", s.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &rawConn{t: t, c: c, r: bufio.NewReader(c)}
}

// send writes data in one write.
func (rc *rawConn) send(data string) {
	rc.t.Helper()
	_ = rc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(rc.c, data); err != nil {
		rc.t.Fatalf("write: %v", err)
	}
}

// read reads the next reply.
func (rc *rawConn) read() reply {
	rc.t.Helper()
	_ = rc.c.SetReadDeadline(time.Now().Add(30 * time.Second))
	r, err := readReply(rc.r)
	if err != nil {
		rc.t.Fatalf("read reply: %v", err)
	}
	return r
}

// resp encodes a command as a RESP array of bulk strings.
func resp(args ...string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&b, "$%d\r\n%s\r\n", len(a), a)
	}
	return b.String()
}

// The error texts SPEC.md gives word for word.
const (
	errSyntaxText   = "ERR syntax error"
	errRetryText    = "ERR With RETRY set to 0 please explicitly set REPLICATE to 1 (at-most-once delivery)"
	errDelayText    = "ERR The specified DELAY is greater than TTL. Job refused since would never be delivered"
	errNoReplText   = "NOREPL Not enough reachable nodes for the requested replication level"
	errMaxLenText   = "MAXLEN Queue is already longer than the specified MAXLEN count"
	errPausedText   = "PAUSED Queue paused in input, try later"
	errBadIDText    = "BADID Invalid Job ID format."
	errNoJobText    = "NOJOB Job not known in the context of this node."
	errTooLateText  = "TOOLATE Half of job TTL already elapsed, you are no longer allowed to postpone the next delivery."
	unknownValidID  = "D-12345678-ABCDEFGHIJKLMNOPQRSTUVWX-0001" // well formed, never issued
	garbageValidID  = "D-zzzzzzzz-!!!!!!!!!!!!!!!!!!!!!!!!-zzzz" // only the shape is checked
	nodeIDPattern   = `^[0-9a-f]{40}$`
	wrongArityFmt   = "ERR wrong number of arguments for '%s' command"
	unknownCmdStart = "ERR unknown command '"
)

var nodeIDRe = regexp.MustCompile(nodeIDPattern)

func wrongArity(cmd string) string { return fmt.Sprintf(wrongArityFmt, cmd) }

// wantErrPrefix runs a command whose reply must be an error starting with
// prefix (SPEC.md gives only "-ERR …" for these).
func wantErrPrefix(t *testing.T, c *redis.Client, prefix string, args ...any) {
	t.Helper()
	if got := doErr(t, c, args...); !strings.HasPrefix(got, prefix) {
		t.Errorf("%v = -%s, want an error starting with %q", args, got, prefix)
	}
}

func myID(t *testing.T, c *redis.Client) string {
	t.Helper()
	id := doStr(t, c, "CLUSTER", "MYID")
	if !nodeIDRe.MatchString(id) {
		t.Fatalf("CLUSTER MYID = %q, want 40 lower-case hex digits", id)
	}
	return id
}

func bodies(jobs []job) []string {
	out := make([]string, len(jobs))
	for i, j := range jobs {
		out[i] = j.Body
	}
	return out
}

func pollFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(5 * time.Millisecond) // poll interval
	}
	return true
}

// atoi parses an INFO figure; a missing or malformed one fails the test.
func atoi(t *testing.T, s string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		t.Fatalf("INFO figure %q: %v", s, err)
	}
	return n
}
