package gc

import (
	"bytes"
	"errors"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

const segSize = 64 << 10

// openStore opens a store on a real directory with 64 KiB segments and no
// background checkpoints, so the tests decide when checkpoints happen.
func openStore(t *testing.T, dir string) *storage.Store {
	t.Helper()
	o := storage.TestingOptions()
	o.FS = vfs.Default
	o.Sync = wal.SyncNever
	o.SegmentSize = segSize
	o.Logger = slog.New(slog.DiscardHandler)
	s, err := storage.Open(dir, o)
	if err != nil {
		t.Fatal(err)
	}
	// Close is idempotent: a test that closed the store itself is not
	// affected, one that did not leaks nothing (TestMain checks).
	t.Cleanup(func() { s.Close() })
	return s
}

func quietOptions() Options {
	return Options{Interval: -1, Logger: slog.New(slog.DiscardHandler)}
}

// body is n incompressible bytes, different for every seed.
func body(seed, n int) []byte {
	b := make([]byte, n)
	rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16), 7}).Read(b)
	return b
}

type fixture struct {
	t      *testing.T
	s      *storage.Store
	seq    uint64
	bodies map[string][]byte // the live jobs and their bodies
}

// add stores a job; delayed ones wait for a month, the others are queued.
func (f *fixture) add(n int, delayed bool) *storage.Job {
	f.t.Helper()
	f.seq++
	j := &storage.Job{
		ID:    storage.NewJobID(f.s.NodeID(), 3600, 60),
		Queue: "q",
		State: storage.StateQueued,
		Ctime: f.seq,
		Retry: 60,
		Repl:  1,
	}
	if delayed {
		j.State, j.AwakeTime = storage.StateActive, 1<<50
	}
	b := body(int(f.seq), n)
	if err := f.s.Add(j, b); err != nil {
		f.t.Fatal(err)
	}
	f.bodies[j.ID] = b
	return j
}

func (f *fixture) del(id string) {
	f.t.Helper()
	if err := f.s.Delete(id); err != nil {
		f.t.Fatal(err)
	}
	delete(f.bodies, id)
}

// check asserts every live job is there with its body.
func (f *fixture) check(s *storage.Store) {
	f.t.Helper()
	for id, want := range f.bodies {
		j, err := s.Job(id)
		if err != nil {
			f.t.Fatalf("job %s: %v", id, err)
		}
		if got, err := s.Body(j); err != nil || !bytes.Equal(got, want) {
			f.t.Fatalf("body of %s: %d bytes, %v", id, len(got), err)
		}
	}
	if st := s.Stats(); st.Jobs != int64(len(f.bodies)) {
		f.t.Fatalf("store has %d jobs, want %d", st.Jobs, len(f.bodies))
	}
}

func (f *fixture) liveBytes() (n int64) {
	for _, b := range f.bodies {
		n += int64(len(b))
	}
	return n
}

