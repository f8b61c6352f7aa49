package server

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/storage"
	"github.com/redis/go-redis/v9"
)

// newScanClient starts a server with a broker and returns a go-redis client
// speaking RESP2 to it, as Disque clients do.
func newScanClient(t *testing.T) *redis.Client {
	t.Helper()
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	c := redis.NewClient(&redis.Options{
		Addr:            addr,
		Protocol:        2,
		DisableIdentity: true,
		MaxRetries:      -1,
		PoolSize:        4,
	})
	t.Cleanup(func() { c.Close() })
	return c
}

// do runs a command that must succeed; a null reply is nil.
func do(t *testing.T, c *redis.Client, args ...any) any {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	if errors.Is(err, redis.Nil) {
		return nil
	}
	if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return v
}

// doErr runs a command that must fail and returns its error reply.
func doErr(t *testing.T, c *redis.Client, args ...any) string {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	if err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("%v: want an error, got %v", args, v)
	}
	return err.Error()
}

func addJob(t *testing.T, c *redis.Client, q string, opts ...any) string {
	t.Helper()
	return do(t, c, append([]any{"ADDJOB", q, "body-" + q, 0}, opts...)...).(string)
}

// scanPage runs one QSCAN or JSCAN call and returns its cursor and items.
func scanPage(t *testing.T, c *redis.Client, args ...any) (string, []any) {
	t.Helper()
	reply, ok := do(t, c, args...).([]any)
	if !ok || len(reply) != 2 {
		t.Fatalf("%v: reply %#v", args, reply)
	}
	cursor, ok := reply[0].(string)
	if !ok {
		t.Fatalf("%v: cursor %#v is not a bulk string", args, reply[0])
	}
	items, ok := reply[1].([]any)
	if !ok {
		t.Fatalf("%v: items %#v", args, reply[1])
	}
	return cursor, items
}

// jsCursor parses a cursor as disqueue-node does, with JavaScript's
// parseInt, and returns the number it sends back: the reply must be decimal
// digits, and a number that a float64 holds exactly (parseInt("qTJU")
// is NaN, and a longer number comes back rounded).
func jsCursor(t *testing.T, cursor string) uint64 {
	t.Helper()
	if cursor == "" || strings.Trim(cursor, "0123456789") != "" {
		t.Fatalf("cursor %q is not a decimal number", cursor)
	}
	f, err := strconv.ParseFloat(cursor, 64)
	if err != nil || f > 1<<53-1 || strconv.FormatFloat(f, 'f', -1, 64) != strings.TrimLeft(cursor, "0") && cursor != "0" {
		t.Fatalf("cursor %q does not survive a JavaScript number (%v)", cursor, f)
	}
	return uint64(f)
}

// scanAll runs a scan to its end as disqueue-node does (the cursor read as
// a number, sent back as a number, last), calling between (if not nil)
// after each call, and returns every item as a string, in the order
// returned.
func scanAll(t *testing.T, c *redis.Client, cmd string, opts []any, between func(step int)) []string {
	t.Helper()
	var out []string
	cursor := uint64(0)
	for step := 0; ; step++ {
		if step > 10000 {
			t.Fatalf("%s never ended", cmd)
		}
		next, items := scanPage(t, c, append(append([]any{cmd}, opts...), cursor)...)
		for _, it := range items {
			out = append(out, it.(string))
		}
		cursor = jsCursor(t, next)
		if cursor == 0 {
			return out
		}
		if between != nil {
			between(step)
		}
	}
}

