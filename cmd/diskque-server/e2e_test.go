package main

// End-to-end tests of the built binary against COMPATIBILITY.md, the job
// commands: ADDJOB, GETJOB, ACKJOB, FASTACK, DELJOB, ENQUEUE, DEQUEUE, NACK,
// WORKING, SHOW, TTL expiry. The harness is in helpers_test.go.

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

func TestAddJobIDAndOptions(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	me := myID(t, c)

	// The id: D-<node 8 hex>-<24 base64>-<TTL minutes, lowest bit = RETRY>0>.
	for _, tc := range []struct {
		opts      []any
		suffix    string
		ttl       int64 // seconds
		retry     int64
		wantDelay int64
	}{
		{nil, "05a1", 86400, 300, 0}, // 1440 min = 0x5a0; default RETRY 300 sets the bit
		{[]any{"RETRY", 0}, "05a0", 86400, 0, 0},
		{[]any{"TTL", 3600}, "003d", 3600, 300, 0},
		{[]any{"TTL", 3600, "RETRY", 0}, "003c", 3600, 0, 0},
		{[]any{"TTL", 180}, "0003", 180, 18, 0},                    // RETRY TTL/10
		{[]any{"ttl", 180, "retry", 0}, "0002", 180, 0, 0},         // odd minutes, bit cleared
		{[]any{"TTL", 59}, "0001", 59, 5, 0},                       // 0 minutes, bit set
		{[]any{"TTL", 5}, "0001", 5, 1, 0},                         // RETRY at least 1
		{[]any{"TTL", 59, "RETRY", 0}, "0000", 59, 0, 0},           // 0 minutes
		{[]any{"TTL", 4000000, "RETRY", 1}, "ffff", 4000000, 1, 0}, // 66666 min capped at 65535
		{[]any{"TTL", 4000000, "RETRY", 0}, "fffe", 4000000, 0, 0},
		{[]any{"TTL", 7200, "RETRY", 9, "DELAY", 2}, "0079", 7200, 9, 2},
		{[]any{"REPLICATE", 1, "RETRY", 0}, "05a0", 86400, 0, 0},
		{[]any{"ASYNC"}, "05a1", 86400, 300, 0},
		{[]any{"MaxLen", 1000, "Async", "Replicate", 1}, "05a1", 86400, 300, 0},
	} {
		id := addJob(t, c, "ids", "x", tc.opts...)
		if id[2:10] != me[:8] {
			t.Errorf("ADDJOB %v = %s: chars 2..9 %q, want the node id's first 8 %q", tc.opts, id, id[2:10], me[:8])
		}
		if !strings.HasSuffix(id, "-"+tc.suffix) {
			t.Errorf("ADDJOB %v = %s, want TTL/RETRY digits %s", tc.opts, id, tc.suffix)
		}
		m := show(t, c, id)
		if ttl := m["ttl"].(int64); ttl > tc.ttl || ttl < tc.ttl-5 {
			t.Errorf("ADDJOB %v: SHOW ttl = %d, want about %d", tc.opts, ttl, tc.ttl)
		}
		if m["retry"] != tc.retry || m["delay"] != tc.wantDelay || m["repl"] != int64(1) {
			t.Errorf("ADDJOB %v: SHOW retry, delay, repl = %v, %v, %v; want %d, %d, 1",
				tc.opts, m["retry"], m["delay"], m["repl"], tc.retry, tc.wantDelay)
		}
	}

	// REPLICATE beyond the lone node: -NOREPL, nothing added.
	before := doInt(t, c, "QLEN", "ids")
	wantErr(t, c, errNoReplText, "ADDJOB", "ids", "x", 0, "REPLICATE", 2)
	wantErr(t, c, errNoReplText, "ADDJOB", "ids", "x", 0, "REPLICATE", 3, "ASYNC")
	wantErr(t, c, errNoReplText, "ADDJOB", "ids", "x", 100, "REPLICATE", 65535)
	if n := doInt(t, c, "QLEN", "ids"); n != before {
		t.Errorf("QLEN after refused ADDJOBs = %d, want %d", n, before)
	}

	// DELAY: active, not queued, awake within DELAY; ENQUEUE runs it now.
	d := addJob(t, c, "delayed", "later", "DELAY", 30)
	m := show(t, c, d)
	if m["state"] != "active" || m["delay"] != int64(30) {
		t.Errorf("delayed job: state %v delay %v, want active 30", m["state"], m["delay"])
	}
	if w, ok := m["next-awake-within"].(int64); !ok || w <= 25000 || w > 30000 {
		t.Errorf("delayed job next-awake-within = %#v, want about 30000 ms", m["next-awake-within"])
	}
	if n := doInt(t, c, "QLEN", "delayed"); n != 0 {
		t.Errorf("QLEN of a queue with only a delayed job = %d, want 0", n)
	}
	if got := getJobs(t, c, "NOHANG", "FROM", "delayed"); got != nil {
		t.Errorf("GETJOB delivered a delayed job: %v", got)
	}

	// RETRY: next requeue about RETRY seconds away (± 500 ms).
	r := addJob(t, c, "retry", "x", "RETRY", 7)
	if w, ok := show(t, c, r)["next-requeue-within"].(int64); !ok || w < 5500 || w > 7500 {
		t.Errorf("RETRY 7 next-requeue-within = %#v, want 6500..7500 ms", w)
	}

	// MAXLEN: refused once the queue has that many jobs.
	addJob(t, c, "ml", "1")
	addJob(t, c, "ml", "2")
	wantErr(t, c, errMaxLenText, "ADDJOB", "ml", "3", 0, "MAXLEN", 2)
	wantErr(t, c, errMaxLenText, "ADDJOB", "ml", "3", 0, "MAXLEN", 1)
	addJob(t, c, "ml", "3", "MAXLEN", 3)
	if n := doInt(t, c, "QLEN", "ml"); n != 3 {
		t.Errorf("QLEN ml = %d, want 3", n)
	}

	// Bodies are binary safe, empty included.
	for _, body := range []string{"", "a\r\nb\x00c\n", strings.Repeat("z", 100000)} {
		id := addJob(t, c, "bodies", body)
		got := getJobs(t, c, "NOHANG", "FROM", "bodies")
		if len(got) != 1 || got[0].ID != id || got[0].Body != body {
			t.Errorf("body of %d bytes: got %d jobs, body %q…", len(body), len(got), trunc(got))
		}
	}
}

