package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/diskque/diskque/storage"
)

// fakeClock is the broker's clock in tests: time moves only when told.
type fakeClock struct{ ms atomic.Int64 }

func (c *fakeClock) now() time.Time { return time.UnixMilli(c.ms.Load()) }
func (c *fakeClock) set(ms int64)   { c.ms.Store(ms) }
func (c *fakeClock) advance(d time.Duration) int64 {
	return c.ms.Add(d.Milliseconds())
}

type fixture struct {
	t     *testing.T
	fs    vfs.FS
	clock *fakeClock
	st    *storage.Store
	b     *Broker
	head  int
	mod   func(*Options) // if set, adjusts the broker's options at each open
}

func newFixture(t *testing.T, headSize int) *fixture {
	f := &fixture{t: t, fs: vfs.NewCrashableMem(), clock: &fakeClock{}, head: headSize}
	f.clock.set(1_700_000_000_000)
	f.open()
	t.Cleanup(f.close)
	return f
}

func (f *fixture) open() {
	f.t.Helper()
	opts := storage.TestingOptions()
	opts.FS = f.fs
	st, err := storage.Open("data", opts)
	if err != nil {
		f.t.Fatal(err)
	}
	bopts := Options{Store: st, HeadSize: f.head, Now: f.clock.now}
	if f.mod != nil {
		f.mod(&bopts)
	}
	b, err := New(bopts)
	if err != nil {
		f.t.Fatal(err)
	}
	f.st, f.b = st, b
}

func (f *fixture) close() {
	if f.b != nil {
		f.b.mu.Lock()
		f.b.closed = true
		f.b.mu.Unlock()
		f.st.Close()
		f.b, f.st = nil, nil
	}
}

func (f *fixture) restart() {
	f.close()
	f.open()
}

func (f *fixture) add(queue, body string, mod func(*AddRequest)) string {
	f.t.Helper()
	r := AddRequest{Queue: queue, Body: []byte(body), TTL: 86400, Retry: 300}
	if mod != nil {
		mod(&r)
	}
	res := f.b.AddJobs([]AddRequest{r})
	if res[0].Err != nil {
		f.t.Fatalf("add %s: %v", body, res[0].Err)
	}
	return res[0].ID
}

func (f *fixture) get(count int, queues ...string) []Delivered {
	f.t.Helper()
	d, err := f.b.GetJobs(context.Background(), GetRequest{Queues: queues, Count: count, NoHang: true})
	if err != nil {
		f.t.Fatal(err)
	}
	return d
}

// blockedGet runs a GETJOB that must block, in a goroutine, and returns
// once the broker counts it as blocked; its jobs arrive on the channel.
func (f *fixture) blockedGet(req GetRequest) <-chan []Delivered {
	f.t.Helper()
	got := make(chan []Delivered, 1)
	go func() {
		d, err := f.b.GetJobs(context.Background(), req)
		if err != nil {
			f.t.Error(err)
		}
		got <- d
	}()
	waitFor(f.t, "the GETJOB never blocked", func() bool { return f.b.Stats().BlockedClients == 1 })
	return got
}

func bodies(ds []Delivered) string {
	s := ""
	for _, d := range ds {
		s += string(d.Body) + " "
	}
	return s
}

func TestQueueOrderThroughRefillsAndRestart(t *testing.T) {
	f := newFixture(t, 3) // a tiny head: most of the queue lives on disk
	for i := 0; i < 20; i++ {
		f.add("q", fmt.Sprint(i), nil)
	}
	if got := bodies(f.get(4, "q")); got != "0 1 2 3 " {
		t.Fatalf("first four: %q", got)
	}
	f.restart()
	if got := f.b.QueueLen("q"); got != 16 {
		t.Fatalf("qlen after restart %d", got)
	}
	if got := bodies(f.get(5, "q")); got != "4 5 6 7 8 " {
		t.Fatalf("after restart: %q", got)
	}
	all := ""
	for {
		d := f.get(2, "q")
		if len(d) == 0 {
			break
		}
		all += bodies(d)
	}
	if all != "9 10 11 12 13 14 15 16 17 18 19 " {
		t.Fatalf("rest: %q", all)
	}
}

func TestRoundRobinAcrossQueues(t *testing.T) {
	f := newFixture(t, 1024)
	for i := 0; i < 3; i++ {
		f.add("a", fmt.Sprint("a", i), nil)
		f.add("b", fmt.Sprint("b", i), nil)
	}
	if got := bodies(f.get(5, "a", "b")); got != "a0 b0 a1 b1 a2 " {
		t.Fatalf("round robin: %q", got)
	}
}