func TestQStat(t *testing.T) {
	c := newScanClient(t)
	if v := do(t, c, "QSTAT", "nosuch"); v != nil {
		t.Fatalf("QSTAT of an unknown queue: %#v, want a null array", v)
	}
	addJob(t, c, "q")
	addJob(t, c, "q")
	addJob(t, c, "q", "DELAY", 100) // not queued: not in jobs-in yet
	do(t, c, "GETJOB", "NOHANG", "FROM", "q")

	stat := func(q string) []any {
		t.Helper()
		v, ok := do(t, c, "QSTAT", q).([]any)
		if !ok || len(v) != 20 {
			t.Fatalf("QSTAT %s: %#v, want 20 elements", q, v)
		}
		keys := []string{"name", "len", "age", "idle", "blocked", "import-from", "import-rate", "jobs-in", "jobs-out", "pause"}
		for i, k := range keys {
			if v[2*i] != k {
				t.Fatalf("QSTAT %s: key %d is %#v, want %q", q, i, v[2*i], k)
			}
		}
		return v
	}
	v := stat("q")
	if v[1] != "q" || v[3] != int64(1) || v[9] != int64(0) || v[13] != int64(0) ||
		v[15] != int64(2) || v[17] != int64(1) || v[19] != "none" {
		t.Fatalf("QSTAT q: %#v", v)
	}
	if from, ok := v[11].([]any); !ok || len(from) != 0 {
		t.Fatalf("import-from: %#v, want an empty array", v[11])
	}
	for _, i := range []int{5, 7} { // age, idle
		if n, ok := v[i].(int64); !ok || n < 0 || n > 60 {
			t.Fatalf("%s: %#v", v[i-1], v[i])
		}
	}

	// A paused queue exists without jobs.
	do(t, c, "PAUSE", "p", "in")
	if v := stat("p"); v[3] != int64(0) || v[19] != "in" {
		t.Fatalf("QSTAT p: %#v", v)
	}

	// A blocked client is counted while it waits.
	done := make(chan error, 1)
	go func() { done <- c.Do(context.Background(), "GETJOB", "FROM", "b").Err() }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if v, ok := do(t, c, "QSTAT", "b").([]any); ok && v[9] == int64(1) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("blocked client never counted")
		}
		time.Sleep(time.Millisecond)
	}
	addJob(t, c, "b")
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if v := stat("b"); v[9] != int64(0) || v[15] != int64(1) || v[17] != int64(1) {
		t.Fatalf("QSTAT b after serving: %#v", v)
	}
	if got := doErr(t, c, "QSTAT"); !strings.Contains(got, "wrong number of arguments") {
		t.Fatalf("QSTAT without a queue: %s", got)
	}
}

