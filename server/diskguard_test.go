package server

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/gc"
	"github.com/diskque/diskque/internal/spacefs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// limitedStore opens a store in a real directory on a "disk" of room bytes
// beyond what the new store takes (spacefs), with 4 MiB segments and a
// 1 MiB index memtable, so that index flushes happen too.
func limitedStore(t *testing.T, room int64) (*storage.Store, *spacefs.FS) {
	t.Helper()
	fs := spacefs.New(vfs.Default, 1<<40)
	opts := storage.TestingOptions()
	opts.FS = fs
	opts.Sync = wal.SyncNever
	opts.SegmentSize = 4 << 20
	opts.WriteBufferSize = 64 << 10
	opts.ReadOnlyBelow = -1
	opts.Logger = slog.New(slog.DiscardHandler)
	st, err := storage.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	fs.SetLimit(fs.Used() + room)
	return st, fs
}

func serveBroker(t *testing.T, st *storage.Store, opts Options) (*Server, string) {
	t.Helper()
	b, err := queue.New(queue.Options{Store: st})
	if err != nil {
		t.Fatal(err)
	}
	go b.Run()
	t.Cleanup(b.Close) // after the server's Close, registered below
	opts.Logger = slog.New(slog.DiscardHandler)
	s, addr := startServerOpts(t, "127.0.0.1:0", opts)
	s.SetBroker(b)
	return s, addr
}

// produce pipelines batches of ADDJOBs of body on one connection until a
// reply is not a job id, and returns that reply and how many were added.
func produce(addr string, body []byte, batch int) (string, int, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return "", 0, err
	}
	defer c.Close()
	cmd := fmt.Appendf(nil, "*4\r\n$6\r\nADDJOB\r\n$1\r\nq\r\n$%d\r\n%s\r\n$1\r\n0\r\n", len(body), body)
	var pipeline []byte
	for range batch {
		pipeline = append(pipeline, cmd...)
	}
	r := bufio.NewReader(c)
	added := 0
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); {
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := c.Write(pipeline); err != nil {
			return "", added, err
		}
		var stop string
		for range batch {
			reply, err := readResp(r)
			if err != nil {
				return "", added, err
			}
			if !strings.HasPrefix(reply, "+D-") {
				if stop == "" {
					stop = reply
				}
				continue
			}
			added++
		}
		if stop != "" {
			return stop, added, nil
		}
	}
	return "", added, fmt.Errorf("still adding after 30 s (%d jobs)", added)
}

// TestMinFreeDiskHoldsAgainstAFastProducer: producers of 64 KiB bodies at
// full speed, on a disk with 24 MiB left and min-free-disk 4 MiB, meet
// -NOSPACE and never the full disk: no write fails, the store does not fail,
// and it still takes acks. The guard's interval is an hour, so its one
// reading is the first: what holds the reserve is the accounting of what
// was written since and reserved before each write, not a poll that
// happens to come in time (at 250 ms, one producer went from 50 MB free to
// ENOSPC without a -NOSPACE).
func TestMinFreeDiskHoldsAgainstAFastProducer(t *testing.T) {
	const room, reserve = 24 << 20, 4 << 20
	st, fs := limitedStore(t, room)
	_, addr := serveBroker(t, st, Options{MinFreeDisk: reserve, GuardInterval: time.Hour})

	body := make([]byte, 64<<10)
	rand.Read(body) // incompressible
	const producers = 2
	var wg sync.WaitGroup
	stops := make([]string, producers)
	errs := make([]error, producers)
	added := make([]int, producers)
	for i := range producers {
		wg.Go(func() { stops[i], added[i], errs[i] = produce(addr, body, 32) })
	}
	wg.Wait()
	total := 0
	for i := range producers {
		if errs[i] != nil {
			t.Fatalf("producer %d: %v", i, errs[i])
		}
		if !strings.HasPrefix(stops[i], "-NOSPACE ") {
			t.Errorf("producer %d stopped at %q after %d jobs, want -NOSPACE", i, stops[i], added[i])
		}
		total += added[i]
	}
	if n := fs.Refused(); n > 0 || st.Failing() {
		t.Fatalf("the disk filled: %d writes got ENOSPC, store failing %v (%v); %d jobs added", n, st.Failing(), st.Err(), total)
	}
	// Most of the room was used (the reservation is not wildly pessimistic),
	// and the reserve is still free.
	if used := int64(total) * int64(len(body)); used < room-2*reserve {
		t.Errorf("only %d jobs (%d bytes) added before -NOSPACE with %d bytes of room above %d reserved", total, used, room-reserve, reserve)
	}
	if free := fs.Free(); free < reserve/2 {
		t.Errorf("%d bytes free after -NOSPACE, want about min-free-disk (%d)", free, reserve)
	}
	rc := dialResp(t, addr)
	got := rc.do("GETJOB NOHANG FROM q")
	id, ok := jobIDOf(got)
	if !ok {
		t.Fatalf("GETJOB after -NOSPACE: %q", truncate(got, 200))
	}
	if got := rc.do("ACKJOB " + id); got != ":1" {
		t.Fatalf("ACKJOB after -NOSPACE: %q", got)
	}
}

