package storage

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// diskOpts are TestingOptions on the real filesystem with 64 KiB segments.
func diskOpts() Options {
	o := TestingOptions()
	o.FS = vfs.Default
	o.Sync = wal.SyncNever
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// kib is 1 KiB of incompressible bytes, so segments fill as the test counts.
func kib(seed int) []byte {
	b := make([]byte, 1024)
	r := rand.NewChaCha8([32]byte{byte(seed), byte(seed >> 8), byte(seed >> 16)})
	r.Read(b)
	return b
}

// churn adds, delivers and deletes n jobs of 1 KiB: the history a queue
// leaves behind it.
func churn(t *testing.T, s *Store, n int) {
	t.Helper()
	for i := range n {
		j := newTestJob(s.NodeID(), "churn", uint64(1000+i), 0)
		if err := s.Add(j, kib(i)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Deliver(j.ID, 0); err != nil {
			t.Fatal(err)
		}
		if err := s.Delete(j.ID); err != nil {
			t.Fatal(err)
		}
	}
}

func liveBodies(st Stats) (n int64) {
	for _, seg := range st.Segments {
		n += seg.LiveBodies
	}
	return n
}

// TestDeadSegmentsBehindALiveOneAreRemoved: a long-delayed job at the front
// of the log must not pin every segment of churn written after it.
func TestDeadSegmentsBehindALiveOneAreRemoved(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	keeper := newTestJob(s.NodeID(), "later", 1, 3)
	keeper.State, keeper.AwakeTime = StateActive, 1<<50
	if err := s.Add(keeper, []byte("wait for me")); err != nil {
		t.Fatal(err)
	}
	churn(t, s, 1500) // about 25 segments of 64 KiB
	if n := len(s.Stats().Segments); n < 10 {
		t.Fatalf("churn wrote only %d segments", n)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	// The keeper's segment and the active one stay; every dead one between
	// them goes, though it is not at the front.
	if len(st.Segments) > 3 || st.Segments[0].LiveBodies != 1 {
		t.Fatalf("after a checkpoint: %d segments (first has %d live bodies); collected %+v",
			len(st.Segments), st.Segments[0].LiveBodies, st.Collect)
	}
	if st.Collect.SegmentsRemoved < 10 || st.Collect.BytesReclaimed < 10*60<<10 {
		t.Fatalf("collect stats %+v", st.Collect)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, diskOpts())
	if err != nil {
		t.Fatalf("reopen with gaps in the aof: %v", err)
	}
	j, err := s.Job(keeper.ID)
	if err != nil {
		t.Fatal(err)
	}
	if b, err := s.Body(j); err != nil || string(b) != "wait for me" {
		t.Fatalf("keeper body %q, %v", b, err)
	}
	churn(t, s, 10) // and the log goes on
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	// A missing segment that holds a live body is loss, not a gap.
	if err := os.Remove(filepath.Join(dir, walDir, st.Segments[0].Name)); err != nil {
		t.Fatal(err)
	}
	if _, err := Open(dir, diskOpts()); err == nil || !bytes.Contains([]byte(err.Error()), []byte("missing but holds 1 live job bodies")) {
		t.Fatalf("open without the keeper's segment: %v", err)
	}
}

// TestRewriteSegmentMovesLiveBodies rewrites every sealed segment of a log
// where one job in ten survived, while another goroutine deletes jobs: no
// deleted job comes back, every live body is intact, and after a checkpoint
// only the segments the moves were written to remain.
func TestRewriteSegmentMovesLiveBodies(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	var live, doomed []*Job
	bodies := map[string][]byte{}
	for i := range 1200 {
		j := newTestJob(s.NodeID(), fmt.Sprintf("q%d", i%3), uint64(i+1), 3)
		body := append(kib(i), fmt.Sprint(i)...)
		if err := s.Add(j, body); err != nil {
			t.Fatal(err)
		}
		bodies[j.ID] = body
		switch {
		case i%10 == 0:
			live = append(live, j)
		case i%10 == 1:
			doomed = append(doomed, j) // deleted during the rewrite
		default:
			if err := s.Delete(j.ID); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	before := s.Stats()
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, j := range doomed {
			if err := s.Delete(j.ID); err != nil {
				t.Error(err)
				return
			}
		}
	})
	var moved int64
	for _, seg := range before.Segments {
		if seg.Active || seg.LiveBodies == 0 {
			continue
		}
		res, err := s.RewriteSegment(context.Background(), seg.First)
		if err != nil {
			t.Fatal(err)
		}
		moved += res.Moved
	}
	wg.Wait()
	if moved > int64(len(live)+len(doomed)) {
		t.Fatalf("moved %d bodies; %d live, %d deleted meanwhile", moved, len(live), len(doomed))
	}
	// Every live body is now in the segment that was active or later.
	activeFirst := before.Segments[len(before.Segments)-1].First
	for _, j := range live {
		got, err := s.Job(j.ID)
		if err != nil {
			t.Fatal(err)
		}
		if got.BodyLSN < activeFirst {
			t.Fatalf("job %s's body is still at lsn %d, in a rewritten segment", j.ID, got.BodyLSN)
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	if after.Jobs != int64(len(live)) || liveBodies(after) != int64(len(live)) {
		t.Fatalf("%d jobs, %d live bodies after the rewrite; want %d", after.Jobs, liveBodies(after), len(live))
	}
	for _, seg := range before.Segments {
		for _, now := range after.Segments {
			if !seg.Active && now.First == seg.First {
				t.Fatalf("rewritten segment %s survived the checkpoint: %+v", seg.Name, now)
			}
		}
	}
	var size int64
	for _, seg := range after.Segments {
		size += seg.Size
	}
	if want := int64(len(live)) * 1100; size > 2*want+64<<10 {
		t.Fatalf("aof is %d bytes for %d live 1 KiB bodies", size, len(live))
	}
	check := func(s *Store) {
		t.Helper()
		for _, j := range live {
			got, err := s.Job(j.ID)
			if err != nil {
				t.Fatal(err)
			}
			if b, err := s.Body(got); err != nil || !bytes.Equal(b, bodies[j.ID]) {
				t.Fatalf("body of %s after the rewrite: %d bytes, %v", j.ID, len(b), err)
			}
		}
		for _, j := range doomed {
			if _, err := s.Job(j.ID); !errors.Is(err, ErrNotFound) {
				t.Fatalf("deleted job %s: %v", j.ID, err)
			}
		}
	}
	check(s)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err = Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	check(s)
	if err := s.log.Verify(); err != nil {
		t.Fatal(err)
	}
}

func TestRewriteRefusesTheActiveSegment(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	segs := s.Stats().Segments
	if _, err := s.RewriteSegment(context.Background(), segs[len(segs)-1].First); err == nil {
		t.Fatal("rewrite of the active segment succeeded")
	}
	if _, err := s.RewriteSegment(context.Background(), 12345); !errors.Is(err, wal.ErrNotFound) {
		t.Fatalf("rewrite of no segment: %v", err)
	}
}

// TestCrashDuringRewrite crashes (clones the filesystem as a crash would
// leave it) before a rewrite, after each of its batches, after it and after
// the checkpoint that removes the rewritten segments. Every clone recovers
// every live job with its body and none of the deleted ones, and a collection
// run on the recovered store finishes the job.
func TestCrashDuringRewrite(t *testing.T) {
	for _, sync := range []wal.SyncPolicy{wal.SyncAlways, wal.SyncNever} {
		t.Run(sync.String(), func(t *testing.T) { testCrashDuringRewrite(t, sync) })
	}
}

func testCrashDuringRewrite(t *testing.T, sync wal.SyncPolicy) {
	fs := vfs.NewCrashableMem()
	opts := crashOpts(fs, sync)
	opts.SegmentSize = 64 << 10
	s, err := Open(eqDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	bodies := map[string][]byte{}
	var gone []string
	for i := range 600 {
		j := newTestJob(s.NodeID(), "q", uint64(i+1), 3)
		body := append(kib(i)[:512], fmt.Sprint(i)...)
		if err := s.Add(j, body); err != nil {
			t.Fatal(err)
		}
		if i%4 == 0 {
			bodies[j.ID] = body
			continue
		}
		if err := s.Delete(j.ID); err != nil {
			t.Fatal(err)
		}
		gone = append(gone, j.ID)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	var clones []*vfs.MemFS
	var names []string
	crash := func(name string) {
		clones = append(clones, fs.CrashClone(vfs.CrashCloneCfg{}))
		names = append(names, name)
	}
	crash("before")
	batch := 0
	testHookRewriteBatch = func() { batch++; crash(fmt.Sprintf("after batch %d", batch)) }
	defer func() { testHookRewriteBatch = nil }()
	segs := s.Stats().Segments
	for _, seg := range segs {
		if !seg.Active && seg.LiveBodies > 0 {
			if _, err := s.RewriteSegment(context.Background(), seg.First); err != nil {
				t.Fatal(err)
			}
		}
	}
	testHookRewriteBatch = nil
	if batch < 3 {
		t.Fatalf("the rewrite took %d batches; the test wants several", batch)
	}
	crash("after the rewrite")
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	crash("after the checkpoint")
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for i, clone := range clones {
		t.Run(names[i], func(t *testing.T) {
			s, err := Open(eqDir, crashOpts(clone, sync))
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			check := func() {
				t.Helper()
				for id, body := range bodies {
					j, err := s.Job(id)
					if err != nil {
						t.Fatalf("live job %s: %v", id, err)
					}
					if b, err := s.Body(j); err != nil || !bytes.Equal(b, body) {
						t.Fatalf("body of %s: %d bytes, %v", id, len(b), err)
					}
				}
				for _, id := range gone {
					if _, err := s.Job(id); !errors.Is(err, ErrNotFound) {
						t.Fatalf("deleted job %s is back: %v", id, err)
					}
				}
				if st := s.Stats(); liveBodies(st) != int64(len(bodies)) {
					t.Fatalf("%d live bodies accounted, want %d", liveBodies(st), len(bodies))
				}
			}
			check()
			// Finish the collection on the recovered store.
			for _, seg := range s.Stats().Segments {
				if !seg.Active && seg.LiveBodies > 0 {
					if _, err := s.RewriteSegment(context.Background(), seg.First); err != nil {
						t.Fatal(err)
					}
				}
			}
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			check()
		})
	}
}

// TestFlushAllIsOneRecord: FlushAll deletes every job, queue entry,
// schedule key and pause state with one record of range deletions; a
// reopen that replays it agrees, the node id stays, the store goes on, and
// the next checkpoint removes every segment written before it.
func TestFlushAllIsOneRecord(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	node := s.NodeID()
	for i := range 300 {
		j := newTestJob(node, fmt.Sprintf("q%d", i%4), uint64(i+1), 3)
		if i%3 == 0 {
			j.State, j.AwakeTime = StateActive, 1<<50
		}
		if err := s.Add(j, kib(i)); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Pause("q1", PauseAll); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil { // some of it is in the index on disk
		t.Fatal(err)
	}
	before := s.Stats()
	end := s.log.End()
	if err := s.FlushAll().Wait(); err != nil {
		t.Fatal(err)
	}
	if n := s.log.End() - end; n > 64 {
		t.Fatalf("FlushAll wrote %d AOF bytes", n)
	}
	empty := func(s *Store) {
		t.Helper()
		st := s.Stats()
		if st.Jobs != 0 || st.Queued != 0 || st.Queues != 0 || liveBodies(st) != 0 {
			t.Fatalf("after FlushAll: %+v", st)
		}
		if jobs, err := s.ScanJobs("", 10); err != nil || len(jobs) != 0 {
			t.Fatalf("ScanJobs after FlushAll: %d jobs, %v", len(jobs), err)
		}
		if evs, err := s.DueEvents(1<<62, Event{}, 10); err != nil || len(evs) != 0 {
			t.Fatalf("schedule after FlushAll: %v, %v", evs, err)
		}
		if p := s.PauseState("q1"); p != PauseNone {
			t.Fatalf("q1 paused %v after FlushAll", p)
		}
		if s.NodeID() != node {
			t.Fatalf("node id %s became %s", node, s.NodeID())
		}
	}
	empty(s)
	// Crash before any checkpoint: the replay applies the flush.
	if err := s.log.Sync(); err != nil {
		t.Fatal(err)
	}
	s.closeFilesForTest(t)
	s, err = Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	if s.RecoveryInfo().Records == 0 {
		t.Fatal("the reopen replayed nothing; the test meant to replay the flush")
	}
	empty(s)
	j := newTestJob(node, "after", 1, 3)
	if err := s.Add(j, []byte("after the flush")); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	after := s.Stats()
	if len(after.Segments) > 2 || after.Jobs != 1 {
		t.Fatalf("%d segments (%d before the flush), %d jobs after a checkpoint", len(after.Segments), len(before.Segments), after.Jobs)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// closeFilesForTest closes the store the way a crash leaves it: no
// checkpoint, the index's memtable lost.
func (s *Store) closeFilesForTest(t *testing.T) {
	t.Helper()
	close(s.ckptStop)
	<-s.ckptDone
	if err := s.closeFiles(); err != nil {
		t.Fatal(err)
	}
}

// TestRewriteStopsWhenCanceled: a canceled rewrite returns the context's
// error and what it moved before is safe; a later rewrite finishes.
func TestRewriteStopsWhenCanceled(t *testing.T) {
	s, err := Open(t.TempDir(), diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for i := range 300 {
		if err := s.Add(newTestJob(s.NodeID(), "q", uint64(i+1), 3), kib(i)); err != nil {
			t.Fatal(err)
		}
	}
	first := s.Stats().Segments[0]
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.RewriteSegment(ctx, first.First); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled rewrite: %v", err)
	}
	if got := s.Stats().Segments[0]; got.LiveBodies != first.LiveBodies {
		t.Fatalf("a rewrite canceled before it began moved %d bodies", first.LiveBodies-got.LiveBodies)
	}
	res, err := s.RewriteSegment(context.Background(), first.First)
	if err != nil || res.Moved != first.LiveBodies {
		t.Fatalf("rewrite after the canceled one: %+v, %v; want %d moved", res, err, first.LiveBodies)
	}
}

// TestBodyInARemovedSegmentChargesNoOther: a job whose body lies in a
// segment removed from the middle of the log (damage: the accounting says
// no live body was there) is deleted without charging the segment before the
// gap. The wal used to place such an LSN in that neighbour, whose live count
// then dropped below its real bodies, so a checkpoint could delete it.
func TestBodyInARemovedSegmentChargesNoOther(t *testing.T) {
	s, err := Open(t.TempDir(), diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var jobs []*Job
	for i := range 200 { // about three 64 KiB segments of live 1 KiB bodies
		j := newTestJob(s.NodeID(), "q", uint64(1+i), 0)
		if err := s.Add(j, kib(i)); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	segs := s.Stats().Segments
	if len(segs) < 3 {
		t.Fatalf("want 3 segments, got %d", len(segs))
	}
	// Remove the second segment behind the accounting's back.
	if err := s.log.RemoveSegments([]wal.LSN{segs[1].First}); err != nil {
		t.Fatal(err)
	}
	var victim *Job
	for _, j := range jobs {
		if j.BodyLSN >= segs[1].First && j.BodyLSN < segs[1].First+wal.LSN(segs[1].Size) {
			victim = j
			break
		}
	}
	before := s.Stats().Segments[0].LiveBodies
	if err := s.Delete(victim.ID); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if got := st.Segments[0].LiveBodies; got != before {
		t.Fatalf("segment before the gap: %d live bodies after deleting a job of the removed one, was %d", got, before)
	}
	if st.Collect.MisplacedBodies != 1 {
		t.Fatalf("MisplacedBodies = %d, want 1", st.Collect.MisplacedBodies)
	}
}

// TestBackgroundVerifyFindsOldDamage: damage below the checkpoint, which
// Open does not read, is found by the background verification after
// start-up and reported in Stats (INFO), while the store keeps serving.
func TestBackgroundVerifyFindsOldDamage(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 { // about five 64 KiB segments of live 1 KiB bodies
		if err := s.Add(newTestJob(s.NodeID(), "q", uint64(1+i), 0), kib(i)); err != nil {
			t.Fatal(err)
		}
	}
	segs := s.Stats().Segments
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	victim := segs[1]
	path := filepath.Join(dir, walDir, victim.Name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0x20
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	opts := diskOpts()
	opts.VerifyRate = 1 << 30
	s, err = Open(dir, opts)
	if err != nil {
		t.Fatalf("open with damage below the checkpoint: %v", err)
	}
	defer s.Close()
	deadline := time.Now().Add(20 * time.Second)
	var v VerifyStats
	for v = s.Stats().Verify; v.State != VerifyDone; v = s.Stats().Verify {
		if time.Now().After(deadline) {
			t.Fatalf("verification not done: %+v", v)
		}
		time.Sleep(5 * time.Millisecond)
	}
	if v.Damaged != 1 || v.Segments != len(segs)-1 || !strings.Contains(v.LastDamage, victim.Name) {
		t.Fatalf("verification %+v: want 1 damaged segment (%s) of %d", v, victim.Name, len(segs)-1)
	}
}
