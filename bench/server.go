package bench

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrServerExited is returned (wrapped) when a server process started by
// StartServer exits before it is ready or before Stop.
var ErrServerExited = errors.New("bench: server exited")

// ServerConfig says how to start one server process.
type ServerConfig struct {
	// Target decides the readiness check: PING, and for diskque also
	// INFO's loading:0.
	Target Target
	// Bin is the executable (bin/diskque-server, /usr/bin/redis-server).
	Bin string
	// Dir is the data directory; it must exist. The server is started
	// with "--port P --bind 127.0.0.1 --dir Dir" and then Args.
	Dir string
	// Args are further flags, e.g. "--appendfsync", "always".
	Args []string
	// ReadyTimeout bounds the wait for readiness. Default 30s.
	ReadyTimeout time.Duration
	// StopTimeout bounds the wait after SIGTERM before SIGKILL. Default 30s.
	StopTimeout time.Duration
}

// Server is a server process started by StartServer. Stop it exactly once.
type Server struct {
	// Addr is 127.0.0.1:port.
	Addr string
	// Started is the instant just before the process was exec'd.
	Started time.Time

	cfg    ServerConfig
	cmd    *exec.Cmd
	out    *serverLog
	exited chan struct{} // closed once the process has been waited for
}

// poll interval of the readiness check.
const readyPoll = 10 * time.Millisecond

// StartServer starts cfg.Bin on a free loopback port and waits, polling,
// until it is ready. A port taken between choosing and binding it is
// retried with another, up to five times. On error no process is left
// running.
func StartServer(ctx context.Context, cfg ServerConfig) (*Server, error) {
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	// The process runs in Dir: a relative Bin must not be resolved there.
	bin, err := resolveBin(cfg.Bin)
	if err != nil {
		return nil, err
	}
	cfg.Bin = bin
	for attempt := 1; ; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s, err := spawn(cfg, port)
		if err != nil {
			return nil, err
		}
		args := s.cmd.Args[1:]
		err = s.waitReady(ctx)
		if err == nil {
			return s, nil
		}
		select {
		case <-s.exited:
			if attempt < 5 && strings.Contains(strings.ToLower(s.out.Tail()), "address already in use") {
				continue
			}
		default:
			_ = s.cmd.Process.Kill()
			<-s.exited
		}
		return nil, fmt.Errorf("bench: %s %s not ready: %w; its output ends:\n%s",
			cfg.Bin, strings.Join(args, " "), err, s.out.Tail())
	}
}

// spawn starts cfg.Bin (already resolved) on port without waiting for it;
// Server.Started is the instant just before the exec.
func spawn(cfg ServerConfig, port int) (*Server, error) {
	if cfg.StopTimeout <= 0 {
		cfg.StopTimeout = 30 * time.Second
	}
	s := &Server{
		Addr:   net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
		cfg:    cfg,
		out:    &serverLog{},
		exited: make(chan struct{}),
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", cfg.Dir}, cfg.Args...)
	if cfg.Target == TargetDiskque && !slices.Contains(cfg.Args, "--cluster-bus-port") {
		// A lone node's bus port is port + 10000 by default, which
		// nothing reserved: another process may hold it (a restart
		// workload's second exec failed so). Any free one will do.
		args = append(args, "--cluster-bus-port", "0")
	}
	s.cmd = exec.Command(cfg.Bin, args...)
	s.cmd.Dir = cfg.Dir
	s.cmd.Stdout, s.cmd.Stderr = s.out, s.out
	detach(s.cmd)
	s.Started = time.Now()
	if err := s.cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s: %w", cfg.Bin, err)
	}
	go func() {
		_ = s.cmd.Wait()
		close(s.exited)
	}()
	return s, nil
}

// Pid is the server's process id.
func (s *Server) Pid() int { return s.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the process to exit.
func (s *Server) Kill() error {
	select {
	case <-s.exited:
		return fmt.Errorf("%w before it was killed: %v", ErrServerExited, s.cmd.ProcessState)
	default:
	}
	if err := s.cmd.Process.Kill(); err != nil {
		return fmt.Errorf("bench: SIGKILL %s: %w", s.cfg.Bin, err)
	}
	<-s.exited
	return nil
}

// resolveBin returns the absolute path of an executable named by a path
// or, without a slash, looked up on PATH.
func resolveBin(bin string) (string, error) {
	p, err := exec.LookPath(bin)
	if err != nil {
		return "", fmt.Errorf("bench: server binary: %w", err)
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return "", fmt.Errorf("bench: server binary: %w", err)
	}
	return abs, nil
}

// freePort returns a loopback port that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("bench: find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitReady polls until PING answers PONG (and diskque's INFO says
// loading:0), the process exits, ctx ends or ReadyTimeout passes.
func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(s.cfg.ReadyTimeout)
	poll := time.NewTimer(0)
	defer poll.Stop()
	var last error
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.exited:
			return fmt.Errorf("%w: %v", ErrServerExited, s.cmd.ProcessState)
		case <-poll.C:
		}
		if last = probeReady(s.Addr, s.cfg.Target); last == nil {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("not ready after %v: %w", s.cfg.ReadyTimeout, last)
		}
		poll.Reset(readyPoll)
	}
}