func TestBlockedClientIsServedByAdd(t *testing.T) {
	f := newFixture(t, 1024)
	got := f.blockedGet(GetRequest{Queues: []string{"x", "q"}, Count: 5})
	id := f.add("q", "hello", nil)
	d := <-got
	if len(d) != 1 || d[0].ID != id || string(d[0].Body) != "hello" {
		t.Fatalf("blocked client got %+v", d)
	}
	if f.b.Stats().BlockedClients != 0 || f.b.QueueLen("q") != 0 {
		t.Fatalf("after serving: %+v qlen %d", f.b.Stats(), f.b.QueueLen("q"))
	}
	// A timeout returns nothing.
	d, err := f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"q"}, Count: 1, Timeout: 10 * time.Millisecond})
	if err != nil || d != nil {
		t.Fatalf("timeout: %v %v", d, err)
	}
	if f.b.Stats().BlockedClients != 0 {
		t.Fatal("timed-out client still registered")
	}
}

func TestDelayRetryAndTTLFireOnTime(t *testing.T) {
	f := newFixture(t, 1024)
	start := f.clock.ms.Load()
	delayed := f.add("q", "delayed", func(r *AddRequest) { r.Delay = 10 })
	retried := f.add("q", "retried", func(r *AddRequest) { r.Retry = 5 })
	expiring := f.add("q", "expiring", func(r *AddRequest) { r.TTL = 30; r.Retry = 20 })
	if d := f.get(1, "q"); len(d) != 1 || d[0].ID != retried {
		t.Fatalf("first delivery: %+v", d)
	}
	tick := func(at int64) {
		t.Helper()
		f.clock.set(at)
		if err := f.b.Tick(at); err != nil {
			t.Fatal(err)
		}
	}
	tick(start + 4_000) // nothing due yet (retry jitter is at most 500 ms)
	if f.b.QueueLen("q") != 1 {
		t.Fatalf("qlen %d before any timer", f.b.QueueLen("q"))
	}
	tick(start + 5_600) // the retry fired: queued again
	j, _, err := f.b.Job(retried)
	if err != nil || j.State != storage.StateQueued || j.AdditionalDeliveries != 1 {
		t.Fatalf("after retry: %+v %v", j, err)
	}
	tick(start + 10_000) // the delay ran out
	if j, _, _ := f.b.Job(delayed); j.State != storage.StateQueued {
		t.Fatalf("delayed job is %s at its time", j.State)
	}
	// Restart before the TTL: the expiry must still happen at its time.
	f.restart()
	tick(start + 29_000)
	if _, _, err := f.b.Job(expiring); err != nil {
		t.Fatalf("expired early: %v", err)
	}
	tick(start + 30_000)
	if _, _, err := f.b.Job(expiring); err != ErrNoJob {
		t.Fatalf("not expired at its TTL: %v", err)
	}
	if got := bodies(f.get(10, "q")); got != "delayed retried " {
		t.Fatalf("queue after timers: %q", got)
	}
}

func TestAckNackEnqueueDequeueWorking(t *testing.T) {
	f := newFixture(t, 1024)
	a := f.add("q", "a", nil)
	b := f.add("q", "b", nil)
	if n, _ := f.b.Dequeue([]string{a, a, "D-nosuchjob-00000000000000000000000-0001"}); n != 1 {
		t.Fatalf("dequeue %d", n)
	}
	if got := bodies(f.get(5, "q")); got != "b " {
		t.Fatalf("after dequeue: %q", got)
	}
	if n, _ := f.b.Enqueue([]string{a}); n != 1 {
		t.Fatalf("enqueue %d", n)
	}
	if n, _ := f.b.Nack([]string{b}, 0); n != 1 {
		t.Fatalf("nack %d", n)
	}
	d := f.get(5, "q")
	if bodies(d) != "a b " || d[1].Nacks != 1 {
		t.Fatalf("after enqueue+nack: %+v", d)
	}
	if r, err := f.b.Working(a); err != nil || r != 300 {
		t.Fatalf("working: %d %v", r, err)
	}
	f.clock.advance(43201 * time.Second) // past half the TTL
	if _, err := f.b.Working(a); err != ErrTooLate {
		t.Fatalf("working late: %v", err)
	}
	if n, _ := f.b.Ack([]string{a, b, a}); n != 2 {
		t.Fatalf("ack %d", n)
	}
	if n, _ := f.b.Ack([]string{a}); n != 0 {
		t.Fatalf("second ack %d", n)
	}
	if _, err := f.b.Working(a); err != ErrNoJob {
		t.Fatalf("working on acked: %v", err)
	}
	if st := f.st.Stats(); st.Jobs != 0 {
		t.Fatalf("jobs left %d", st.Jobs)
	}
}

