package server

import (
	"fmt"
	"strings"
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/redis/go-redis/v9"
)

// newClientOn is a go-redis client speaking RESP2 to the server at addr.
func newClientOn(t *testing.T, addr string) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, Protocol: 2, DisableIdentity: true, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	return c
}

// addBigJobs adds n jobs to queue q through the broker, each with a body of
// size bytes that starts with its number ("00", "01", …).
func addBigJobs(t *testing.T, b *queue.Broker, q string, n, size int) {
	t.Helper()
	for i := range n {
		body := fmt.Sprintf("%02d", i) + strings.Repeat("x", size-2)
		res := b.AddJobs([]queue.AddRequest{{Queue: q, Body: []byte(body), TTL: 3600, Retry: 300, Replicate: 1}})
		if res[0].Err != nil {
			t.Fatal(res[0].Err)
		}
	}
}

// TestGetJobHugeCountIsBounded: GETJOB COUNT 1000000 over 6 MiB of jobs
// replies with the jobs that fit in queue.MaxGetBytes (4 MiB: three of
// 1 MiB), in order, and leaves the rest queued for the next GETJOB.
func TestGetJobHugeCountIsBounded(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	addBigJobs(t, b, "q", 6, 1<<20)
	rc := dialResp(t, addr)
	var order []string
	for _, want := range []int{3, 3} {
		rc.send("GETJOB NOHANG COUNT 1000000 FROM q\r\n")
		got := rc.read()
		jobs := strings.Split(got, "*[$q ")[1:] // one per job: "*[$q $id $body]"
		if len(jobs) != want {
			t.Fatalf("GETJOB COUNT 1000000 got %d jobs (%d bytes of reply), want %d", len(jobs), len(got), want)
		}
		for _, j := range jobs {
			order = append(order, strings.Fields(j)[1][1:3]) // the body's number
		}
	}
	if strings.Join(order, " ") != "00 01 02 03 04 05" {
		t.Fatalf("order: %v", order)
	}
	if got := rc.do("GETJOB NOHANG COUNT 1000000 FROM q"); got != "*-1" {
		t.Fatalf("queue empty: %.40q", got)
	}
}

// TestJScanBusyLoopReplyAllIsBounded: JSCAN BUSYLOOP REPLY all over 6 MiB of
// bodies replies with about jscanMaxBytes of them and a cursor; going on
// from it lists every job exactly once, with its body.
func TestJScanBusyLoopReplyAllIsBounded(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	addBigJobs(t, b, "q", 12, 512<<10)
	c := newClientOn(t, addr)
	seen := map[string]int{}
	cursor, calls := "0", 0
	for {
		next, items := scanPage(t, c, "JSCAN", cursor, "BUSYLOOP", "REPLY", "all")
		calls++
		size := 0
		for _, it := range items {
			show := it.([]any)
			body := show[29].(string)
			size += len(body)
			seen[body[:2]]++
		}
		if len(items) == 0 || int64(size) > jscanMaxBytes {
			t.Fatalf("call %d: %d jobs, %d bytes of bodies (limit %d)", calls, len(items), size, jscanMaxBytes)
		}
		if next == "0" {
			break
		}
		if calls > 12 {
			t.Fatal("the scan never ends")
		}
		cursor = next
	}
	if calls < 2 || len(seen) != 12 {
		t.Fatalf("%d calls listed %d distinct jobs (%v): want 12 jobs in 2 calls or more", calls, len(seen), seen)
	}
	for k, n := range seen {
		if n != 1 {
			t.Fatalf("job %s listed %d times", k, n)
		}
	}
}

// TestJScanBusyLoopIsBoundedInItems: JSCAN BUSYLOOP lists at most
// jscanMaxItems jobs (lowered here) per call, and a cursor to go on.
func TestJScanBusyLoopIsBoundedInItems(t *testing.T) {
	defer func(n int) { jscanMaxItems = n }(jscanMaxItems)
	jscanMaxItems = 7
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	addBigJobs(t, b, "q", 20, 10)
	c := newClientOn(t, addr)
	next, items := scanPage(t, c, "JSCAN", "BUSYLOOP")
	if next == "0" || len(items) != 7 {
		t.Fatalf("JSCAN BUSYLOOP: cursor %q and %d ids, want a cursor and 7", next, len(items))
	}
	if all := scanAll(t, c, "JSCAN", []any{"BUSYLOOP"}, nil); len(all) != 20 {
		t.Fatalf("the whole scan listed %d jobs, want 20", len(all))
	}
}