func trunc(jobs []job) string {
	if len(jobs) == 0 {
		return ""
	}
	b := jobs[0].Body
	if len(b) > 20 {
		b = b[:20]
	}
	return b
}

func TestAddJobErrors(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	for _, tc := range []struct {
		args   []any
		exact  string // the whole error text, if SPEC gives it
		prefix string // else the start of it
	}{
		{args: []any{"q", "b"}, exact: wrongArity("addjob")},
		{args: []any{"q"}, exact: wrongArity("addjob")},
		{args: []any{"q", "b", "x"}, prefix: "ERR "},
		{args: []any{"q", "b", -1}, prefix: "ERR "},
		{args: []any{"q", "b", "1.5"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "REPLICATE", "x"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "REPLICATE", 0}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "REPLICATE", -1}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "REPLICATE", 65536}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "TTL", 0}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "TTL", -5}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "TTL", "ten"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "TTL", "+10"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "TTL", "99999999999999999999999"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "RETRY", -1}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "RETRY", "1s"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "DELAY", -1}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "DELAY", "soon"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "MAXLEN", 0}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "MAXLEN", -3}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "MAXLEN", "many"}, prefix: "ERR "},
		{args: []any{"q", "b", 0, "FOO", 1}, exact: errSyntaxText},
		{args: []any{"q", "b", 0, "FOO"}, exact: errSyntaxText},
		{args: []any{"q", "b", 0, "TTL"}, exact: errSyntaxText},
		{args: []any{"q", "b", 0, "TTL", 10, "NOHANG"}, exact: errSyntaxText},
		{args: []any{"q", "b", 0, "RETRY", 0, "REPLICATE", 2}, exact: errRetryText},
		{args: []any{"q", "b", 0, "REPLICATE", 2, "RETRY", 0}, exact: errRetryText},
		{args: []any{"q", "b", 0, "DELAY", 10, "TTL", 10}, exact: errDelayText},
		{args: []any{"q", "b", 0, "TTL", 10, "DELAY", 11}, exact: errDelayText},
		{args: []any{"q", "b", 0, "DELAY", 86400}, exact: errDelayText}, // default TTL
		{args: []any{"q", "b", 0, "REPLICATE", 2}, exact: errNoReplText},
	} {
		got := doErr(t, c, append([]any{"ADDJOB"}, tc.args...)...)
		switch {
		case tc.exact != "" && got != tc.exact:
			t.Errorf("ADDJOB %v = -%s\nwant -%s", tc.args, got, tc.exact)
		case tc.prefix != "" && !strings.HasPrefix(got, tc.prefix):
			t.Errorf("ADDJOB %v = -%s, want -%s…", tc.args, got, tc.prefix)
		}
	}
	if n := doInt(t, c, "QLEN", "q"); n != 0 {
		t.Errorf("QLEN q after refused ADDJOBs = %d, want 0", n)
	}
	if n := info(t, c, "jobs")["registered_jobs"]; n != "0" {
		t.Errorf("registered_jobs after refused ADDJOBs = %s, want 0", n)
	}

	// On a lone node REPLICATE defaults to 1, so RETRY 0 alone is fine.
	id := addJob(t, c, "q", "b", "RETRY", 0)
	if !strings.HasSuffix(id, "05a0") {
		t.Errorf("RETRY 0 id %s: want at-most-once digits 05a0", id)
	}

	// A queue paused for input refuses ADDJOB.
	if st := doStr(t, c, "PAUSE", "q", "in"); st != "in" {
		t.Fatalf("PAUSE q in = %q", st)
	}
	wantErr(t, c, errPausedText, "ADDJOB", "q", "b", 0)
	wantErr(t, c, errPausedText, "ADDJOB", "q", "b", 0, "DELAY", 5)
	doStr(t, c, "PAUSE", "q", "none")
	addJob(t, c, "q", "b")
	if n := doInt(t, c, "QLEN", "q"); n != 2 {
		t.Errorf("QLEN q = %d, want 2", n)
	}
}