func TestQScan(t *testing.T) {
	c := newScanClient(t)
	var want []string
	for i := range 25 {
		q := fmt.Sprintf("queue-%02d", i)
		want = append(want, q)
		for range i % 4 {
			addJob(t, c, q)
		}
		if i%4 == 0 {
			do(t, c, "PAUSE", q, "out") // no jobs: known by its pause
		}
	}

	t.Run("count 7 returns each once", func(t *testing.T) {
		got := scanAll(t, c, "QSCAN", []any{"COUNT", 7}, nil)
		if !slices.Equal(slices.Sorted(slices.Values(got)), want) {
			t.Fatalf("got %q\nwant %q", got, want)
		}
	})
	t.Run("options in any order", func(t *testing.T) {
		cursor, items := scanPage(t, c, "QSCAN", "COUNT", 10, 0)
		if cursor == "0" || len(items) != 10 {
			t.Fatalf("QSCAN COUNT 10 0: %q %v", cursor, items)
		}
		next, rest := scanPage(t, c, "qscan", "count", 100, cursor)
		got := slices.Sorted(slices.Values(strs(slices.Concat(items, rest))))
		if next != "0" || len(rest) != 15 || !slices.Equal(got, want) {
			t.Fatalf("second page: %q %v", next, rest)
		}
		if _, items := scanPage(t, c, "QSCAN"); len(items) != 10 {
			t.Fatalf("QSCAN alone: %v, want COUNT 10", items)
		}
	})
	t.Run("busyloop", func(t *testing.T) {
		cursor, items := scanPage(t, c, "QSCAN", "BUSYLOOP", "COUNT", 2)
		if cursor != "0" || len(items) != 25 {
			t.Fatalf("BUSYLOOP: cursor %q, %d items", cursor, len(items))
		}
	})
	t.Run("minlen maxlen", func(t *testing.T) {
		cursor, items := scanPage(t, c, "QSCAN", "MAXLEN", 2, "BUSYLOOP", "MINLEN", 2)
		got := slices.Sorted(slices.Values(strs(items)))
		var exp []string
		for i, q := range want {
			if i%4 == 2 {
				exp = append(exp, q)
			}
		}
		if cursor != "0" || !slices.Equal(got, exp) {
			t.Fatalf("MINLEN 2 MAXLEN 2: %q %q, want %q", cursor, got, exp)
		}
		got = scanAll(t, c, "QSCAN", []any{"COUNT", 3, "MINLEN", 1}, nil)
		if len(got) != 18 {
			t.Fatalf("MINLEN 1 in pages: %d queues %q", len(got), got)
		}
		if _, items := scanPage(t, c, "QSCAN", "BUSYLOOP", "IMPORTRATE", 1); len(items) != 0 {
			t.Fatalf("IMPORTRATE 1 on a lone node: %v", items)
		}
		if _, items := scanPage(t, c, "QSCAN", "BUSYLOOP", "IMPORTRATE", 0); len(items) != 25 {
			t.Fatalf("IMPORTRATE 0: %d items", len(items))
		}
	})
	t.Run("queues come and go", func(t *testing.T) {
		// Every queue present for the whole scan is returned exactly once;
		// queues added or removed meanwhile may or may not be.
		existed := map[string]bool{}
		for _, q := range want {
			existed[q] = true
		}
		var doomed []string // jobs whose queues go during the scan
		for i := range 30 {
			q := fmt.Sprintf("gone-%02d", i)
			existed[q] = true
			doomed = append(doomed, addJob(t, c, q))
		}
		seen := map[string]int{}
		extra := 0
		for _, q := range scanAll(t, c, "QSCAN", []any{"COUNT", 7}, func(step int) {
			for range 3 {
				extra++
				q := fmt.Sprintf("queue-%02d-%d", extra%25, extra)
				existed[q] = true
				addJob(t, c, q)
			}
			for range min(2, len(doomed)) {
				do(t, c, "DELJOB", doomed[0])
				doomed = doomed[1:]
			}
		}) {
			seen[q]++
			if !existed[q] {
				t.Fatalf("QSCAN returned %s, which never existed", q)
			}
		}
		for _, q := range want {
			if seen[q] != 1 {
				t.Fatalf("%s returned %d times", q, seen[q])
			}
		}
		for q, n := range seen {
			if n != 1 {
				t.Fatalf("%s returned %d times", q, n)
			}
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			args []any
			want string
		}{
			{[]any{"QSCAN", "COUNT", "x"}, "ERR value is not an integer or out of range"},
			{[]any{"QSCAN", "COUNT", 0}, "ERR COUNT must be greater than zero"},
			{[]any{"QSCAN", "COUNT"}, "ERR syntax error"},
			{[]any{"QSCAN", "MINLEN", "1.5"}, "ERR value is not an integer or out of range"},
			{[]any{"QSCAN", 0, 0}, "ERR syntax error"},
			{[]any{"QSCAN", 17, "COUNT", 2, 18}, "ERR syntax error"},
			// Anything neither an option nor a cursor: Disque's one text.
			{[]any{"QSCAN", "BOGUS"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", 0, "BOGUS"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", "qAAAAAAAAA"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", "-1"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", "+1"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", " 1"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", "1.0"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", "0x10"}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", ""}, "ERR invalid cursor or option name"},
			{[]any{"QSCAN", "9007199254740992"}, "ERR invalid cursor or option name"}, // 2^53
			{[]any{"QSCAN", "99999999999999999999"}, "ERR invalid cursor or option name"},
		} {
			if got := doErr(t, c, tc.args...); got != tc.want {
				t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
			}
		}
	})
}

func strs(items []any) []string {
	out := make([]string, len(items))
	for i, it := range items {
		out[i] = it.(string)
	}
	return out
}