// probeReady is one readiness check.
func probeReady(addr string, target Target) error {
	cmds := [][]string{{"PING"}}
	if target == TargetDiskque {
		cmds = append(cmds, []string{"INFO"})
	}
	replies, err := Do(addr, 2*time.Second, cmds...)
	if err != nil {
		return err
	}
	if v := replies[0]; v.Kind != KindSimple || v.Str != "PONG" {
		return fmt.Errorf("PING: %v", v)
	}
	if target == TargetDiskque {
		if v := replies[1]; v.Kind != KindBulk || !strings.Contains(v.Str, "\r\nloading:0\r\n") {
			return fmt.Errorf("INFO: still loading or unexpected: %.80q", v.Str)
		}
	}
	return nil
}

// Do opens a connection to addr, sends cmds pipelined, reads one reply per
// command and closes the connection; timeout bounds the whole exchange.
// Error replies are returned as values, not errors.
func Do(addr string, timeout time.Duration, cmds ...[]string) ([]Value, error) {
	conn, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	w := NewWriter(conn)
	for _, c := range cmds {
		w.Command(c...)
	}
	if err := w.Flush(); err != nil {
		return nil, err
	}
	r := NewReader(conn)
	out := make([]Value, 0, len(cmds))
	for range cmds {
		v, err := r.Read()
		if err != nil {
			return out, err
		}
		out = append(out, v)
	}
	return out, nil
}

// QueueLen returns QLEN queue (diskque) or LLEN queue (redis).
func QueueLen(addr string, target Target, queue string) (int64, error) {
	cmd := "QLEN"
	if target == TargetRedis {
		cmd = "LLEN"
	}
	replies, err := Do(addr, 10*time.Second, []string{cmd, queue})
	if err != nil {
		return -1, err
	}
	if v := replies[0]; v.Kind != KindInt {
		return -1, fmt.Errorf("bench: %s %s: %v", cmd, queue, v)
	}
	return replies[0].Int, nil
}

// Stop sends SIGTERM and waits for the process to exit (SIGKILL after
// StopTimeout). It fails if the process had already exited, needed the
// SIGKILL or exited with a non-zero status.
func (s *Server) Stop() error {
	select {
	case <-s.exited:
		return fmt.Errorf("%w before it was stopped: %v; its output ends:\n%s", ErrServerExited, s.cmd.ProcessState, s.out.Tail())
	default:
	}
	if err := s.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("bench: SIGTERM %s: %w", s.cfg.Bin, err)
	}
	t := time.NewTimer(s.cfg.StopTimeout)
	defer t.Stop()
	select {
	case <-s.exited:
	case <-t.C:
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("bench: %s did not exit within %v of SIGTERM; killed", s.cfg.Bin, s.cfg.StopTimeout)
	}
	if code := s.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("bench: %s exited with status %d after SIGTERM; its output ends:\n%s", s.cfg.Bin, code, s.out.Tail())
	}
	return nil
}

// Notable returns the server's warning and error log lines (at most 20)
// and how many there were in all.
func (s *Server) Notable() ([]string, int) { return s.out.Notable() }

// Output returns the last 64 KiB of the server's output.
func (s *Server) Output() string { return s.out.Tail() }

// serverLog keeps the tail of a server's output and its warning lines:
// diskque's slog "level=WARN"/"level=ERROR", redis's "# WARNING" lines, panics
// and race reports. Safe for concurrent use.
type serverLog struct {
	mu      sync.Mutex
	tail    []byte
	partial []byte
	notable []string
	count   int
}

const (
	serverLogTail = 64 << 10
	maxNotable    = 20
)

func (l *serverLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.tail = append(l.tail, p...)
	if over := len(l.tail) - serverLogTail; over > 0 {
		l.tail = slices.Delete(l.tail, 0, over)
	}
	l.partial = append(l.partial, p...)
	for {
		i := slices.Index(l.partial, '\n')
		if i < 0 {
			break
		}
		line := string(l.partial[:i])
		l.partial = l.partial[i+1:]
		if isNotable(line) {
			l.count++
			if len(l.notable) < maxNotable {
				l.notable = append(l.notable, line)
			}
		}
	}
	if len(l.partial) > serverLogTail {
		l.partial = l.partial[:0]
	}
	return len(p), nil
}

func isNotable(line string) bool {
	for _, s := range []string{"level=WARN", "level=ERROR", " # WARNING", "panic:", "fatal error:", "DATA RACE"} {
		if strings.Contains(line, s) {
			return true
		}
	}
	return false
}

func (l *serverLog) Tail() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.tail)
}

func (l *serverLog) Notable() ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.notable), l.count
}