func TestGetJob(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)

	doNil(t, c, "GETJOB", "NOHANG", "FROM", "empty")
	doNil(t, c, "getjob", "nohang", "from", "empty", "empty2")
	start := time.Now()
	doNil(t, c, "GETJOB", "TIMEOUT", 300, "FROM", "empty")
	if el := time.Since(start); el < 250*time.Millisecond || el > 10*time.Second {
		t.Errorf("GETJOB TIMEOUT 300 returned after %v", el)
	}

	// Round robin, one job per queue per pass, left to right.
	a1 := addJob(t, c, "qa", "a1")
	a2 := addJob(t, c, "qa", "a2")
	a3 := addJob(t, c, "qa", "a3")
	b1 := addJob(t, c, "qb", "b1")
	got := getJobs(t, c, "COUNT", 10, "NOHANG", "FROM", "qa", "qb", "qc")
	want := []job{{"qa", a1, "a1", 0, 0, false}, {"qb", b1, "b1", 0, 0, false},
		{"qa", a2, "a2", 0, 0, false}, {"qa", a3, "a3", 0, 0, false}}
	if !slices.Equal(got, want) {
		t.Errorf("GETJOB COUNT 10 FROM qa qb qc =\n%v\nwant\n%v", got, want)
	}
	for _, id := range []string{a1, a2, a3, b1} {
		if st := show(t, c, id)["state"]; st != "active" {
			t.Errorf("delivered job state = %v, want active", st)
		}
	}

	// COUNT defaults to 1; COUNT caps the reply.
	for i := range 5 {
		addJob(t, c, "qd", strconv.Itoa(i))
	}
	if got := getJobs(t, c, "FROM", "qd"); !slices.Equal(bodies(got), []string{"0"}) {
		t.Errorf("GETJOB FROM qd = %v, want one job, body 0", bodies(got))
	}
	if got := getJobs(t, c, "count", 3, "FROM", "qd"); !slices.Equal(bodies(got), []string{"1", "2", "3"}) {
		t.Errorf("GETJOB COUNT 3 = %v, want 1 2 3", bodies(got))
	}

	// WITHCOUNTERS: 7 elements, nacks at 4, additional-deliveries at 6.
	w := addJob(t, c, "qw", "w", "RETRY", 1)
	v := doArr(t, c, "GETJOB", "WITHCOUNTERS", "FROM", "qw")
	if len(v) != 1 || len(v[0].([]any)) != 7 {
		t.Fatalf("GETJOB WITHCOUNTERS = %#v, want one 7-element job", v)
	}
	if e := v[0].([]any); e[0] != "qw" || e[1] != w || e[2] != "w" || e[3] != "nacks" || e[4] != int64(0) ||
		e[5] != "additional-deliveries" || e[6] != int64(0) {
		t.Errorf("GETJOB WITHCOUNTERS = %#v", e)
	}
	if n := doInt(t, c, "NACK", w); n != 1 {
		t.Fatalf("NACK = %d", n)
	}
	getJobs(t, c, "FROM", "qw")
	doInt(t, c, "NACK", w)
	got = getJobs(t, c, "WITHCOUNTERS", "FROM", "qw")
	if len(got) != 1 || got[0].Nacks != 2 || got[0].AdditionalDeliveries != 0 {
		t.Errorf("after two NACKs: %+v, want nacks 2, additional-deliveries 0", got)
	}
	// Not acked within RETRY 1: requeued, additional-deliveries 1, and
	// ahead of a newer job (a requeued job keeps its ctime).
	newer := addJob(t, c, "qw", "newer")
	waitUntil(t, 10*time.Second, "requeue after RETRY 1", func() bool { return doInt(t, c, "QLEN", "qw") == 2 })
	got = getJobs(t, c, "WithCounters", "COUNT", 2, "NOHANG", "FROM", "qw")
	if len(got) != 2 || got[0].ID != w || got[0].Nacks != 2 || got[0].AdditionalDeliveries != 1 || got[1].ID != newer {
		t.Errorf("after a requeue: %+v, want %s first with nacks 2, additional-deliveries 1, then %s", got, w, newer)
	}

	// A delivered RETRY 0 job is never queued again.
	amo := addJob(t, c, "qamo", "once", "RETRY", 0)
	getJobs(t, c, "FROM", "qamo")
	if m := show(t, c, amo); m["state"] != "active" || m["next-requeue-within"] != nil {
		t.Errorf("delivered RETRY 0 job: state %v next-requeue-within %#v, want active and null",
			m["state"], m["next-requeue-within"])
	}

	// Errors.
	wantErrPrefix(t, c, "ERR ", "GETJOB", "COUNT", 0, "FROM", "q")
	wantErrPrefix(t, c, "ERR ", "GETJOB", "COUNT", -1, "FROM", "q")
	wantErrPrefix(t, c, "ERR ", "GETJOB", "COUNT", "x", "FROM", "q")
	wantErrPrefix(t, c, "ERR ", "GETJOB", "TIMEOUT", -1, "FROM", "q")
	wantErrPrefix(t, c, "ERR ", "GETJOB", "TIMEOUT", "x", "FROM", "q")
	wantErr(t, c, errSyntaxText, "GETJOB", "NOHANG", "q")
	wantErr(t, c, errSyntaxText, "GETJOB", "COUNT", 1)
	wantErr(t, c, errSyntaxText, "GETJOB", "NOHANG", "FROM")
	wantErr(t, c, errSyntaxText, "GETJOB", "BOGUS", "FROM", "q")
	wantErr(t, c, errSyntaxText, "GETJOB", "NOHANG", "COUNT")
	wantErr(t, c, wrongArity("getjob"), "GETJOB", "FROM")
	wantErr(t, c, wrongArity("getjob"), "GETJOB")
}