// JSCAN positions: every position's start is at that position, positions
// only grow along id order, and an id is at or after a position exactly
// when it is not less than the position's start, for ids of this node,
// junk and other nodes alike.
func TestJobPositions(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	prefix := jobIDPrefix("3f9a1c2e0123456789abcdef0123456789abcdef")
	if prefix != "D-3f9a1c2e-" || jobIDPrefix("ab") != "D-ab000000-" {
		t.Fatalf("prefix %q", prefix)
	}
	randomPos := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return uint64(rng.IntN(3))
		case 1:
			return maxCursor - uint64(rng.IntN(3))
		}
		return rng.Uint64N(maxCursor + 1)
	}
	randomID := func() string {
		switch rng.IntN(5) {
		case 0: // junk bytes in the random part
			b := []byte(storage.NewJobID("3f9a1c2e", 60, 1))
			for range 1 + rng.IntN(3) {
				b[11+rng.IntN(10)] = byte(rng.IntN(256))
			}
			return string(b)
		case 1: // another node
			return storage.NewJobID(fmt.Sprintf("%08x", rng.Uint32()), 60, 1)
		case 2: // near a position's start
			id := jobPosStart(prefix, randomPos()) + strings.Repeat("A", storage.JobIDLen-20)
			b := []byte(id)
			b[11+rng.IntN(9)] += byte(rng.IntN(3)) - 1
			return string(b)
		}
		return storage.NewJobID("3f9a1c2e", 60, 1)
	}
	for range 20000 {
		p := randomPos()
		start := jobPosStart(prefix, p)
		if got := jobPos(prefix, start); got != p {
			t.Fatalf("position of the start %q of %d is %d", start, p, got)
		}
		if p > 0 && jobPosStart(prefix, p-1) >= start {
			t.Fatalf("start of %d %q not before that of %d %q", p-1, jobPosStart(prefix, p-1), p, start)
		}
		x, y := randomID(), randomID()
		if x > y {
			x, y = y, x
		}
		if px, py := jobPos(prefix, x), jobPos(prefix, y); px > py {
			t.Fatalf("%q < %q but positions %d > %d", x, y, px, py)
		}
		if p > 0 {
			from := jobsFrom(prefix, p)
			if (jobPos(prefix, x) >= p) != (x >= start) || (x >= start) != (x > from) {
				t.Fatalf("id %q, position %d (start %q, scan after %q): position of the id %d",
					x, p, start, from, jobPos(prefix, x))
			}
		}
	}
}

// scanEnd takes COUNT items and then every item at the last one's
// position, so that the next call can start at the next position.
func TestScanEnd(t *testing.T) {
	for _, tc := range []struct {
		pos   []uint64
		count int
		end   int
		next  uint64
	}{
		{nil, 3, 0, 0},
		{[]uint64{1, 2, 3}, 3, 3, 0},
		{[]uint64{1, 2, 3, 4}, 3, 3, 4},
		{[]uint64{1, 2, 2, 2, 5}, 2, 4, 5},
		{[]uint64{1, 2, 2, 2}, 2, 4, 0},
		{[]uint64{7, 7, 7}, 1, 3, 0},
		{[]uint64{0, 0, 9}, 1, 2, 9},
	} {
		end, next := scanEnd(len(tc.pos), tc.count, func(i int) uint64 { return tc.pos[i] })
		if end != tc.end || next != tc.next {
			t.Errorf("%v count %d: %d %d, want %d %d", tc.pos, tc.count, end, next, tc.end, tc.next)
		}
	}
}

