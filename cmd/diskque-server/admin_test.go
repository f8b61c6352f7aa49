package main

// End-to-end tests of the queue and server commands: QLEN, QPEEK, PAUSE,
// PING, TIME, HELLO, CLUSTER, INFO, DEBUG, unknown commands, arity, case.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestQueueCommands(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)

	if n := doInt(t, c, "QLEN", "nope"); n != 0 {
		t.Errorf("QLEN of an unknown queue = %d", n)
	}
	var ids []string
	for i := range 5 {
		ids = append(ids, addJob(t, c, "pq", fmt.Sprint("b", i)))
	}
	peek := func(n any) []string {
		t.Helper()
		return bodies(parseJobs(t, do(t, c, "QPEEK", "pq", n)))
	}
	for _, tc := range []struct {
		n    any
		want []string
	}{
		{2, []string{"b0", "b1"}},
		{-2, []string{"b4", "b3"}},
		{10, []string{"b0", "b1", "b2", "b3", "b4"}},
		{-10, []string{"b4", "b3", "b2", "b1", "b0"}},
		{1, []string{"b0"}},
		{-1, []string{"b4"}},
	} {
		if got := peek(tc.n); !slices.Equal(got, tc.want) {
			t.Errorf("QPEEK pq %v = %v, want %v", tc.n, got, tc.want)
		}
	}
	if got := parseJobs(t, do(t, c, "QPEEK", "pq", 1)); len(got) != 1 || got[0].Queue != "pq" || got[0].ID != ids[0] {
		t.Errorf("QPEEK pq 1 = %+v, want [pq %s b0]", got, ids[0])
	}
	if got := doArr(t, c, "QPEEK", "nope", 5); len(got) != 0 {
		t.Errorf("QPEEK of an unknown queue = %v, want an empty array", got)
	}
	if got := doArr(t, c, "QPEEK", "pq", 0); len(got) != 0 {
		t.Errorf("QPEEK pq 0 = %d jobs, want an empty array", len(got))
	}
	wantErrPrefix(t, c, "ERR ", "QPEEK", "pq", "x")
	wantErr(t, c, wrongArity("qpeek"), "QPEEK", "pq")
	wantErr(t, c, wrongArity("qlen"), "QLEN")
	wantErr(t, c, wrongArity("qlen"), "QLEN", "a", "b")
	if n := doInt(t, c, "QLEN", "pq"); n != 5 {
		t.Errorf("QLEN after QPEEKs = %d, want 5 (QPEEK delivers nothing)", n)
	}
	// Peeking skips what is not queued.
	doInt(t, c, "DEQUEUE", ids[0])
	if got := peek(1); !slices.Equal(got, []string{"b1"}) {
		t.Errorf("QPEEK after DEQUEUE of the oldest = %v, want [b1]", got)
	}

	// PAUSE.
	pause := func(args ...any) string {
		t.Helper()
		return doStr(t, c, append([]any{"PAUSE", "pq"}, args...)...)
	}
	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"state"}, "none"},
		{[]any{"in"}, "in"},
		{[]any{"state"}, "in"},
		{[]any{"none"}, "none"},
		{[]any{"out"}, "out"},
		{[]any{"STATE"}, "out"},
		{[]any{"none"}, "none"},
		{[]any{"all"}, "all"},
		{[]any{"state"}, "all"},
		{[]any{"none"}, "none"},
		{[]any{"in", "out"}, "all"},
		{[]any{"None"}, "none"},
		{[]any{"bcast", "in"}, "in"},
		{[]any{"none", "bcast"}, "none"},
	} {
		if got := pause(tc.args...); got != tc.want {
			t.Errorf("PAUSE pq %v = %q, want %q", tc.args, got, tc.want)
		}
	}
	// Whatever in-then-out means, the reply is the state.
	pause("in")
	if got, st := pause("out"), pause("state"); got != st {
		t.Errorf("PAUSE pq out = %q but PAUSE pq state = %q", got, st)
	}
	pause("none")
	wantErr(t, c, errSyntaxText, "PAUSE", "pq", "sideways")
	wantErr(t, c, wrongArity("pause"), "PAUSE", "pq")
	if st := doStr(t, c, "PAUSE", "never-seen", "state"); st != "none" {
		t.Errorf("PAUSE of an unknown queue state = %q, want none", st)
	}

	// in: ADDJOB refused, GETJOB works. out: the reverse. all: both.
	pause("in")
	wantErr(t, c, errPausedText, "ADDJOB", "pq", "x", 0)
	if got := getJobs(t, c, "NOHANG", "FROM", "pq"); len(got) != 1 {
		t.Errorf("GETJOB from an in-paused queue = %v, want a job", got)
	}
	pause("out")
	addJob(t, c, "pq", "x")
	doNil(t, c, "GETJOB", "NOHANG", "FROM", "pq")
	pause("all")
	wantErr(t, c, errPausedText, "ADDJOB", "pq", "x", 0)
	doNil(t, c, "GETJOB", "NOHANG", "FROM", "pq")
	pause("none")
	addJob(t, c, "pq", "y")
	if got := getJobs(t, c, "NOHANG", "FROM", "pq"); len(got) != 1 {
		t.Errorf("GETJOB after PAUSE none = %v", got)
	}
}