func TestGetJobBlocking(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	other := s.client(t)

	// A blocked GETJOB is served by a later ADDJOB from another client.
	type result struct {
		jobs []job
		err  error
	}
	block := func(args ...any) chan result {
		ch := make(chan result, 1)
		go func() {
			v, err := c.Do(context.Background(), append([]any{"GETJOB"}, args...)...).Result()
			if err != nil {
				ch <- result{err: err}
				return
			}
			arr, _ := v.([]any)
			var jobs []job
			for _, e := range arr {
				f := e.([]any)
				jobs = append(jobs, job{Queue: f[0].(string), ID: f[1].(string), Body: f[2].(string)})
			}
			ch <- result{jobs: jobs}
		}()
		return ch
	}
	ch := block("TIMEOUT", 20000, "COUNT", 5, "FROM", "bq1", "bq2")
	waitBlocked(t, other, 1)
	id := addJob(t, other, "bq2", "wake")
	r := <-ch
	if r.err != nil || len(r.jobs) != 1 || r.jobs[0] != (job{Queue: "bq2", ID: id, Body: "wake"}) {
		t.Errorf("blocked GETJOB = %+v, %v; want the one job added later", r.jobs, r.err)
	}
	waitBlocked(t, other, 0)
	if n := doInt(t, other, "QLEN", "bq2"); n != 0 {
		t.Errorf("QLEN after serving a blocked client = %d, want 0", n)
	}

	// Without TIMEOUT a client blocks until a job comes.
	ch = block("FROM", "bq3")
	waitBlocked(t, other, 1)
	id = addJob(t, other, "bq3", "forever")
	if r := <-ch; r.err != nil || len(r.jobs) != 1 || r.jobs[0].ID != id {
		t.Errorf("GETJOB without TIMEOUT = %+v, %v", r.jobs, r.err)
	}

	// Two clients blocked on one queue: the oldest is served first, one job
	// each.
	second := s.client(t)
	ch2 := make(chan string, 1)
	ch = block("TIMEOUT", 20000, "FROM", "bq4")
	waitBlocked(t, other, 1)
	go func() {
		v, err := second.Do(context.Background(), "GETJOB", "TIMEOUT", 20000, "FROM", "bq4").Result()
		if err != nil {
			ch2 <- err.Error()
			return
		}
		ch2 <- v.([]any)[0].([]any)[2].(string)
	}()
	waitBlocked(t, other, 2)
	addJob(t, other, "bq4", "first")
	if r := <-ch; r.err != nil || len(r.jobs) != 1 || r.jobs[0].Body != "first" {
		t.Errorf("the first blocked client got %+v, %v; want the job first", r.jobs, r.err)
	}
	waitBlocked(t, other, 1)
	addJob(t, other, "bq4", "second")
	if got := <-ch2; got != "second" {
		t.Errorf("the second blocked client got %q, want the job second", got)
	}

	// A queue paused for output is skipped; lifting the pause serves the
	// blocked client.
	p := addJob(t, other, "pq", "paused")
	if st := doStr(t, other, "PAUSE", "pq", "out"); st != "out" {
		t.Fatalf("PAUSE pq out = %q", st)
	}
	doNil(t, other, "GETJOB", "NOHANG", "FROM", "pq")
	ch = block("TIMEOUT", 20000, "FROM", "pq")
	waitBlocked(t, other, 1)
	addJob(t, other, "pq", "paused2") // ADDJOB still works, still not delivered
	if n := doInt(t, other, "QLEN", "pq"); n != 2 {
		t.Errorf("QLEN of an out-paused queue = %d, want 2", n)
	}
	doStr(t, other, "PAUSE", "pq", "none")
	if r := <-ch; r.err != nil || len(r.jobs) != 1 || r.jobs[0].ID != p {
		t.Errorf("GETJOB after PAUSE none = %+v, %v; want the oldest job %s", r.jobs, r.err, p)
	}
}