func TestJScan(t *testing.T) {
	c := newScanClient(t)
	var queuedA, queuedB, delayed []string
	for range 12 {
		queuedA = append(queuedA, addJob(t, c, "a"))
	}
	for range 5 {
		queuedB = append(queuedB, addJob(t, c, "b"))
	}
	for range 4 {
		delayed = append(delayed, addJob(t, c, "a", "DELAY", 100))
	}
	// Two delivered jobs of a: active, not delayed.
	var delivered []string
	for _, job := range do(t, c, "GETJOB", "COUNT", 2, "FROM", "a").([]any) {
		delivered = append(delivered, job.([]any)[1].(string))
	}
	queuedA = slices.DeleteFunc(queuedA, func(id string) bool { return slices.Contains(delivered, id) })
	all := slices.Concat(queuedA, queuedB, delayed, delivered)

	sorted := func(ids []string) []string { return slices.Sorted(slices.Values(ids)) }
	check := func(name string, got, want []string) {
		t.Helper()
		if !slices.Equal(sorted(got), sorted(want)) {
			t.Fatalf("%s: got %d %q\nwant %d %q", name, len(got), sorted(got), len(want), sorted(want))
		}
	}
	check("all, COUNT 4", scanAll(t, c, "JSCAN", []any{"COUNT", 4}, nil), all)
	check("QUEUE b", scanAll(t, c, "JSCAN", []any{"QUEUE", "b", "COUNT", 3}, nil), queuedB)
	check("QUEUE a STATE queued", scanAll(t, c, "JSCAN", []any{"STATE", "queued", "QUEUE", "a"}, nil), queuedA)
	check("STATE delayed", scanAll(t, c, "JSCAN", []any{"STATE", "delayed"}, nil), delayed)
	check("STATE active", scanAll(t, c, "JSCAN", []any{"STATE", "active"}, nil), slices.Concat(delayed, delivered))
	check("STATE delayed STATE queued QUEUE b", scanAll(t, c, "JSCAN", []any{"STATE", "delayed", "STATE", "queued", "QUEUE", "b"}, nil), queuedB)
	check("STATE acked", scanAll(t, c, "JSCAN", []any{"STATE", "acked"}, nil), nil)

	cursor, items := scanPage(t, c, "JSCAN", "COUNT", 100, "BUSYLOOP", "0", "STATE", "DELAYED")
	if cursor != "0" || len(items) != len(delayed) {
		t.Fatalf("BUSYLOOP with the cursor amid options: %q %v", cursor, items)
	}

	t.Run("reply all", func(t *testing.T) {
		_, items := scanPage(t, c, "JSCAN", "BUSYLOOP", "STATE", "delayed", "REPLY", "all")
		if len(items) != len(delayed) {
			t.Fatalf("%d items, want %d", len(items), len(delayed))
		}
		for _, it := range items {
			show, ok := it.([]any)
			if !ok || len(show) != 30 {
				t.Fatalf("REPLY all item: %#v, want 30 elements", it)
			}
			if show[0] != "id" || !slices.Contains(delayed, show[1].(string)) || show[3] != "a" ||
				show[5] != "active" || show[12] != "delay" || show[13] != int64(100) ||
				show[28] != "body" || show[29] != "body-a" {
				t.Fatalf("REPLY all item: %#v", show)
			}
			if within, ok := show[27].(int64); !ok || within <= 0 {
				t.Fatalf("next-awake-within of a delayed job: %#v", show[27])
			}
		}
		_, ids := scanPage(t, c, "JSCAN", "BUSYLOOP", "QUEUE", "b", "REPLY", "id")
		if len(ids) != len(queuedB) {
			t.Fatalf("REPLY id: %v", ids)
		}
	})
	t.Run("bad input", func(t *testing.T) {
		for _, tc := range []struct {
			args []any
			want string
		}{
			{[]any{"JSCAN", "STATE", "sleeping"}, "ERR unknown job state 'sleeping': use wait-repl, active, queued, acked or delayed"},
			{[]any{"JSCAN", "REPLY", "some"}, "ERR REPLY must be id or all"},
			{[]any{"JSCAN", "QUEUE"}, "ERR syntax error"},
			{[]any{"JSCAN", "COUNT", "-1"}, "ERR COUNT must be greater than zero"},
			{[]any{"JSCAN", "COUNT", "99999999999999999999"}, "ERR value is not an integer or out of range"},
			{[]any{"JSCAN", 0, 5}, "ERR syntax error"},
			{[]any{"JSCAN", "WITHBODIES"}, "ERR invalid cursor or option name"},
			{[]any{"JSCAN", "jnotacursor"}, "ERR invalid cursor or option name"},
			{[]any{"JSCAN", "99999999999999999999"}, "ERR invalid cursor or option name"},
			{[]any{"JSCAN", "18446744073709551615"}, "ERR invalid cursor or option name"},
			{[]any{"JSCAN", "9007199254740992"}, "ERR invalid cursor or option name"},
		} {
			if got := doErr(t, c, tc.args...); got != tc.want {
				t.Errorf("%v: %q, want %q", tc.args, got, tc.want)
			}
		}
	})
}

