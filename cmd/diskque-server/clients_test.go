package main

// End-to-end tests through the clients Disque users have: go-redis with its
// default handshake, redis-cli, and raw TCP (inline commands, pipelining).

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/testtool"
	"github.com/redis/go-redis/v9"
)

// TestGoRedisDefaultClient: go-redis with its default options sends HELLO 3
// and CLIENT SETINFO on connect; both must be error replies and the client
// must then work over RESP2.
func TestGoRedisDefaultClient(t *testing.T) {
	t.Parallel()
	s := startServer(t)

	// What the handshake gets, on the wire.
	rc := s.raw(t)
	rc.send(resp("HELLO", "3") + resp("CLIENT", "SETINFO", "LIB-NAME", "go-redis(,go1.26)") +
		resp("CLIENT", "SETINFO", "LIB-VER", "9.23.0") + resp("PING"))
	for i, what := range []string{"HELLO 3", "CLIENT SETINFO LIB-NAME", "CLIENT SETINFO LIB-VER"} {
		if r := rc.read(); r.kind != '-' {
			t.Errorf("reply %d to %s = %v, want an error", i, what, r)
		}
	}
	if r := rc.read(); r.kind != '+' || r.str != "PONG" {
		t.Errorf("PING after the handshake = %v", r)
	}

	c := redis.NewClient(&redis.Options{Addr: s.addr})
	defer c.Close()
	ctx := context.Background()
	if got, err := c.Ping(ctx).Result(); err != nil || got != "PONG" {
		t.Fatalf("PING with a default go-redis client = %q, %v", got, err)
	}
	id, err := c.Do(ctx, "ADDJOB", "gr", "hello", 0).Text()
	if err != nil || !jobIDRe.MatchString(id) {
		t.Fatalf("ADDJOB = %q, %v", id, err)
	}
	v, err := c.Do(ctx, "GETJOB", "FROM", "gr").Result()
	if err != nil {
		t.Fatalf("GETJOB: %v", err)
	}
	if got := parseJobs(t, v); len(got) != 1 || got[0].ID != id || got[0].Body != "hello" {
		t.Errorf("GETJOB = %+v", got)
	}
	if n, err := c.Do(ctx, "ACKJOB", id).Int(); err != nil || n != 1 {
		t.Errorf("ACKJOB = %d, %v", n, err)
	}
	if _, err := c.Do(ctx, "GETJOB", "NOHANG", "FROM", "gr").Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("GETJOB NOHANG on an empty queue: %v, want redis.Nil", err)
	}
	if _, err := c.Do(ctx, "SHOW", id).Result(); !errors.Is(err, redis.Nil) {
		t.Errorf("SHOW of an acked job: %v, want redis.Nil", err)
	}
	if got, err := c.Info(ctx, "persistence").Result(); err != nil || !strings.Contains(got, "loading:0") {
		t.Errorf("INFO persistence = %q, %v", got, err)
	}
}

// TestRedisCLI drives the server with redis-cli, as a user would.
func TestRedisCLI(t *testing.T) {
	t.Parallel()
	cli := testtool.Require(t, "redis-cli") // skips, or fails under CI
	s := startServer(t)
	run := func(stdin string, args ...string) string {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, cli, append([]string{"-h", "127.0.0.1", "-p", strconv.Itoa(s.port)}, args...)...)
		if stdin != "" {
			cmd.Stdin = strings.NewReader(stdin)
		}
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Run(); err != nil && ctx.Err() != nil {
			t.Fatalf("redis-cli %v: %v\n%s", args, err, out.String())
		}
		return strings.TrimRight(out.String(), "\n")
	}
	if got := run("", "ping"); got != "PONG" {
		t.Errorf("redis-cli ping = %q", got)
	}
	id := run("", "addjob", "q", "body", "0")
	if !jobIDRe.MatchString(id) {
		t.Fatalf("redis-cli addjob = %q, want a job id", id)
	}
	if got := run("", "qlen", "q"); got != "1" {
		t.Errorf("redis-cli qlen q = %q, want 1", got)
	}
	if got := run("", "--no-raw", "qlen", "q"); got != "(integer) 1" {
		t.Errorf("redis-cli --no-raw qlen q = %q", got)
	}
	if got := run("", "getjob", "from", "q"); got != "q\n"+id+"\nbody" {
		t.Errorf("redis-cli getjob from q = %q", got)
	}
	if got := run("", "--no-raw", "getjob", "nohang", "from", "q"); got != "(nil)" {
		t.Errorf("redis-cli --no-raw getjob nohang = %q, want (nil)", got)
	}
	if got := run("", "ackjob", id); got != "1" {
		t.Errorf("redis-cli ackjob = %q", got)
	}
	if got := run("", "addjob", "q", "b", "0", "replicate", "2"); got != errNoReplText {
		t.Errorf("redis-cli addjob replicate 2 = %q", got)
	}
	if got := run("", "show", id); got != "" {
		t.Errorf("redis-cli show of an acked job = %q, want empty (null)", got)
	}
	me := run("", "cluster", "myid")
	if got := run("", "hello"); got != strings.Join([]string{"1", me, me, "127.0.0.1", strconv.Itoa(s.port), "1"}, "\n") {
		t.Errorf("redis-cli hello = %q", got)
	}
	if got := run("", "info", "persistence"); !strings.Contains(got, "loading:0") {
		t.Errorf("redis-cli info persistence = %q", got)
	}
	if got := run("", "bogus"); !strings.HasPrefix(got, unknownCmdStart+"bogus'") {
		t.Errorf("redis-cli bogus = %q", got)
	}
	// Commands on stdin, one per line.
	if got := run("ping\naddjob q2 x 0\nqlen q2\n"); !regexp.MustCompile(`^PONG\nD-[0-9a-f]{8}-[A-Za-z0-9+/]{24}-05a1\n1$`).MatchString(got) {
		t.Errorf("redis-cli with commands on stdin = %q", got)
	}
}