func TestJobCommands(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	var ids []string
	for i := range 6 {
		ids = append(ids, addJob(t, c, "q", fmt.Sprint("j", i)))
	}

	// ACKJOB: known jobs newly acked.
	if n := doInt(t, c, "ACKJOB", ids[0], ids[1], unknownValidID); n != 2 {
		t.Errorf("ACKJOB two known + one unknown = %d, want 2", n)
	}
	if n := doInt(t, c, "ACKJOB", ids[0]); n != 0 {
		t.Errorf("ACKJOB again = %d, want 0", n)
	}
	if m := show(t, c, ids[0]); m != nil {
		t.Errorf("SHOW of an acked job on a lone node = %v, want null", m)
	}
	// FASTACK, DELJOB: jobs deleted; the same id twice counts once.
	if n := doInt(t, c, "FASTACK", ids[2], ids[2], garbageValidID); n != 1 {
		t.Errorf("FASTACK = %d, want 1", n)
	}
	if n := doInt(t, c, "DELJOB", ids[3], unknownValidID); n != 1 {
		t.Errorf("DELJOB = %d, want 1", n)
	}
	if n := doInt(t, c, "QLEN", "q"); n != 2 {
		t.Errorf("QLEN = %d, want 2", n)
	}
	// DEQUEUE: queued → active.
	if n := doInt(t, c, "DEQUEUE", ids[4]); n != 1 {
		t.Errorf("DEQUEUE = %d, want 1", n)
	}
	if st := show(t, c, ids[4])["state"]; st != "active" {
		t.Errorf("dequeued job state = %v, want active", st)
	}
	if n := doInt(t, c, "DEQUEUE", ids[4]); n != 0 {
		t.Errorf("DEQUEUE of an active job = %d, want 0", n)
	}
	if n := doInt(t, c, "QLEN", "q"); n != 1 {
		t.Errorf("QLEN after DEQUEUE = %d, want 1", n)
	}
	// ENQUEUE: active → queued, no counter.
	if n := doInt(t, c, "ENQUEUE", ids[4], ids[5]); n != 1 {
		t.Errorf("ENQUEUE one active + one queued = %d, want 1", n)
	}
	if m := show(t, c, ids[4]); m["state"] != "queued" || m["nacks"] != int64(0) {
		t.Errorf("enqueued job: state %v nacks %v, want queued 0", m["state"], m["nacks"])
	}
	// NACK: only delivered (active) jobs, nacks + 1; the ctime keeps the
	// job at the front.
	if n := doInt(t, c, "NACK", ids[4]); n != 0 {
		t.Errorf("NACK of a queued job = %d, want 0", n)
	}
	if got := getJobs(t, c, "FROM", "q"); len(got) != 1 || got[0].ID != ids[4] {
		t.Fatalf("GETJOB = %v, want %s", got, ids[4])
	}
	if n := doInt(t, c, "NACK", ids[4], unknownValidID); n != 1 {
		t.Errorf("NACK = %d, want 1", n)
	}
	if m := show(t, c, ids[4]); m["state"] != "queued" || m["nacks"] != int64(1) {
		t.Errorf("nacked job: state %v nacks %v, want queued 1", m["state"], m["nacks"])
	}
	if got := getJobs(t, c, "FROM", "q"); len(got) != 1 || got[0].ID != ids[4] {
		t.Fatalf("GETJOB after NACK = %v, want %s first again", got, ids[4])
	}
	if n := doInt(t, c, "ENQUEUE", ids[4]); n != 1 {
		t.Errorf("ENQUEUE of a delivered job = %d, want 1", n)
	}
	if m := show(t, c, ids[4]); m["state"] != "queued" || m["nacks"] != int64(1) {
		t.Errorf("re-enqueued job: state %v nacks %v, want queued 1", m["state"], m["nacks"])
	}
	// ENQUEUE runs a delayed job now.
	d := addJob(t, c, "dq", "d", "DELAY", 100)
	if n := doInt(t, c, "ENQUEUE", d); n != 1 {
		t.Errorf("ENQUEUE of a delayed job = %d, want 1", n)
	}
	if n := doInt(t, c, "QLEN", "dq"); n != 1 {
		t.Errorf("QLEN after ENQUEUE of a delayed job = %d, want 1", n)
	}
	// ENQUEUE into a queue paused for input does nothing.
	getJobs(t, c, "FROM", "dq")
	doStr(t, c, "PAUSE", "dq", "in")
	if n := doInt(t, c, "ENQUEUE", d); n != 0 {
		t.Errorf("ENQUEUE into an in-paused queue = %d, want 0", n)
	}
	doStr(t, c, "PAUSE", "dq", "none")

	// NACK … DELAY sec: requeued after sec seconds.
	nd := addJob(t, c, "nd", "backoff")
	getJobs(t, c, "FROM", "nd")
	nacked := time.Now()
	if n := doInt(t, c, "NACK", nd, "DELAY", 1); n != 1 {
		t.Fatalf("NACK DELAY 1 = %d, want 1", n)
	}
	m := show(t, c, nd)
	if m["state"] != "active" || m["nacks"] != int64(1) {
		t.Errorf("NACK DELAY: state %v nacks %v, want active 1", m["state"], m["nacks"])
	}
	if w, ok := m["next-awake-within"].(int64); !ok || w <= 0 || w > 1000 {
		t.Errorf("NACK DELAY 1: next-awake-within = %#v, want 0..1000", m["next-awake-within"])
	}
	at := waitUntil(t, 10*time.Second, "NACK DELAY 1 to requeue", func() bool { return doInt(t, c, "QLEN", "nd") == 1 })
	if el := at.Sub(nacked); el < 900*time.Millisecond {
		t.Errorf("NACK DELAY 1 requeued after %v, want about 1s", el)
	}
	getJobs(t, c, "FROM", "nd")
	if n := doInt(t, c, "nack", nd, "delay", 0); n != 1 {
		t.Errorf("NACK DELAY 0 = %d, want 1", n)
	}
	if n := doInt(t, c, "QLEN", "nd"); n != 1 {
		t.Errorf("NACK DELAY 0 must requeue at once: QLEN %d", n)
	}
	wantErr(t, c, wrongArity("nack"), "NACK", "DELAY", 5)
	wantErrPrefix(t, c, "ERR ", "NACK", nd, "DELAY", -1)
	wantErrPrefix(t, c, "ERR ", "NACK", nd, "DELAY", "x")
	for _, cmd := range []string{"ackjob", "fastack", "deljob", "enqueue", "dequeue", "nack"} {
		wantErr(t, c, wrongArity(cmd), strings.ToUpper(cmd))
	}
}