func aofBytes(t *testing.T, dir string) int64 {
	t.Helper()
	var n int64
	err := filepath.WalkDir(filepath.Join(dir, "aof"), func(_ string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		info, err := d.Info()
		if err == nil {
			n += info.Size()
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestCollectRewritesSparseSegments: segments where one job in eight
// survived are rewritten and removed; dense ones are left alone.
func TestCollectRewritesSparseSegments(t *testing.T) {
	dir := t.TempDir()
	f := &fixture{t: t, s: openStore(t, dir), bodies: map[string][]byte{}}
	for i := range 400 { // dense: about 6 segments, all live
		f.add(1000, i%2 == 0)
	}
	for i := range 1600 { // sparse: one in eight lives
		j := f.add(1000, false)
		if i%8 != 0 {
			f.del(j.ID)
		}
	}
	if err := f.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	before := aofBytes(t, dir)
	c, err := New(f.s, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	rep, err := c.Collect(false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rewritten < 15 || rep.Removed < int64(rep.Rewritten) || rep.BodiesMoved < 150 {
		t.Fatalf("report %+v", rep)
	}
	after := aofBytes(t, dir)
	if want := f.liveBytes()*5/4 + 2*segSize; after > want {
		t.Fatalf("aof is %d bytes after the collection (%d before) for %d live bytes; want at most %d",
			after, before, f.liveBytes(), want)
	}
	// The dense segments were not copied: less was moved than the sparse
	// survivors plus one segment.
	if rep.BytesMoved > 200*1000+segSize {
		t.Fatalf("moved %d bytes; the dense segments should have stayed", rep.BytesMoved)
	}
	f.check(f.s)
	// The segment that was active during the first collection is sealed
	// now, and may be sparse; after it, nothing is left to do.
	n := 1
	for ; n < 4; n++ {
		rep, err := c.Collect(false)
		if err != nil {
			t.Fatal(err)
		}
		if rep.Rewritten == 0 {
			break
		}
		if rep.Rewritten > 1 {
			t.Fatalf("collection %d rewrote %d segments after the first did the work", n+1, rep.Rewritten)
		}
	}
	if n == 4 {
		t.Fatal("collections never settle")
	}
	st := c.Stats()
	if st.Collections != int64(n+1) || st.Running || st.LastErr != nil {
		t.Fatalf("stats %+v", st)
	}
	c.Close()
	if err := f.s.Close(); err != nil {
		t.Fatal(err)
	}
	s := openStore(t, dir)
	defer s.Close()
	f.check(s)
}

// TestChurnKeepsTheAOFBounded is the churn benchmark in miniature: jobs
// added and deleted by the thousand beside a standing backlog of delayed
// jobs, with the collector running as the server runs it. The AOF stays
// under three times the live data plus two segments.
func TestChurnKeepsTheAOFBounded(t *testing.T) {
	dir := t.TempDir()
	f := &fixture{t: t, s: openStore(t, dir), bodies: map[string][]byte{}}
	c, err := New(f.s, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var backlog []*storage.Job
	var peak int64
	for round := range 40 {
		// A few long-lived jobs arrive in every round, so they are spread
		// through the churn rather than packed at the front.
		for range 5 {
			backlog = append(backlog, f.add(1024, true))
		}
		for range 100 {
			f.del(f.add(1024, false).ID)
		}
		if round%4 == 3 {
			if err := f.s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			if _, err := c.Collect(false); err != nil {
				t.Fatal(err)
			}
			peak = max(peak, aofBytes(t, dir))
		}
	}
	live := f.liveBytes()
	if bound := 3*live + 2*segSize; peak > bound {
		t.Fatalf("aof peaked at %d bytes for %d live bytes; bound %d", peak, live, bound)
	}
	if len(f.bodies) != len(backlog) {
		t.Fatalf("%d live jobs, want the %d delayed ones", len(f.bodies), len(backlog))
	}
	f.check(f.s)
	t.Logf("%d delayed jobs (%d live bytes) beside 4000 churned: aof peak %d bytes, %d collections",
		len(backlog), live, peak, c.Stats().Collections)
}

// TestFullCollection is BGREWRITEAOF: every sealed segment with a live body
// is rewritten, dense or not, and the order index is compacted.
func TestFullCollection(t *testing.T) {
	dir := t.TempDir()
	f := &fixture{t: t, s: openStore(t, dir), bodies: map[string][]byte{}}
	for i := range 600 {
		j := f.add(1000, false)
		if i%4 == 0 {
			f.del(j.ID) // three in four live: no background collection would touch these
		}
	}
	opts := quietOptions()
	c, err := New(f.s, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rep, err := c.Collect(false); err != nil || rep.Rewritten != 0 {
		t.Fatalf("background policy rewrote dense segments: %+v, %v", rep, err)
	}
	rep, err := c.Collect(true)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Full || rep.Rewritten < 5 || !rep.Compacted {
		t.Fatalf("full collection report %+v", rep)
	}
	if got, want := aofBytes(t, dir), f.liveBytes()*11/10+2*segSize; got > want {
		t.Fatalf("aof is %d bytes after a full collection; live %d, want at most %d", got, f.liveBytes(), want)
	}
	if st := f.s.Stats().Collect; st.IndexCompactions != 1 {
		t.Fatalf("index compactions %d, want 1", st.IndexCompactions)
	}
	f.check(f.s)
}

func TestStartIsSingleFlight(t *testing.T) {
	f := &fixture{t: t, s: openStore(t, t.TempDir()), bodies: map[string][]byte{}}
	defer f.s.Close()
	c, err := New(f.s, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	c.run.Lock() // a collection is running
	if err := c.Start(true); !errors.Is(err, ErrBusy) {
		t.Fatalf("Start during a collection: %v, want ErrBusy", err)
	}
	if !c.Stats().Running {
		t.Fatal("Stats does not report the running collection")
	}
	c.run.Unlock()
	if err := c.Start(true); err != nil {
		t.Fatal(err)
	}
	c.Close() // waits for the started collection
	if st := c.Stats(); st.FullCollections != 1 || st.LastErr != nil || st.Running {
		t.Fatalf("stats after a started collection: %+v", st)
	}
}

// TestStartRacesClose: a Start concurrent with Close either runs a
// collection that Close waits for or is refused; once Close has returned
// no collection runs and Start and Collect are refused (they would read a
// store the daemon is about to close).
func TestStartRacesClose(t *testing.T) {
	f := &fixture{t: t, s: openStore(t, t.TempDir()), bodies: map[string][]byte{}}
	for i := range 20 {
		f.add(100, i%2 == 0)
	}
	for range 20 {
		c, err := New(f.s, quietOptions())
		if err != nil {
			t.Fatal(err)
		}
		started := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			c.Start(false) // before Close: runs, or ErrBusy
			close(started)
			for !errors.Is(c.Start(false), ErrClosed) {
			}
		}()
		<-started
		c.Close()
		if c.Stats().Running {
			t.Fatal("a collection runs after Close returned")
		}
		<-done
		if err := c.Start(true); !errors.Is(err, ErrClosed) {
			t.Fatalf("Start after Close: %v, want ErrClosed", err)
		}
		if _, err := c.Collect(true); !errors.Is(err, ErrClosed) {
			t.Fatalf("Collect after Close: %v, want ErrClosed", err)
		}
	}
}

func TestCompactAfterDeletes(t *testing.T) {
	f := &fixture{t: t, s: openStore(t, t.TempDir()), bodies: map[string][]byte{}}
	defer f.s.Close()
	opts := quietOptions()
	opts.CompactAfterDeletes = 50
	c, err := New(f.s, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for range 30 {
		f.del(f.add(100, false).ID) // one queue-order key deleted each
	}
	if rep, _ := c.Collect(false); rep.Compacted {
		t.Fatal("compacted after 30 deletes, threshold 50")
	}
	for range 30 {
		f.del(f.add(100, false).ID)
	}
	if rep, err := c.Collect(false); err != nil || !rep.Compacted {
		t.Fatalf("no compaction after 60 deletes: %+v, %v", rep, err)
	}
	if rep, _ := c.Collect(false); rep.Compacted {
		t.Fatal("compacted again with no new deletes")
	}
}

func TestOptionsValidate(t *testing.T) {
	for _, r := range []float64{-0.1, 1.5} {
		if _, err := New(nil, Options{MinLiveRatio: r}); err == nil {
			t.Errorf("MinLiveRatio %v accepted", r)
		}
	}
}

// TestDrainingSegmentsWait: a sparse segment that lost live bodies since the
// previous collection (consumers are draining it) is left alone; once it
// holds still, the next collection rewrites it.
func TestDrainingSegmentsWait(t *testing.T) {
	dir := t.TempDir()
	f := &fixture{t: t, s: openStore(t, dir), bodies: map[string][]byte{}}
	var jobs []*storage.Job
	for range 400 { // about 6 segments, all live
		jobs = append(jobs, f.add(1000, false))
	}
	if err := f.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	c, err := New(f.s, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if rep, err := c.Collect(false); err != nil || rep.Rewritten != 0 {
		t.Fatalf("dense segments: %+v, %v", rep, err)
	}
	// Drain seven jobs in eight, as consumers taking the queue would.
	for i, j := range jobs {
		if i%8 != 0 {
			f.del(j.ID)
		}
	}
	if err := f.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if rep, err := c.Collect(false); err != nil || rep.Rewritten != 0 {
		t.Fatalf("segments drained since the last collection were rewritten: %+v, %v", rep, err)
	}
	rep, err := c.Collect(false)
	if err != nil || rep.Rewritten < 4 || rep.BodiesMoved < 40 {
		t.Fatalf("settled sparse segments were not rewritten: %+v, %v", rep, err)
	}
	f.check(f.s)
}