// TestRawProtocol: inline commands, several commands in one write answered
// in order, the null array of GETJOB and the null bulk of SHOW.
func TestRawProtocol(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	rc := s.raw(t)

	expect := func(what string, check func(r reply) bool) reply {
		t.Helper()
		r := rc.read()
		if !check(r) {
			t.Errorf("%s: got %v", what, r)
		}
		return r
	}
	isID := func(r reply) bool { return r.kind == '+' && jobIDRe.MatchString(r.str) }
	isStatus := func(s string) func(reply) bool {
		return func(r reply) bool { return r.kind == '+' && r.str == s }
	}
	isErr := func(s string) func(reply) bool {
		return func(r reply) bool { return r.kind == '-' && r.str == s }
	}
	isInt := func(n int64) func(reply) bool {
		return func(r reply) bool { return r.kind == ':' && r.n == n }
	}

	// Inline commands.
	rc.send("PING\r\n")
	expect("inline PING", isStatus("PONG"))
	rc.send("ping hello\r\n")
	expect("inline ping hello", func(r reply) bool { return r.kind == '$' && r.str == "hello" })
	rc.send("ADDJOB rawq inline 0\r\n")
	first := expect("inline ADDJOB", isID)

	// A pipeline: RESP and inline mixed, ADDJOB runs with an error inside.
	rc.send(resp("ADDJOB", "rawq", "a", "0") + resp("ADDJOB", "rawq", "b", "0") + "QLEN rawq\r\n" +
		resp("ADDJOB", "rawq", "c", "0", "TTL", "0") + resp("ADDJOB", "rawq", "c") + resp("addjob", "rawq", "d", "0") +
		resp("GETJOB", "NOHANG", "FROM", "empty") + resp("SHOW", unknownValidID) +
		resp("GETJOB", "COUNT", "10", "FROM", "rawq") + resp("bogus", "x") + "ping\r\n")
	a := expect("pipelined ADDJOB a", isID)
	b := expect("pipelined ADDJOB b", isID)
	expect("pipelined QLEN", isInt(3))
	expect("pipelined ADDJOB TTL 0", func(r reply) bool { return r.kind == '-' && strings.HasPrefix(r.str, "ERR ") })
	expect("pipelined ADDJOB arity", isErr(wrongArity("addjob")))
	d := expect("pipelined addjob d", isID)
	expect("GETJOB NOHANG on nothing: null array", func(r reply) bool { return r.kind == '*' && r.null })
	expect("SHOW unknown: null bulk", func(r reply) bool { return r.kind == '$' && r.null })
	jobs := expect("pipelined GETJOB COUNT 10", func(r reply) bool { return r.kind == '*' && len(r.arr) == 4 })
	wantIDs := []string{first.str, a.str, b.str, d.str}
	for i, j := range jobs.arr {
		if len(j.arr) != 3 || j.arr[0].str != "rawq" || j.arr[1].str != wantIDs[i] || j.arr[1].kind != '$' {
			t.Errorf("GETJOB job %d = %v, want [rawq %s body] in bulk strings", i, j, wantIDs[i])
		}
	}
	expect("pipelined bogus", func(r reply) bool { return r.kind == '-' && strings.HasPrefix(r.str, unknownCmdStart+"bogus'") })
	expect("pipelined inline ping", isStatus("PONG"))

	// MAXLEN counts the jobs added earlier in the same pipeline.
	rc.send(resp("ADDJOB", "mq", "1", "0", "MAXLEN", "2") + resp("ADDJOB", "mq", "2", "0", "MAXLEN", "2") +
		resp("ADDJOB", "mq", "3", "0", "MAXLEN", "2") + resp("QLEN", "mq"))
	expect("MAXLEN 2, first", isID)
	expect("MAXLEN 2, second", isID)
	expect("MAXLEN 2, third", isErr(errMaxLenText))
	expect("QLEN mq", isInt(2))

	// PAUSE between ADDJOBs takes effect in order.
	rc.send(resp("PAUSE", "pq", "in") + resp("ADDJOB", "pq", "x", "0") + resp("ADDJOB", "pq", "y", "0") +
		resp("PAUSE", "pq", "none") + resp("ADDJOB", "pq", "z", "0") + resp("QLEN", "pq"))
	expect("PAUSE in", isStatus("in"))
	expect("ADDJOB paused", isErr(errPausedText))
	expect("ADDJOB paused", isErr(errPausedText))
	expect("PAUSE none", isStatus("none"))
	expect("ADDJOB after PAUSE none", isID)
	expect("QLEN pq", isInt(1))

	// A blocking GETJOB inside a pipeline answers in order.
	rc.send(resp("QLEN", "empty") + resp("GETJOB", "TIMEOUT", "100", "FROM", "empty") + resp("PING"))
	expect("QLEN empty", isInt(0))
	expect("GETJOB TIMEOUT 100: null array", func(r reply) bool { return r.kind == '*' && r.null })
	expect("PING", isStatus("PONG"))

	// More ADDJOBs in one write than one batch holds.
	var sb strings.Builder
	const n = 600
	for i := range n {
		sb.WriteString(resp("ADDJOB", "big", strconv.Itoa(i), "0"))
	}
	sb.WriteString(resp("QLEN", "big"))
	rc.send(sb.String())
	var bigIDs []string
	for i := range n {
		bigIDs = append(bigIDs, expect(fmt.Sprint("ADDJOB big ", i), isID).str)
	}
	expect("QLEN big", isInt(n))
	rc.send(resp("QPEEK", "big", strconv.Itoa(n)))
	peek := rc.read()
	if len(peek.arr) != n {
		t.Fatalf("QPEEK big = %d jobs, want %d", len(peek.arr), n)
	}
	for i, j := range peek.arr {
		if j.arr[1].str != bigIDs[i] || j.arr[2].str != strconv.Itoa(i) {
			t.Fatalf("QPEEK big job %d = %v, want %s body %d: pipelined ADDJOBs out of order", i, j, bigIDs[i], i)
		}
	}

	// HELLO on the wire: port and priority are bulk strings.
	rc.send(resp("HELLO"))
	h := rc.read()
	if len(h.arr) != 3 || h.arr[0].kind != ':' || h.arr[0].n != 1 || h.arr[1].kind != '$' || len(h.arr[2].arr) != 4 {
		t.Fatalf("HELLO = %v", h)
	}
	for i, e := range h.arr[2].arr {
		if e.kind != '$' {
			t.Errorf("HELLO node field %d = %v, want a bulk string", i, e)
		}
	}

	// QUIT: +OK, then the connection closes and nothing after it runs.
	rc.send(resp("QUIT") + resp("ADDJOB", "afterquit", "x", "0"))
	expect("QUIT", isStatus("OK"))
	_ = rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if r, err := readReply(rc.r); err == nil {
		t.Errorf("after QUIT got %v, want the connection closed", r)
	}
	c := s.client(t)
	if n := doInt(t, c, "QLEN", "afterquit"); n != 0 {
		t.Errorf("a command pipelined after QUIT ran: QLEN %d", n)
	}
}