// Jobs added and deleted between JSCAN calls: every job present for the whole
// scan is returned exactly once, and nothing that never existed is.
func TestJScanWhileJobsComeAndGo(t *testing.T) {
	seed := rand.Uint64()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	c := newScanClient(t)
	var stable, doomed []string
	for i := range 60 {
		id := addJob(t, c, fmt.Sprintf("q%d", i%3))
		if rng.IntN(3) == 0 {
			doomed = append(doomed, id)
		} else {
			stable = append(stable, id)
		}
	}
	existed := map[string]bool{}
	for _, id := range slices.Concat(stable, doomed) {
		existed[id] = true
	}
	seen := map[string]int{}
	for _, id := range scanAll(t, c, "JSCAN", []any{"COUNT", 7}, func(step int) {
		for range 1 + rng.IntN(4) {
			existed[addJob(t, c, "q-new")] = true
		}
		if len(doomed) > 0 {
			k := rng.IntN(len(doomed))
			if n := do(t, c, "DELJOB", doomed[k]); n != int64(1) {
				t.Fatalf("DELJOB %s: %v", doomed[k], n)
			}
			doomed = slices.Delete(doomed, k, k+1)
		}
	}) {
		seen[id]++
		if !existed[id] {
			t.Fatalf("JSCAN returned %s, which never existed", id)
		}
	}
	for _, id := range stable {
		if seen[id] != 1 {
			t.Fatalf("job %s present for the whole scan was returned %d times", id, seen[id])
		}
	}
	for id, n := range seen {
		if n != 1 {
			t.Fatalf("job %s returned %d times", id, n)
		}
	}
}

// Jobs that share a JSCAN position (ids alike in their first 9 random
// characters) come in the same call, whatever COUNT says, and ids of other
// nodes (sorting before and after this node's) are returned too: every job
// exactly once, through cursors that are JavaScript numbers. The ids are
// made up, so the jobs are written to the store before the broker opens it.
func TestJScanSharedPositionsAndOtherNodes(t *testing.T) {
	opts := storage.TestingOptions()
	opts.FS = vfs.Default
	dir := t.TempDir()
	st, err := storage.Open(dir, opts)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	var clock storage.CtimeClock
	var want []string
	add := func(id string) {
		t.Helper()
		j := &storage.Job{ID: id, Queue: "q", State: storage.StateQueued, Ctime: clock.Next(now),
			Etime: now + 3600_000, Retry: 60, Repl: 1, QueueTime: now + 3600_000}
		if err := st.Add(j, []byte("body")); err != nil {
			t.Fatal(err)
		}
		want = append(want, id)
	}
	prefix := jobIDPrefix(st.NodeID())
	shared := jobPosStart(prefix, 1<<40)
	for i := range 30 {
		add(fmt.Sprintf("%s%015d-0001", shared, i))
	}
	for range 40 {
		add(storage.NewJobID(st.NodeID(), 3600, 60))
	}
	for range 5 {
		add(storage.NewJobID("00000000", 3600, 60)) // before this node's
		add(storage.NewJobID("ffffffff", 3600, 60)) // after
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	b := runBroker(t, dir, opts)
	s, addr := startServer(t)
	s.SetBroker(b)
	c := newClientOn(t, addr)

	for _, count := range []int{1, 2, 7, 100} {
		seen := map[string]int{}
		cursor, biggest := uint64(0), 0
		for {
			next, items := scanPage(t, c, "JSCAN", "COUNT", count, cursor)
			biggest = max(biggest, len(items))
			for _, id := range strs(items) {
				seen[id]++
			}
			if cursor = jsCursor(t, next); cursor == 0 {
				break
			}
		}
		for _, id := range want {
			if seen[id] != 1 {
				t.Fatalf("COUNT %d: %s returned %d times", count, id, seen[id])
			}
		}
		if len(seen) != len(want) || biggest < 30 {
			t.Fatalf("COUNT %d: %d jobs, largest page %d; want %d, and the 30 alike in one page",
				count, len(seen), biggest, len(want))
		}
	}
}
