package main

// requirepass, maxclients, max-job-size and SHUTDOWN: the config directives
// and flags, and the built binary serving them.

import (
	"bufio"
	"context"
	"errors"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/testtool"
	"github.com/redis/go-redis/v9"
)

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{
		"0": 0, "65536": 65536, "64b": 64, "1k": 1000, "1kb": 1024, "64mb": 64 << 20, "64MB": 64 << 20,
		"2m": 2_000_000, "1gb": 1 << 30, "1g": 1_000_000_000,
	} {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "mb", "-1", "+5", "1.5mb", "1tb", "x", "99999999999999999gb"} {
		if got, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) = %d, want an error", in, got)
		}
	}
}

func TestConfigLimits(t *testing.T) {
	cfg, err := parseArgs(nil)
	if err != nil || cfg.RequirePass != "" || cfg.MaxClients != 10000 || cfg.MaxJobSize != 64<<20 {
		t.Fatalf("defaults = %+v, %v", cfg, err)
	}
	dir := t.TempDir()
	conf := filepath.Join(dir, "d.conf")
	if err := os.WriteFile(conf, []byte("requirepass fromfile\nmaxclients 50\nmax-job-size 1mb\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = parseArgs([]string{conf, "--max-job-size", "4kb", "--requirepass=flag"})
	if err != nil || cfg.RequirePass != "flag" || cfg.MaxClients != 50 || cfg.MaxJobSize != 4096 {
		t.Fatalf("file then flags = %+v, %v", cfg, err)
	}
	if err := os.WriteFile(conf, []byte("requirepass \"\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg, err = parseArgs([]string{conf}); err != nil || cfg.RequirePass != "" {
		t.Errorf("requirepass \"\" = %q, %v; want no password", cfg.RequirePass, err)
	}
	for _, args := range [][]string{
		{"--maxclients", "0"}, {"--maxclients", "many"}, {"--max-job-size", "0"}, {"--max-job-size", "2gb"},
		{"--max-job-size", "big"}, {"--protected-mode", "no"},
	} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("parseArgs(%q) accepted", args)
		}
	}
	if _, err := parseArgs([]string{"--bogus-directive", "1"}); err == nil || !strings.Contains(err.Error(), `unknown or not yet supported directive "bogus-directive"`) {
		t.Errorf("unknown directive: %v", err)
	}
	for _, name := range []string{"requirepass", "maxclients", "max-job-size"} {
		if !strings.Contains(usage, "  "+name+" ") {
			t.Errorf("usage does not document %s", name)
		}
	}
}

// startAuthServer runs the binary with --requirepass pw (the harness's
// readiness probe cannot AUTH) and returns its address and process.
func startAuthServer(t *testing.T, pw string, flags ...string) (string, *process) {
	t.Helper()
	port := freePort(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", t.TempDir(), "--requirepass", pw}, flags...)
	cmd := exec.Command(serverBin, args...)
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, out: out, exited: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	t.Cleanup(func() {
		select {
		case <-p.exited:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			<-p.exited
		}
		if t.Failed() {
			t.Logf("server output:\n%s", out.String())
		}
	})
	ready := pollFor(readyTimeout, func() bool {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := c.Write([]byte(resp("AUTH", pw) + "INFO persistence\r\n")); err != nil {
			return false
		}
		r := bufio.NewReader(c)
		ok, err := readReply(r)
		if err != nil || ok.str != "OK" {
			return false
		}
		info, err := readReply(r)
		return err == nil && strings.Contains(info.str, "loading:0")
	})
	if !ready {
		t.Fatalf("server with requirepass not ready on %s", addr)
	}
	return addr, p
}

// TestRequirePassAndShutdown: clients must AUTH; go-redis with a password
// works; SHUTDOWN stops the daemon the way SIGTERM does (exit 0, jobs
// kept).
func TestRequirePassAndShutdown(t *testing.T) {
	t.Parallel()
	addr, p := startAuthServer(t, "open sesame", "--max-job-size", "1kb")
	ctx := context.Background()

	anon := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	defer anon.Close()
	if err := anon.Ping(ctx).Err(); err == nil || err.Error() != "NOAUTH Authentication required." {
		t.Errorf("PING without AUTH: %v", err)
	}
	wrong := redis.NewClient(&redis.Options{Addr: addr, Password: "nope", MaxRetries: -1})
	defer wrong.Close()
	if err := wrong.Ping(ctx).Err(); err == nil || !strings.Contains(err.Error(), "invalid password") {
		t.Errorf("PING with a wrong password: %v", err)
	}

	// go-redis's default handshake with a password: HELLO 3 AUTH … fails,
	// it falls back to AUTH over RESP2.
	c := redis.NewClient(&redis.Options{Addr: addr, Password: "open sesame", MaxRetries: -1})
	defer c.Close()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("PING with the password: %v", err)
	}
	if err := c.Do(ctx, "ADDJOB", "q", strings.Repeat("x", 1024), 0).Err(); err != nil {
		t.Fatalf("ADDJOB of max-job-size: %v", err)
	}
	err := c.Do(ctx, "ADDJOB", "q", strings.Repeat("x", 1025), 0).Err()
	if err == nil || err.Error() != "ERR job body is larger than max-job-size (1024 bytes)" {
		t.Errorf("ADDJOB over max-job-size: %v", err)
	}
	if n, err := c.Do(ctx, "QLEN", "q").Int64(); err != nil || n != 1 {
		t.Errorf("QLEN = %d, %v", n, err)
	}

	if cli := testtool.Optional(t, "redis-cli"); cli != "" {
		_, port, _ := net.SplitHostPort(addr)
		out, err := exec.Command(cli, "-p", port, "-a", "open sesame", "--no-auth-warning", "qlen", "q").CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "1" {
			t.Errorf("redis-cli -a: %q, %v", out, err)
		}
	}

	// SHUTDOWN: go-redis takes the closed connection as success.
	if err := c.Shutdown(ctx).Err(); err != nil && !errors.Is(err, redis.ErrClosed) {
		t.Logf("SHUTDOWN: %v", err)
	}
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Fatal("server still running after SHUTDOWN")
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code after SHUTDOWN = %d, want 0", code)
	}
	if out := p.out.String(); !strings.Contains(out, "SHUTDOWN command") || !strings.Contains(out, "bye") {
		t.Errorf("log does not show a graceful SHUTDOWN:\n%s", out)
	}
}