func TestPauseBlocksInputAndOutput(t *testing.T) {
	f := newFixture(t, 1024)
	f.add("q", "before", nil)
	if _, err := f.b.Pause("q", storage.PauseAll); err != nil {
		t.Fatal(err)
	}
	res := f.b.AddJobs([]AddRequest{{Queue: "q", Body: []byte("x"), TTL: 60, Retry: 6}})
	if res[0].Err != ErrPaused {
		t.Fatalf("add to paused queue: %v", res[0].Err)
	}
	if d := f.get(1, "q"); len(d) != 0 {
		t.Fatalf("delivered from a queue paused out: %+v", d)
	}
	f.restart()
	if f.b.PauseState("q") != storage.PauseAll {
		t.Fatalf("pause lost in restart: %v", f.b.PauseState("q"))
	}
	if _, err := f.b.Pause("q", storage.PauseNone); err != nil {
		t.Fatal(err)
	}
	if got := bodies(f.get(1, "q")); got != "before " {
		t.Fatalf("after unpause: %q", got)
	}
}

func TestMaxLenAndAtMostOnce(t *testing.T) {
	f := newFixture(t, 1024)
	res := f.b.AddJobs([]AddRequest{
		{Queue: "q", Body: []byte("1"), TTL: 60, Retry: 0, MaxLen: 2},
		{Queue: "q", Body: []byte("2"), TTL: 60, Retry: 0, MaxLen: 2},
		{Queue: "q", Body: []byte("3"), TTL: 60, Retry: 0, MaxLen: 2},
	})
	if res[0].Err != nil || res[1].Err != nil || res[2].Err != ErrMaxLen {
		t.Fatalf("maxlen: %+v", res)
	}
	d := f.get(1, "q")
	if len(d) != 1 {
		t.Fatal("no delivery")
	}
	// Delivered at-most-once: never queued again, not even by NACK.
	if n, _ := f.b.Nack([]string{d[0].ID}, 0); n != 0 {
		t.Fatalf("nack of a delivered at-most-once job changed %d", n)
	}
	if _, err := f.b.Working(d[0].ID); err != ErrNoJob {
		t.Fatalf("working on at-most-once: %v", err)
	}
}

func TestIdleEmptyQueuesAreForgotten(t *testing.T) {
	f := newFixture(t, 1024)
	for i := 0; i < 50; i++ {
		f.get(1, fmt.Sprint("nothing-", i)) // GETJOB on queues that never get a job
	}
	f.add("kept", "x", nil)
	if got := len(f.b.QueueNames()); got != 51 {
		t.Fatalf("%d queues known, want 51", got)
	}
	at := f.clock.advance(2 * time.Minute)
	if err := f.b.Tick(at); err != nil {
		t.Fatal(err)
	}
	names := f.b.QueueNames()
	if len(names) != 1 || names[0] != "kept" {
		t.Fatalf("after the sweep: %v", names)
	}
}