// TestBadID: any malformed id fails the whole command with -BADID and the
// command does nothing to the valid ids beside it.
func TestBadID(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	queued := addJob(t, c, "q", "queued")
	active := addJob(t, c, "a", "active")
	getJobs(t, c, "FROM", "a")

	good := unknownValidID
	bad := []string{
		"D-1",
		"",
		good + "0",                  // 41 chars
		good[:39],                   // 39 chars
		"X" + good[1:],              // not D-
		"d" + good[1:],              // lower-case d
		"D_" + good[2:],             // not D-
		good[:10] + "x" + good[11:], // no '-' at 10
		good[:35] + "x" + good[36:], // no '-' at 35
		strings.Repeat("D", 40),     //
		"D-12345678-ABCDEFGHIJKLMNOPQRSTUVWX-0001 ", // trailing space: 41
	}
	for _, b := range bad {
		for _, cmd := range []string{"ACKJOB", "FASTACK", "DELJOB", "DEQUEUE"} {
			wantErr(t, c, errBadIDText, cmd, queued, b)
			wantErr(t, c, errBadIDText, cmd, b, queued)
		}
		for _, cmd := range []string{"ENQUEUE", "NACK"} {
			wantErr(t, c, errBadIDText, cmd, active, b)
			wantErr(t, c, errBadIDText, cmd, b, active)
		}
		wantErr(t, c, errBadIDText, "NACK", active, b, "DELAY", 1)
		wantErr(t, c, errBadIDText, "WORKING", b)
		wantErr(t, c, errBadIDText, "SHOW", b)
	}
	if m := show(t, c, queued); m["state"] != "queued" {
		t.Errorf("queued job after BADID commands: %v", m)
	}
	if m := show(t, c, active); m["state"] != "active" || m["nacks"] != int64(0) {
		t.Errorf("active job after BADID commands: state %v nacks %v", m["state"], m["nacks"])
	}
	if n := doInt(t, c, "QLEN", "q"); n != 1 {
		t.Errorf("QLEN q = %d, want 1", n)
	}
	if n := doInt(t, c, "QLEN", "a"); n != 0 {
		t.Errorf("QLEN a = %d, want 0", n)
	}
	// Only the shape is validated.
	if n := doInt(t, c, "ACKJOB", garbageValidID); n != 0 {
		t.Errorf("ACKJOB of a well-shaped unknown id = %d, want 0", n)
	}
	doNil(t, c, "SHOW", garbageValidID)
	wantErr(t, c, errNoJobText, "WORKING", garbageValidID)
}