// TestShutdownKeepsJobs: SHUTDOWN on a server without a password, then a
// restart on the same directory finds the job.
func TestShutdownKeepsJobs(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--maxclients", "5")
	c := s.client(t)
	addJob(t, c, "q", "kept")
	rc := s.raw(t)
	rc.send(resp("SHUTDOWN"))
	p := s.proc
	select {
	case <-p.exited:
	case <-time.After(stopTimeout):
		t.Fatal("server still running after SHUTDOWN")
	}
	s.proc = nil
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		t.Errorf("exit code after SHUTDOWN = %d, want 0", code)
	}
	s.Start()
	if n := doInt(t, s.client(t), "QLEN", "q"); n != 1 {
		t.Errorf("QLEN after SHUTDOWN and restart = %d, want 1", n)
	}
}

// TestSegmentSizeByMode: 64 MiB segments on disk, 4 MiB in memory (where a
// segment's regrowth copies it whole), and an explicit size wins; CONFIG
// GET reports the size in effect.
func TestSegmentSizeByMode(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{nil, 64 << 20},
		{[]string{"--appendonly", "no"}, 4 << 20},
		{[]string{"--appendonly", "no", "--aof-segment-size", "16mb"}, 16 << 20},
		{[]string{"--aof-segment-size", "8kb"}, 8 << 10},
	} {
		cfg, err := parseArgs(tc.args)
		if err != nil {
			t.Fatal(err)
		}
		if got := cfg.segmentSize(); got != tc.want {
			t.Errorf("%q: segment size %d, want %d", tc.args, got, tc.want)
		}
		if got := cfg.value("aof-segment-size"); got != strconv.FormatInt(tc.want, 10) {
			t.Errorf("%q: CONFIG GET aof-segment-size = %s", tc.args, got)
		}
	}
	if _, err := parseArgs([]string{"--aof-segment-size", "1kb"}); err == nil {
		t.Error("a 1 KiB segment size was accepted")
	}
}