// TestFlushAllStartsAfresh: after FlushAll the heads hold nothing (a head
// refilled from disk would have served deleted jobs), no timer of a flushed
// job fires, a blocked client is served by the next ADDJOB, and jobs added
// after the flush, delayed ones included, behave.
func TestFlushAllStartsAfresh(t *testing.T) {
	f := newFixture(t, 4)
	start := f.clock.ms.Load()
	for i := range 20 {
		f.add("q", fmt.Sprint("old", i), nil)
	}
	f.add("q", "old delayed", func(r *AddRequest) { r.Delay = 5 })
	if _, err := f.b.Pause("p", storage.PauseAll); err != nil {
		t.Fatal(err)
	}
	got := f.blockedGet(GetRequest{Queues: []string{"w"}, Count: 1, Timeout: 10 * time.Second})
	if err := f.b.FlushAll(); err != nil {
		t.Fatal(err)
	}
	if n := f.b.QueueLen("q"); n != 0 {
		t.Fatalf("QLEN %d after FlushAll", n)
	}
	if d := f.get(10, "q"); len(d) != 0 {
		t.Fatalf("GETJOB after FlushAll served %q", bodies(d))
	}
	if p := f.b.PauseState("p"); p != storage.PauseNone {
		t.Fatalf("pause %v after FlushAll", p)
	}
	newDelayed := f.add("q", "new delayed", func(r *AddRequest) { r.Delay = 5 })
	f.add("q", "new", nil)
	f.clock.set(start + 6_000)
	if err := f.b.Tick(start + 6_000); err != nil {
		t.Fatal(err)
	}
	if got := bodies(f.get(10, "q")); got != "new delayed new " { // ctime order
		t.Fatalf("after FlushAll and the delay: %q", got)
	}
	if j, _, err := f.b.Job(newDelayed); err != nil || j.State != storage.StateActive {
		t.Fatalf("new delayed job: %+v, %v", j, err)
	}
	f.add("w", "for the waiter", nil)
	if d := <-got; len(d) != 1 || string(d[0].Body) != "for the waiter" {
		t.Fatalf("blocked client got %+v", d)
	}
	if n := f.st.Stats().Jobs; n != 3 {
		t.Fatalf("%d jobs, want the 3 added after the flush", n)
	}
}

// TestGetJobWhileTheStoreHasFailed: after an AOF failure GETJOB still hands
// out what an unrecorded delivery cannot hurt — durable at-least-once jobs,
// each once — and nothing else; a GETJOB that would block gets the failure;
// timers stand still. After the store is reopened those jobs are queued
// again (at-least-once), and the at-most-once job was never delivered.
func TestGetJobWhileTheStoreHasFailed(t *testing.T) {
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
	var want []string
	for i := range 10 {
		want = append(want, f.add("q", fmt.Sprint("job", i), nil))
	}
	once := f.add("q", "at most once", func(r *AddRequest) { r.Retry = 0 })
	if err := f.st.Sync(); err != nil {
		t.Fatal(err)
	}
	failing.Store(true)
	res := f.b.AddJobs([]AddRequest{{Queue: "q", Body: []byte("lost"), TTL: 100, Retry: 10}})
	if !errors.Is(res[0].Err, storage.ErrFailed) {
		t.Fatalf("ADDJOB on a failing disk: %v", res[0].Err)
	}
	var got []string
	for len(got) < 20 {
		d, err := f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"q"}, Count: 3, NoHang: true})
		if err != nil {
			t.Fatal(err)
		}
		if len(d) == 0 {
			break
		}
		for _, j := range d {
			got = append(got, j.ID)
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("delivered while failed: %v, want the 10 durable at-least-once jobs in order %v", got, want)
	}
	if _, err := f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"q"}, Count: 1, Timeout: time.Hour}); !errors.Is(err, storage.ErrFailed) {
		t.Fatalf("blocking GETJOB while failed: %v, want ErrFailed", err)
	}
	if _, err := f.b.Ack([]string{want[0]}); !errors.Is(err, storage.ErrFailed) {
		t.Fatalf("ACKJOB while failed: %v, want ErrFailed", err)
	}
	if err := f.b.Tick(f.clock.ms.Load() + 86_400_000); err != nil {
		t.Fatalf("Tick while failed: %v", err)
	}
	// The disk recovers; the daemon reopens the store under a new broker.
	failing.Store(false)
	f.restart()
	redo := f.get(20, "q")
	if len(redo) != 11 || redo[10].ID != once {
		t.Fatalf("after the reopen: %d jobs (%q), want the 10 again and the at-most-once one", len(redo), bodies(redo))
	}
}

// TestCtimeNeverGoesBackAcrossARestart: jobs added under a clock that is
// then stepped back an hour (NTP, a VM restored) keep their place at the
// front of the queue: the jobs added after the restart sort after them.
func TestCtimeNeverGoesBackAcrossARestart(t *testing.T) {
	f := newFixture(t, 2) // a small head: the backlog is read from disk
	var want []string
	for i := range 5 {
		want = append(want, f.add("q", fmt.Sprint("before ", i), nil))
	}
	f.clock.advance(-time.Hour)
	f.restart()
	for i := range 5 {
		want = append(want, f.add("q", fmt.Sprint("after ", i), nil))
	}
	var got []string
	for _, d := range f.get(10, "q") {
		got = append(got, d.ID)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("delivery order %q, want the jobs in the order they were added %q", got, want)
	}
}