// TestBlockedClientDisconnect: a client that disconnects while blocked in
// GETJOB must stop waiting, so that the next job stays queued for a live
// consumer. Disque unblocks a client when it disconnects. Clients with a
// read timeout shorter than their GETJOB's (go-redis: 3 s by default) leave
// such connections behind all the time.
func TestBlockedClientDisconnect(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	rc := s.raw(t)
	rc.send(resp("GETJOB", "FROM", "dq"))
	waitBlocked(t, c, 1)
	rc.c.Close()
	gone := pollFor(3*time.Second, func() bool {
		inf := info(t, c, "clients")
		return inf["blocked_clients"] == "0" && inf["connected_clients"] == "1"
	})
	if !gone {
		inf := info(t, c, "clients")
		t.Errorf("3s after the blocked client disconnected: connected_clients %s blocked_clients %s, want 1 and 0",
			inf["connected_clients"], inf["blocked_clients"])
	}
	id := addJob(t, c, "dq", "for a live consumer", "RETRY", 0)
	if m := show(t, c, id); m["state"] != "queued" || doInt(t, c, "QLEN", "dq") != 1 {
		t.Errorf("ADDJOB after the blocked client left: state %v, QLEN %d; want queued, 1 "+
			"(the job went to the disconnected client: an at-most-once job is lost)", m["state"], doInt(t, c, "QLEN", "dq"))
	}
}