func TestWorking(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)

	id := addJob(t, c, "q", "w", "RETRY", 5, "TTL", 100)
	getJobs(t, c, "FROM", "q")
	if n := doInt(t, c, "WORKING", id); n != 5 {
		t.Errorf("WORKING = %d, want the RETRY 5", n)
	}
	if w, ok := show(t, c, id)["next-requeue-within"].(int64); !ok || w < 4000 || w > 5500 {
		t.Errorf("after WORKING next-requeue-within = %#v, want about 5000", w)
	}
	wantErr(t, c, errNoJobText, "WORKING", unknownValidID)
	wantErr(t, c, errBadIDText, "WORKING", "D-1")
	wantErr(t, c, wrongArity("working"), "WORKING", id, id)
	wantErr(t, c, wrongArity("working"), "WORKING")

	// More than half the TTL elapsed: -TOOLATE. TTL 2 → after 1 s.
	tl := addJob(t, c, "q", "late", "TTL", 2)
	added := time.Now()
	if n := doInt(t, c, "working", tl); n != 1 {
		t.Errorf("WORKING on a TTL 2 job = %d, want its RETRY 1", n)
	}
	waitUntil(t, 5*time.Second, "half of TTL 2", func() bool { return time.Since(added) > 1100*time.Millisecond })
	got := doErr(t, c, "WORKING", tl)
	if got == errNoJobText && time.Since(added) > 2*time.Second {
		t.Skipf("too slow: the TTL 2 job expired before WORKING ran (%v)", time.Since(added))
	}
	if got != errTooLateText {
		t.Errorf("WORKING after half the TTL = -%s\nwant -%s", got, errTooLateText)
	}
}

func TestShow(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	me := myID(t, c)

	before := time.Now().UnixMilli()
	id := addJob(t, c, "sq", "payload", "TTL", 300, "RETRY", 20)
	after := time.Now().UnixMilli()
	m := show(t, c, id)
	want := map[string]any{"id": id, "queue": "sq", "state": "queued", "repl": int64(1), "delay": int64(0),
		"retry": int64(20), "nacks": int64(0), "additional-deliveries": int64(0), "next-awake-within": nil,
		"body": "payload"}
	for k, v := range want {
		if m[k] != v {
			t.Errorf("SHOW %s = %#v, want %#v", k, m[k], v)
		}
	}
	if ttl, ok := m["ttl"].(int64); !ok || ttl < 295 || ttl > 300 {
		t.Errorf("SHOW ttl = %#v, want about 300", m["ttl"])
	}
	ctime, ok := m["ctime"].(int64)
	if !ok || ctime/1_000_000 < before-1000 || ctime/1_000_000 > after+1000 {
		t.Errorf("SHOW ctime = %#v, want ms×1e6 of the ADDJOB time [%d, %d]", m["ctime"], before, after)
	}
	for _, k := range []string{"nodes-delivered", "nodes-confirmed"} {
		nodes, ok := m[k].([]any)
		if !ok {
			t.Errorf("SHOW %s = %#v, want an array", k, m[k])
		}
		for _, n := range nodes {
			if n != me {
				t.Errorf("SHOW %s has %#v, want only this node %s", k, n, me)
			}
		}
	}
	if w := m["next-requeue-within"]; w != nil {
		if n, ok := w.(int64); !ok || n < 0 || n > 20500 {
			t.Errorf("SHOW next-requeue-within of a queued job = %#v", w)
		}
	}

	// Delivered: active, requeue about RETRY away.
	getJobs(t, c, "FROM", "sq")
	m = show(t, c, id)
	if w, ok := m["next-requeue-within"].(int64); m["state"] != "active" || !ok || w < 18000 || w > 20500 {
		t.Errorf("delivered: state %v next-requeue-within %#v, want active, about 20000", m["state"], m["next-requeue-within"])
	}
	if nodes, _ := m["nodes-delivered"].([]any); !slices.Contains(nodes, any(me)) {
		t.Errorf("delivered: nodes-delivered = %#v, want this node", m["nodes-delivered"])
	}

	doNil(t, c, "SHOW", unknownValidID)
	wantErr(t, c, wrongArity("show"), "SHOW")
	wantErr(t, c, wrongArity("show"), "SHOW", id, id)

	// ctime strictly increases per node, even within one millisecond.
	pipe := c.Pipeline()
	var cmds []*redis.Cmd
	for i := range 50 {
		cmds = append(cmds, pipe.Do(context.Background(), "ADDJOB", "ct", i, 0))
	}
	if _, err := pipe.Exec(context.Background()); err != nil {
		t.Fatal(err)
	}
	last := int64(0)
	for _, cmd := range cmds {
		ct := show(t, c, cmd.Val().(string))["ctime"].(int64)
		if ct <= last {
			t.Errorf("ctime %d after %d: not strictly increasing", ct, last)
		}
		last = ct
	}
	// And the queue is in ctime order.
	got := getJobs(t, c, "COUNT", 100, "NOHANG", "FROM", "ct")
	for i, j := range got {
		if j.Body != strconv.Itoa(i) {
			t.Fatalf("pipelined ADDJOBs came out as %v", bodies(got))
		}
	}
}