func TestAdminCommands(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	me := myID(t, c)

	if got := doStr(t, c, "PING"); got != "PONG" {
		t.Errorf("PING = %q", got)
	}
	if got := doStr(t, c, "ping", "hello world"); got != "hello world" {
		t.Errorf("PING msg = %q", got)
	}
	wantErr(t, c, wrongArity("ping"), "PING", "a", "b")
	if tm := doArr(t, c, "TIME"); len(tm) != 2 {
		t.Errorf("TIME = %v", tm)
	} else if sec, _ := strconv.ParseInt(tm[0].(string), 10, 64); sec < time.Now().Unix()-5 || sec > time.Now().Unix()+5 {
		t.Errorf("TIME = %v, want now", tm)
	}

	// HELLO: [1, my-id, [id, ip, port, priority] per node], port and
	// priority bulk strings.
	h := doArr(t, c, "HELLO")
	if len(h) != 3 || h[0] != int64(1) || h[1] != me {
		t.Fatalf("HELLO = %#v, want [1, %s, one node]", h, me)
	}
	wantNode := []any{me, "127.0.0.1", strconv.Itoa(s.port), "1"}
	if n, ok := h[2].([]any); !ok || !slices.Equal(n, wantNode) {
		t.Errorf("HELLO node = %#v, want %#v", h[2], wantNode)
	}
	wantErrPrefix(t, c, "", "HELLO", 3)
	wantErrPrefix(t, c, "", "HELLO", "3", "AUTH", "default", "x")
	wantErrPrefix(t, c, "", "CLIENT", "SETINFO", "LIB-NAME", "go-redis")
	wantErrPrefix(t, c, "", "CLIENT", "SETINFO", "LIB-VER", "9.23.0")

	// CLUSTER.
	wantLine := fmt.Sprintf("%s 127.0.0.1:%d myself 0 0 connected", me, s.port)
	if got := strings.TrimRight(doStr(t, c, "CLUSTER", "NODES"), "\r\n"); got != wantLine {
		t.Errorf("CLUSTER NODES = %q, want %q", got, wantLine)
	}
	if got := doStr(t, c, "cluster", "myid"); got != me {
		t.Errorf("cluster myid = %q", got)
	}
	if ci := doStr(t, c, "CLUSTER", "INFO"); !strings.Contains(ci, "cluster_state:ok\r\n") || !strings.Contains(ci, "cluster_known_nodes:1\r\n") {
		t.Errorf("CLUSTER INFO = %q", ci)
	}
	wantErrPrefix(t, c, "ERR ", "CLUSTER", "BOGUS")
	wantErr(t, c, wrongArity("cluster"), "CLUSTER")

	// INFO: Disque's section order, key:value lines, no '#' in values.
	for i := range 3 {
		addJob(t, c, "iq", strconv.Itoa(i))
	}
	raw := doStr(t, c, "INFO")
	var sections []string
	for _, line := range strings.Split(raw, "\r\n") {
		switch {
		case strings.HasPrefix(line, "# "):
			sections = append(sections, strings.TrimPrefix(line, "# "))
		case line == "":
		case strings.Contains(line, "#"):
			t.Errorf("INFO line %q has a '#' inside a value", line)
		case !strings.Contains(line, ":"):
			t.Errorf("INFO line %q is not key:value", line)
		}
	}
	// Disque's sections in Disque's order, with diskque's own Storage and
	// Cluster before CPU, which stays last (see the disqueue-node check below).
	wantSections := []string{"Server", "Clients", "Memory", "Jobs", "Queues", "Persistence", "Stats", "Storage", "Cluster", "CPU"}
	if !slices.Equal(sections, wantSections) {
		t.Errorf("INFO sections = %v, want %v", sections, wantSections)
	}
	// disqueue-node splits on '#' and drops each section's last two lines:
	// like Disque, every section but the last ends with a blank line.
	chunks := strings.Split(raw, "#")[1:]
	for i, ch := range chunks {
		if i < len(chunks)-1 && !strings.HasSuffix(ch, "\r\n\r\n") {
			t.Errorf("INFO section %q does not end with a blank line", ch)
		}
	}
	if !strings.HasSuffix(raw, "\r\n") || strings.HasSuffix(raw, "\r\n\r\n") {
		t.Errorf("INFO should end with exactly one CRLF: %q", raw[max(len(raw)-20, 0):])
	}
	// What disqueue-node keeps: each piece after a '#', split into lines,
	// without its last two. Only used_cpu_user_children — the line it loses
	// with Disque too — may be missing; every Storage field must survive.
	kept := map[string]bool{}
	for _, ch := range chunks {
		lines := strings.Split(ch, "\r\n")
		for _, line := range lines[1:max(len(lines)-2, 1)] {
			k, _, _ := strings.Cut(line, ":")
			kept[k] = true
		}
	}
	for _, k := range []string{"used_cpu_sys", "used_cpu_user", "used_cpu_sys_children", "segments",
		"block_cache_hit_rate", "jobs_expired", "aof_rewrite_in_progress", "registered_queues"} {
		if !kept[k] {
			t.Errorf("disqueue-node's INFO parsing would lose %s", k)
		}
	}
	inf := info(t, c)
	for k, v := range map[string]string{"loading": "0", "registered_jobs": "3", "aof_enabled": "1", "jobs_unreadable": "0",
		"tcp_port": strconv.Itoa(s.port)} {
		if inf[k] != v {
			t.Errorf("INFO %s = %q, want %q", k, inf[k], v)
		}
	}
	if n, _ := strconv.Atoi(inf["registered_queues"]); n < 1 {
		t.Errorf("INFO registered_queues = %q", inf["registered_queues"])
	}
	if got := doStr(t, c, "INFO", "jobs"); !strings.HasPrefix(got, "# Jobs\r\nregistered_jobs:3\r\n") || strings.Count(got, "#") != 1 {
		t.Errorf("INFO jobs = %q, want only the Jobs section", got)
	}
	if got := info(t, c, "Persistence"); got["loading"] != "0" || got["aof_enabled"] != "1" || got["aof_fsync"] != "everysec" {
		t.Errorf("INFO persistence = %v", got)
	}

	// DEBUG FLUSHALL: every job gone, every pause lifted.
	addJob(t, c, "iq2", "x", "DELAY", 50)
	doStr(t, c, "PAUSE", "iq2", "all")
	if got := doStr(t, c, "DEBUG", "FLUSHALL"); got != "OK" {
		t.Errorf("DEBUG FLUSHALL = %q", got)
	}
	if inf := info(t, c, "jobs"); inf["registered_jobs"] != "0" {
		t.Errorf("registered_jobs after FLUSHALL = %s", inf["registered_jobs"])
	}
	if n := doInt(t, c, "QLEN", "iq"); n != 0 {
		t.Errorf("QLEN after FLUSHALL = %d", n)
	}
	if st := doStr(t, c, "PAUSE", "iq2", "state"); st != "none" {
		t.Errorf("pause after FLUSHALL = %q", st)
	}
	wantErrPrefix(t, c, "ERR ", "DEBUG", "BOGUS")
	addJob(t, c, "iq", "after-flush")

	// Unknown commands and wrong arity, Redis's texts.
	if got := doErr(t, c, "FOOBAR", "a", "b"); !strings.HasPrefix(got, unknownCmdStart+"FOOBAR'") {
		t.Errorf("FOOBAR = -%s, want -%sFOOBAR'…", got, unknownCmdStart)
	}
	for _, args := range [][]any{{"QLEN"}, {"QlEn", "a", "b"}, {"SHOW"}, {"WORKING"}, {"QPEEK", "q"},
		{"ADDJOB", "q", "b"}, {"GETJOB", "FROM"}, {"PAUSE", "q"}, {"ACKJOB"}, {"NACK"}, {"DEQUEUE"},
		{"ENQUEUE"}, {"FASTACK"}, {"DELJOB"}, {"QUIT", "now"}, {"TIME", "x"}, {"DEBUG"}} {
		wantErr(t, c, wrongArity(strings.ToLower(args[0].(string))), args...)
	}

	// Commands and options in any case.
	for _, name := range []string{"addjob", "ADDJOB", "AdDjOb"} {
		doStr(t, c, name, "cq", name, 0, "ttl", 100, "Retry", 3, "DELAY", 0)
	}
	if n := doInt(t, c, "qLEN", "cq"); n != 3 {
		t.Errorf("QLEN cq = %d, want 3", n)
	}
	got := getJobs(t, c, "nohang", "CoUnT", 5, "withCOUNTERS", "fRoM", "cq")
	if !slices.Equal(bodies(got), []string{"addjob", "ADDJOB", "AdDjOb"}) || !got[0].Counters {
		t.Errorf("getjob in mixed case = %+v", got)
	}
	if n := doInt(t, c, "AckJob", got[0].ID, got[1].ID, got[2].ID); n != 3 {
		t.Errorf("AckJob = %d", n)
	}

	// redis-cli asks COMMAND DOCS on start: any reply but a hang.
	if _, err := c.Do(context.Background(), "COMMAND", "DOCS").Result(); err != nil {
		var rerr redis.Error
		if !errors.As(err, &rerr) {
			t.Errorf("COMMAND DOCS: %v", err)
		}
	}
	if got := doStr(t, c, "PING"); got != "PONG" {
		t.Errorf("PING after errors = %q", got)
	}
}

// TestHelloWildcardBind: HELLO tells clients where to connect (thunk-disque
// routes job ids with it), so it must not advertise the unspecified address
// when the server listens on all interfaces.
func TestHelloWildcardBind(t *testing.T) {
	t.Parallel()
	s := startServer(t, "--bind", "0.0.0.0")
	c := s.client(t)
	h := doArr(t, c, "HELLO")
	node, _ := h[2].([]any)
	if len(node) != 4 {
		t.Fatalf("HELLO = %#v", h)
	}
	if ip := net.ParseIP(node[1].(string)); ip == nil || ip.IsUnspecified() {
		t.Errorf("HELLO advertises ip %q: not an address a client can connect to", node[1])
	}
	if nodes := doStr(t, c, "CLUSTER", "NODES"); strings.Contains(nodes, " :::") || strings.Contains(nodes, " 0.0.0.0:") {
		t.Errorf("CLUSTER NODES = %q: advertises the unspecified address", nodes)
	}
}

// pollFor polls cond until it holds or timeout passes.