// jobIDOf finds the job id in a GETJOB reply as respConn.read renders it.
func jobIDOf(reply string) (string, bool) {
	for _, f := range strings.Fields(reply) {
		if id, ok := strings.CutPrefix(f, "$D-"); ok {
			return "D-" + id, true
		}
	}
	return "", false
}

// TestBgRewriteAOFKeepsAboveMinFreeDisk: with the disk down to min-free-disk
// (ADDJOB already refused), BGREWRITEAOF would copy every live body forward
// and fill the disk; it does not start, says so (-NOSPACE, and INFO's
// gc_last_skip_reason), and the store is unharmed. Once the jobs are gone,
// it runs.
func TestBgRewriteAOFKeepsAboveMinFreeDisk(t *testing.T) {
	const room, reserve = 16 << 20, 4 << 20
	st, fs := limitedStore(t, room)
	s, addr := serveBroker(t, st, Options{MinFreeDisk: reserve, GuardInterval: 5 * time.Millisecond})
	col, err := gc.New(st, gc.Options{Interval: -1, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(col.Close)
	s.SetCollector(col)

	body := make([]byte, 64<<10)
	rand.Read(body)
	stop, added, err := produce(addr, body, 16)
	if err != nil || !strings.HasPrefix(stop, "-NOSPACE ") {
		t.Fatalf("filling the disk: %q after %d jobs, %v", truncate(stop, 200), added, err)
	}
	rc := dialResp(t, addr)
	if got := rc.do("BGREWRITEAOF"); !strings.HasPrefix(got, "-NOSPACE Background append only file rewriting not started: ") {
		t.Fatalf("BGREWRITEAOF %d bytes above min-free-disk with %d bytes of jobs: %q", fs.Free()-reserve, added*len(body), got)
	}
	if got := infoField(rc, "storage", "gc_last_skip_reason"); !strings.Contains(got, "would write") {
		t.Errorf("gc_last_skip_reason:%s", got)
	}
	if got := infoField(rc, "storage", "gc_skipped_for_space"); got != "1" {
		t.Errorf("gc_skipped_for_space:%s, want 1", got)
	}
	if got := infoField(rc, "persistence", "aof_rewrite_in_progress"); got != "0" {
		t.Errorf("aof_rewrite_in_progress:%s after a refused BGREWRITEAOF", got)
	}
	if n := fs.Refused(); n > 0 || st.Failing() {
		t.Fatalf("the disk filled: %d writes got ENOSPC, store failing %v (%v)", n, st.Failing(), st.Err())
	}
	if got := rc.do("QLEN q"); got != fmt.Sprintf(":%d", added) {
		t.Fatalf("QLEN q %s, want %d", got, added)
	}

	// Most jobs acked: what is left to copy fits.
	for i := range added - 3 {
		got := rc.do("GETJOB NOHANG FROM q")
		id, ok := jobIDOf(got)
		if !ok {
			t.Fatalf("GETJOB %d: %q", i, truncate(got, 200))
		}
		if got := rc.do("ACKJOB " + id); got != ":1" {
			t.Fatalf("ACKJOB: %q", got)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := rc.do("BGREWRITEAOF")
		if got == "+Background append only file rewriting started" {
			break
		}
		if time.Now().After(deadline) { // the guard's next reading is 5 ms away
			t.Fatalf("BGREWRITEAOF with 3 jobs left: %q", got)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for infoField(rc, "storage", "gc_full_collections") != "1" || infoField(rc, "persistence", "aof_rewrite_in_progress") != "0" {
		if time.Now().After(deadline) {
			t.Fatal("the collection did not finish")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if got := infoField(rc, "persistence", "aof_last_bgrewrite_status"); got != "ok" {
		t.Errorf("aof_last_bgrewrite_status:%s", got)
	}
	if n := fs.Refused(); n > 0 || st.Failing() {
		t.Fatalf("after the collection: %d writes got ENOSPC, store failing %v (%v)", n, st.Failing(), st.Err())
	}
	if got := rc.do("QLEN q"); got != ":3" {
		t.Fatalf("QLEN q %s after the collection, want 3", got)
	}
}