// TestConcurrentConsumers: producers and blocking consumers at once. Every
// job is delivered exactly once, each consumer sees each producer's jobs in
// order, and ACKJOB leaves nothing behind.
func TestConcurrentConsumers(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	const (
		nprod, ncons = 4, 4
		perProducer  = 250
	)
	var wg sync.WaitGroup
	for p := range nprod {
		pc := s.client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range perProducer {
				if err := pc.Do(context.Background(), "ADDJOB", "cc", body(p, seq), 0).Err(); err != nil {
					t.Errorf("producer %d: ADDJOB: %v", p, err)
					return
				}
			}
		}()
	}
	var mu sync.Mutex
	seen := map[string]int{} // body → deliveries
	var received atomic.Int64
	done := make(chan struct{})
	for range ncons {
		cc := s.client(t)
		wg.Add(1)
		go func() {
			defer wg.Done()
			last := make([]int, nprod)
			for i := range last {
				last[i] = -1
			}
			for {
				select {
				case <-done:
					return
				default:
				}
				v, err := cc.Do(context.Background(), "GETJOB", "TIMEOUT", 100, "COUNT", 7, "FROM", "cc").Result()
				if errors.Is(err, redis.Nil) {
					continue
				}
				if err != nil {
					t.Errorf("GETJOB: %v", err)
					return
				}
				var ids []any
				for _, e := range v.([]any) {
					f := e.([]any)
					var p, seq int
					fmt.Sscanf(f[2].(string), "p%d-%d", &p, &seq)
					if seq <= last[p] {
						t.Errorf("a consumer got producer %d's seq %d after %d", p, seq, last[p])
					}
					last[p] = seq
					mu.Lock()
					seen[f[2].(string)]++
					mu.Unlock()
					ids = append(ids, f[1])
				}
				if n, err := cc.Do(context.Background(), append([]any{"ACKJOB"}, ids...)...).Int(); err != nil || n != len(ids) {
					t.Errorf("ACKJOB %d ids = %d, %v", len(ids), n, err)
				}
				received.Add(int64(len(ids)))
			}
		}()
	}
	waitUntil(t, 60*time.Second, "every job to be delivered", func() bool { return received.Load() >= nprod*perProducer })
	close(done)
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	for p := range nprod {
		for seq := range perProducer {
			if n := seen[body(p, seq)]; n != 1 {
				t.Errorf("job %s delivered %d times, want once", body(p, seq), n)
			}
		}
	}
	if inf := info(t, c); inf["registered_jobs"] != "0" || inf["blocked_clients"] != "0" {
		t.Errorf("after acking everything: registered_jobs %s blocked_clients %s, want 0 and 0",
			inf["registered_jobs"], inf["blocked_clients"])
	}
}

// TestTTLExpiry: at etime a job is deleted in whatever state.
func TestTTLExpiry(t *testing.T) {
	t.Parallel()
	s := startServer(t)
	c := s.client(t)
	added := time.Now()
	queued := addJob(t, c, "tq", "queued", "TTL", 1)
	active := addJob(t, c, "ta", "active", "TTL", 1)
	getJobs(t, c, "FROM", "ta")
	delayed := addJob(t, c, "td", "delayed", "TTL", 1, "DELAY", 0)
	keep := addJob(t, c, "tq", "keep", "TTL", 100)
	gone := waitUntil(t, 10*time.Second, "TTL 1 jobs to expire", func() bool {
		return show(t, c, queued) == nil && show(t, c, active) == nil && show(t, c, delayed) == nil
	})
	if el := gone.Sub(added); el < 900*time.Millisecond {
		t.Errorf("TTL 1 jobs gone after %v", el)
	}
	if n := doInt(t, c, "QLEN", "tq"); n != 1 {
		t.Errorf("QLEN after expiry = %d, want 1", n)
	}
	if got := getJobs(t, c, "NOHANG", "FROM", "tq", "ta", "td"); len(got) != 1 || got[0].ID != keep {
		t.Errorf("GETJOB after expiry = %+v, want only %s", got, keep)
	}
	if inf := info(t, c); inf["registered_jobs"] != "1" || inf["jobs_expired"] != "3" {
		t.Errorf("INFO registered_jobs %s jobs_expired %s, want 1 and 3", inf["registered_jobs"], inf["jobs_expired"])
	}
}
