package queue

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestGetJobDeliversInChunks: a GETJOB of many jobs delivers them in
// chunks of at most getChunk, each under its own hold of the broker's
// lock, so another client is served between two chunks; the reply is still
// every job, in the GETJOB's round-robin across queues.
func TestGetJobDeliversInChunks(t *testing.T) {
	const chunk = 10
	f := newFixture(t, 16) // heads smaller than the GETJOB: refills between rounds too
	f.b.getChunk = chunk
	f.addMany("a", 50, nil)
	f.addMany("b", 45, nil)
	f.addMany("c", 1, nil)

	var holds []int
	var between []Delivered
	inner := false // the other client's own GETJOB is running
	f.b.testGetHoldHook = func(delivered int) {
		if inner {
			return
		}
		holds = append(holds, delivered)
		if len(holds) != 3 {
			return
		}
		inner = true
		defer func() { inner = false }()
		// Another client, mid-GETJOB: it runs to completion while the
		// GETJOB waits here, so it took the broker's lock between chunks.
		done := make(chan error)
		go func() {
			res := f.b.AddJobs([]AddRequest{{Queue: "live", Body: []byte("live"), TTL: 86400, Retry: 300}})
			if res[0].Err != nil {
				done <- res[0].Err
				return
			}
			var err error
			between, err = f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"live"}, Count: 1, NoHang: true})
			done <- err
		}()
		if err := <-done; err != nil {
			t.Errorf("client between chunks: %v", err)
		}
	}
	got := f.get(1000, "a", "b", "c")
	f.b.testGetHoldHook = nil

	if len(between) != 1 || string(between[0].Body) != "live" {
		t.Errorf("the client between chunks got %+v", between)
	}
	total := 0
	for i, n := range holds {
		if n > chunk {
			t.Errorf("hold %d delivered %d jobs, more than the chunk of %d", i, n, chunk)
		}
		total += n
	}
	if total != 96 || len(got) != 96 || len(holds) < 96/chunk {
		t.Fatalf("%d jobs in %d holds %v; the reply has %d; want 96 in ≥ %d holds", total, len(holds), holds, len(got), 96/chunk)
	}
	// Round-robin across the chunks: a b c, then a b until b runs out,
	// then a.
	var want []string
	for i := range 50 {
		want = append(want, fmt.Sprintf("a-%d", i))
		if i < 45 {
			want = append(want, fmt.Sprintf("b-%d", i))
		}
		if i == 0 {
			want = append(want, "c-0")
		}
	}
	if g, w := bodies(got), strings.Join(want, " ")+" "; g != w {
		t.Fatalf("order:\n got %s\nwant %s", g, w)
	}
	for _, q := range []string{"a", "b", "c"} {
		if n := f.b.QueueLen(q); n != 0 {
			t.Errorf("%s still has %d queued", q, n)
		}
	}
}

// TestGetJobCapsReplyBytes: a GETJOB stops taking jobs once their replies
// would pass MaxGetBytes, leaving the rest queued in order for the next
// one; a job larger than that on its own is still delivered, alone.
func TestGetJobCapsReplyBytes(t *testing.T) {
	f := newFixture(t, 1024)
	const size = 512 << 10
	const n = 12 // 6 MiB
	for i := range n {
		f.add("q", fmt.Sprintf("%02d", i)+strings.Repeat("x", size-2), nil)
	}
	perReply := int(MaxGetBytes / (size + 128)) // 7
	next := 0
	for next < n {
		got := f.get(1000, "q")
		var sum int64
		for _, d := range got {
			if want := fmt.Sprintf("%02d", next); string(d.Body[:2]) != want {
				t.Fatalf("got job %s, want %s", d.Body[:2], want)
			}
			next++
			sum += int64(len(d.Body)) + int64(len(d.ID)) + int64(len(d.Queue)) + 64
		}
		if sum > MaxGetBytes || len(got) == 0 || len(got) != min(perReply, n-(next-len(got))) {
			t.Fatalf("a GETJOB got %d jobs, %d bytes (limit %d): want %d", len(got), sum, MaxGetBytes, perReply)
		}
		if left := f.b.QueueLen("q"); left != int64(n-next) {
			t.Fatalf("%d queued after delivering %d of %d", left, next, n)
		}
	}

	huge := bytes.Repeat([]byte("h"), int(MaxGetBytes)+1)
	f.add("big", string(huge), nil)
	f.add("big", "small", nil)
	if got := f.get(10, "big"); len(got) != 1 || len(got[0].Body) != len(huge) {
		t.Fatalf("a job over MaxGetBytes: got %d jobs", len(got))
	}
	if got := f.get(10, "big"); len(got) != 1 || string(got[0].Body) != "small" {
		t.Fatalf("after it: got %q", bodies(got))
	}
}

// TestGetJobCapsCount: COUNT above MaxGetCount delivers MaxGetCount jobs
// (a smaller cap under the race detector, which makes the adds slow).
func TestGetJobCapsCount(t *testing.T) {
	f := newFixture(t, 1024)
	limit := MaxGetCount
	if raceEnabled {
		limit = 1000
		f.b.maxGetCount = limit
	}
	f.addMany("q", limit+5, nil)
	if got := f.get(1_000_000, "q"); len(got) != limit {
		t.Fatalf("COUNT 1000000 delivered %d jobs, want the cap (%d)", len(got), limit)
	}
	if got := f.get(1_000_000, "q"); len(got) != 5 {
		t.Fatalf("then %d jobs, want the 5 left", len(got))
	}
}

// TestGetJobWhileFailedIsBounded: while the store has failed, GETJOB is
// chunked and capped alike: at most getChunk jobs per hold, a reply at
// MaxGetBytes, and a job left out for the byte budget is the next GETJOB's
// first, in order.
func TestGetJobWhileFailedIsBounded(t *testing.T) {
	mem := vfs.NewCrashableMem()
	var failing atomic.Bool
	f := newFixture(t, 4)
	f.close()
	f.fs = errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failing.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errorfs.ErrInjected
		}
		return nil
	}))
	f.open()
	const size = 1 << 20
	for i := range 6 {
		f.add("big", fmt.Sprintf("%02d", i)+strings.Repeat("x", size-2), nil)
	}
	f.addMany("small", 7, nil)
	if err := f.st.Sync(); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	if res := f.b.AddJobs([]AddRequest{{Queue: "q", Body: []byte("lost"), TTL: 100, Retry: 10}}); res[0].Err == nil {
		t.Fatal("ADDJOB on a failing disk succeeded")
	}
	var order []string
	for _, want := range []int{3, 3} {
		got := f.get(100, "big")
		if len(got) != want {
			t.Fatalf("GETJOB while failed: %d jobs of 1 MiB, want %d", len(got), want)
		}
		for _, d := range got {
			order = append(order, string(d.Body[:2]))
		}
	}
	if strings.Join(order, " ") != "00 01 02 03 04 05" {
		t.Fatalf("order: %v", order)
	}
	f.b.getChunk = 2
	var holds []int
	f.b.testGetHoldHook = func(n int) { holds = append(holds, n) }
	got := f.get(100, "small")
	f.b.testGetHoldHook = nil
	if len(got) != 7 || !slices.Equal(holds, []int{2, 2, 2, 1}) {
		t.Fatalf("GETJOB of 7 while failed: %d jobs in holds %v, want 7 in 2, 2, 2, 1", len(got), holds)
	}
}
