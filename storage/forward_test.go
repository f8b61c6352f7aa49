package storage

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

func rvOpts(fs vfs.FS) Options {
	o := TestingOptions()
	o.FS = fs
	o.Sync = wal.SyncNever
	o.SegmentSize = 32 << 10
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// rebuildCheck copies fs, drops index/, rebuilds, and compares with m and
// with live's segment accounting.
func rebuildCheck(t *testing.T, live *Store, fs *vfs.MemFS, m *jobModel, queues []string) *Store {
	t.Helper()
	clone := fs.CrashClone(keepEverything())
	if err := clone.RemoveAll(eqDir + "/" + indexDir); err != nil {
		t.Fatal(err)
	}
	s, err := Open(eqDir, rvOpts(clone))
	if err != nil {
		t.Fatalf("rebuild: %v", err)
	}
	if !s.RecoveryInfo().Rebuilt {
		t.Fatal("not rebuilt")
	}
	syncBodyLSNs(s, m)
	checkStore(t, s, m, queues)
	checkSameAccounting(t, live, s)
	return s
}

// checkSameAccounting compares what keeps each segment (accounting.go) in
// a live store and in one rebuilt from its AOF, counts and h/ keys: the
// replay must derive them as the live store did, or a rebuilt store keeps
// segments for ever, or removes one still needed.
func checkSameAccounting(t testing.TB, live, rebuilt *Store) {
	t.Helper()
	type acct struct {
		segs  map[wal.LSN]segmentLive
		holds []string
	}
	read := func(s *Store) acct {
		s.mu.Lock()
		a := acct{segs: s.cloneSegments()}
		s.mu.Unlock()
		err := s.scanPrefix([]byte{prefixHold}, func(k, _ []byte) error {
			a.holds = append(a.holds, fmt.Sprintf("%x", k))
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		return a
	}
	a, b := read(live), read(rebuilt)
	for seg := range a.segs {
		if _, ok := b.segs[seg]; !ok {
			b.segs[seg] = segmentLive{}
		}
	}
	for seg, l := range b.segs {
		if !reflect.DeepEqual(a.segs[seg], l) {
			t.Errorf("segment %d: live %+v, rebuilt %+v", seg, a.segs[seg], l)
		}
	}
	if !slices.Equal(a.holds, b.holds) {
		t.Errorf("h/ keys: live %d %v, rebuilt %d %v", len(a.holds), a.holds, len(b.holds), b.holds)
	}
}

// A live job whose state differs from its ADD gets one SNAP when the
// segments after its ADD go, and is anchored there: later checkpoints of an
// idle store write nothing forward again.
func TestForwardSnapsOnce(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 1)
	var ids []string
	for range 1500 {
		o := g.queuedJob(8)
		modelDo(t, s, h, o)
		ids = append(ids, o.id)
	}
	for _, id := range ids {
		modelDo(t, s, h, &mop{kind: mopDeliver, id: id, qtime: g.time()})
	}
	var prev int64
	for i := range 6 {
		if err := s.Checkpoint(); err != nil {
			t.Fatal(err)
		}
		st := s.Stats()
		t.Logf("checkpoint %d (no ops): snaps so far %d (+%d), segments removed %d, aof end %d",
			i, st.Collect.Snaps, st.Collect.Snaps-prev, st.Collect.SegmentsRemoved, st.AOFEnd)
		if i >= 2 && st.Collect.Snaps-prev > 0 {
			t.Errorf("checkpoint %d of an idle store wrote %d SNAPs forward again", i, st.Collect.Snaps-prev)
		}
		prev = st.Collect.Snaps
	}
	rebuildCheck(t, s, fs, h.cur, g.queues).Close()
}

// With CheckpointBytes below what forward writes, what forward wrote is no
// reason for another checkpoint: the background loop does not kick itself.
func TestForwardDoesNotKickCheckpoints(t *testing.T) {
	fs := vfs.NewCrashableMem()
	o := rvOpts(fs)
	o.CheckpointBytes = 1 << 40 // no kick while the jobs are written
	o.CheckpointInterval = time.Hour
	s, h, g := openModelStore(t, o, 2)
	var ids []string
	for range 1500 {
		op := g.queuedJob(8)
		modelDo(t, s, h, op)
		ids = append(ids, op.id)
	}
	for _, id := range ids {
		modelDo(t, s, h, &mop{kind: mopDeliver, id: id, qtime: g.time()})
	}
	s.mu.Lock()
	s.opts.CheckpointBytes = 64 << 10 // < the ~200 KiB of SNAPs
	s.mu.Unlock()
	// One checkpoint by hand removes the segments and writes the SNAPs
	// forward, past CheckpointBytes.
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	st := s.Stats()
	if st.Collect.Snaps == 0 || st.Collect.SegmentsRemoved == 0 {
		t.Fatalf("%d SNAPs, %d segments removed: the case is not exercised", st.Collect.Snaps, st.Collect.SegmentsRemoved)
	}
	// Kicks sent while forward wrote were drained (or taken by the loop,
	// whose checkpoint has finished once ckptMu is free).
	s.ckptMu.Lock()
	s.ckptMu.Unlock()
	if n := len(s.ckptKick); n != 0 {
		t.Errorf("after the checkpoint, %d kick pending: what forward wrote asks for another", n)
	}
	a := s.Stats()
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if b := s.Stats(); b.AOFEnd != a.AOFEnd {
		t.Errorf("a checkpoint of an idle store wrote %d AOF bytes", b.AOFEnd-a.AOFEnd)
	}
}

// rvChurn adds and deletes n jobs of bodyLen bytes: records that roll the log
// and leave the segments dead.
func rvChurn(t *testing.T, s *Store, h *modelHistory, g *opGen, n, bodyLen int) {
	for range n {
		o := g.queuedJob(bodyLen)
		for k := range o.body {
			o.body[k] = byte(g.rng.Uint32())
		}
		modelDo(t, s, h, o)
		modelDo(t, s, h, &mop{kind: mopDelete, id: o.id})
	}
}

// Store.Add accepts the id of a job deleted earlier. The DEL's segment is
// held while the first ADD's stays, and the rebuild replaces the first
// incarnation with the second.
func TestRebuildReAddedID(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 3)
	pin := g.queuedJob(100) // keeps the first ADD's segment
	modelDo(t, s, h, pin)
	first := g.queuedJob(100)
	modelDo(t, s, h, first)
	rvChurn(t, s, h, g, 10, 4000)
	modelDo(t, s, h, &mop{kind: mopDelete, id: first.id})
	rvChurn(t, s, h, g, 10, 4000)
	again := g.queuedJob(200)
	again.id, again.job.ID = first.id, first.id
	again.job.Queue = "beta"
	modelDo(t, s, h, again)
	rvChurn(t, s, h, g, 10, 4000)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	t.Logf("removed %d segments", s.Stats().Collect.SegmentsRemoved)
	rebuildCheck(t, s, fs, h.cur, g.queues).Close()
}

// RebuildNever over a missing index: a replay from LSN 0 is the index
// while the AOF still holds its whole history (nothing was ever removed),
// so Open succeeds and the store is exact; once segments were removed the
// index can only be rebuilt, and Open refuses.
func TestRebuildNeverMissingIndex(t *testing.T) {
	for _, removeMiddle := range []bool{false, true} {
		fs := vfs.NewCrashableMem()
		s, h, g := openModelStore(t, rvOpts(fs), 4)
		modelDo(t, s, h, g.queuedJob(100))
		if removeMiddle {
			rvChurn(t, s, h, g, 20, 4000)
			modelDo(t, s, h, g.queuedJob(100))
			rvChurn(t, s, h, g, 10, 4000)
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
		}
		removed := s.Stats().Collect.SegmentsRemoved
		if removeMiddle && removed == 0 {
			t.Fatal("the churn removed no segment; the refusal case is not exercised")
		}
		s.Close()
		if err := fs.RemoveAll(eqDir + "/" + indexDir); err != nil {
			t.Fatal(err)
		}
		o := rvOpts(fs)
		o.Rebuild = RebuildNever
		s2, err := Open(eqDir, o)
		switch {
		case removed == 0 && err != nil:
			t.Errorf("whole aof: RebuildNever refused a replay from the start: %v", err)
		case removed == 0:
			if s2.RecoveryInfo().Rebuilt || s2.RecoveryInfo().From != 0 {
				t.Errorf("whole aof: rebuilt %v, replayed from %d; want a plain replay from 0",
					s2.RecoveryInfo().Rebuilt, s2.RecoveryInfo().From)
			}
			syncBodyLSNs(s2, h.cur)
			checkStore(t, s2, h.cur, g.queues)
			s2.Close()
		case err == nil:
			t.Errorf("removed %d segments: RebuildNever opened a store without its index (rebuilt %v, replayed %d records from %d)",
				removed, s2.RecoveryInfo().Rebuilt, s2.RecoveryInfo().Records, s2.RecoveryInfo().From)
			s2.Close()
		default:
			t.Logf("removed %d segments: refused: %v", removed, err)
		}
	}
}

var eqFlushWeight = 0

func withFlushes(t *testing.T, w int, f func(*testing.T)) {
	old := opWeights[mopFlush]
	opWeights[mopFlush] = w
	defer func() { opWeights[mopFlush] = old }()
	f(t)
}

// The equivalence tests again, with DEBUG FLUSHALL among the operations.
func TestRebuildEquivalenceWithFlushes(t *testing.T)  { withFlushes(t, 1, TestRebuildEquivalence) }
func TestRecoveryEquivalenceWithFlushes(t *testing.T) { withFlushes(t, 1, TestRecoveryEquivalence) }

// Checkpoints (and segment rewrites) run concurrently with the operations;
// at the end a rebuild from a copy must equal the live store.
func TestRebuildAfterConcurrentCheckpoints(t *testing.T) {
	withFlushes(t, 1, func(t *testing.T) {
		seed := modelSeed(t)
		fs := vfs.NewCrashableMem()
		o := rvOpts(fs)
		o.CheckpointBytes = 48 << 10
		o.CheckpointInterval = 2 * time.Millisecond
		s, err := Open(eqDir, o)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		g := newOpGen(seed, s.NodeID())
		m := newJobModel()
		stop := make(chan struct{})
		done := make(chan struct{})
		go func() {
			defer close(done)
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				if i%3 == 0 {
					for _, st := range s.Stats().Segments {
						if !st.Active && st.LiveBodies > 0 && st.LiveRatio() < 0.5 {
							if _, err := s.RewriteSegment(t.Context(), st.First); err != nil {
								t.Error(err)
								return
							}
							break
						}
					}
				}
				if err := s.Checkpoint(); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		for i := range 6000 {
			op := g.op(m)
			if op.kind == mopFlush && i%4 != 0 {
				continue
			}
			nj, err := op.run(s)
			if err == nil {
				m.apply(op, nj)
			}
		}
		close(stop)
		<-done
		if err := s.Checkpoint(); err != nil {
			t.Fatal(err)
		}
		// The model from the live store.
		for id, w := range m.jobs {
			j, err := s.Job(id)
			if err != nil {
				t.Fatalf("live store: %s: %v", id, err)
			}
			w.job = *j
		}
		m.paused = map[string]PauseState{}
		s.mu.Lock()
		for q, p := range s.paused {
			m.paused[q] = p
		}
		s.mu.Unlock()
		checkStore(t, s, m, g.queues)
		st := s.Stats().Collect
		t.Logf("removed %d segments, %d snaps, %d moved; %d jobs", st.SegmentsRemoved, st.Snaps, st.BodiesMoved, len(m.jobs))
		quiesce(t, s)
		rs := rebuildCheck(t, s, fs, m, g.queues)
		if n := rs.Stats().Collect.MisplacedBodies; n > 0 {
			t.Errorf("the rebuild counted (and logged at ERROR) %d misplaced bodies, live store %d", n, st.MisplacedBodies)
		}
		rs.Close()
	})
}

// A SNAP carries the body's LSN of its time. Once the collector moved the
// body and its old segment went, a rebuild replaying the SNAP must take the
// later move, not count a misplaced body (an ERROR line, "damage") for a
// healthy AOF.
func TestRebuildSnapOfMovedBody(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 6)
	j := g.queuedJob(100)
	modelDo(t, s, h, j)
	rvChurn(t, s, h, g, 10, 4000)
	modelDo(t, s, h, &mop{kind: mopDeliver, id: j.id, qtime: g.time()})
	rvChurn(t, s, h, g, 10, 4000)
	if err := s.Checkpoint(); err != nil { // SNAP of j
		t.Fatal(err)
	}
	modelDo(t, s, h, g.queuedJob(100)) // keeps the SNAP's segment
	rvChurn(t, s, h, g, 10, 4000)
	first := s.Stats().Segments[0].First
	before := storeApplied(s)
	if _, err := s.RewriteSegment(t.Context(), first); err != nil {
		t.Fatal(err)
	}
	h.steps = append(h.steps, modelStep{start: before, end: storeApplied(s), records: true})
	rvChurn(t, s, h, g, 10, 4000)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	rs := rebuildCheck(t, s, fs, h.cur, g.queues)
	defer rs.Close()
	t.Logf("snaps %d, removed %d", s.Stats().Collect.Snaps, s.Stats().Collect.SegmentsRemoved)
	if n := rs.Stats().Collect.MisplacedBodies; n > 0 {
		t.Errorf("the rebuild of a healthy AOF counted %d misplaced bodies (logged at ERROR)", n)
	}
}

// An index rebuilt after the newest job's history was collected keeps the
// highest ctime (m/ state, Store.MaxCtime): the META carries it.
func TestRebuildKeepsMaxCtime(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 8)
	modelDo(t, s, h, g.queuedJob(100))
	rvChurn(t, s, h, g, 20, 4000) // newer ctimes, all deleted
	modelDo(t, s, h, g.queuedJob(100))
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	want := s.MaxCtime()
	rs := rebuildCheck(t, s, fs, h.cur, g.queues)
	defer rs.Close()
	if got := rs.MaxCtime(); got != want {
		t.Errorf("rebuilt MaxCtime %d, the index had %d", got, want)
	}
}

func heldSegments(s *Store) map[wal.LSN]SegmentStat {
	out := map[wal.LSN]SegmentStat{}
	for _, st := range s.Stats().Segments {
		if !st.Active && st.Held > 0 {
			out[st.First] = st
		}
	}
	return out
}

func rvRewrite(t *testing.T, s *Store, h *modelHistory, first wal.LSN) RewriteResult {
	t.Helper()
	before := storeApplied(s)
	res, err := s.RewriteSegment(t.Context(), first)
	if err != nil {
		t.Fatal(err)
	}
	if after := storeApplied(s); after > before {
		h.steps = append(h.steps, modelStep{start: before, end: after, records: true})
	}
	return res
}

// rvCheckpoint checkpoints s, noting in h what the checkpoint wrote forward,
// and returns what the index it flushed has applied.
func rvCheckpoint(t *testing.T, s *Store, h *modelHistory) wal.LSN {
	t.Helper()
	before := storeApplied(s)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	after := storeApplied(s)
	if after > before {
		h.steps = append(h.steps, modelStep{start: before, end: after, records: true})
		return after
	}
	return before
}

// A held segment rewritten twice copies each deletion forward once: the
// second TOMB of a deletion is refused (its holds went with the first), so
// it cannot take over the hold of another deletion still there, and a
// deletion of an id added again since is copied too (it releases the
// segment) without touching the second incarnation.
func TestRewriteCopiesEachDeletionOnce(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 11)
	modelDo(t, s, h, g.queuedJob(100)) // keeps the ADDs' segment
	x := g.queuedJob(100)
	modelDo(t, s, h, x)
	y := g.queuedJob(100)
	modelDo(t, s, h, y)
	rvChurn(t, s, h, g, 10, 4000)
	modelDo(t, s, h, &mop{kind: mopDelete, id: x.id})
	modelDo(t, s, h, &mop{kind: mopDelete, id: y.id}) // both held on the ADDs' segment
	rvChurn(t, s, h, g, 10, 4000)
	again := g.queuedJob(200)
	again.id, again.job.ID = x.id, x.id
	modelDo(t, s, h, again)
	rvChurn(t, s, h, g, 10, 4000)
	rvCheckpoint(t, s, h)
	held := heldSegments(s)
	if len(held) != 1 {
		t.Fatalf("want one held segment, got %v", held)
	}
	var d wal.LSN
	for f := range held {
		d = f
	}
	if r := rvRewrite(t, s, h, d); r.Forwarded != 2 {
		t.Errorf("first rewrite copied %d deletions forward, want 2", r.Forwarded)
	}
	if r := rvRewrite(t, s, h, d); r.Forwarded != 0 {
		t.Errorf("second rewrite copied %d deletions forward again, want 0", r.Forwarded)
	}
	rvChurn(t, s, h, g, 10, 4000)
	rvCheckpoint(t, s, h)
	for _, st := range s.Stats().Segments {
		if st.First == d {
			t.Errorf("the rewritten segment was not removed: %+v", st)
		}
	}
	modelDo(t, s, h, &mop{kind: mopDelete, id: x.id})
	for range 4 {
		rvChurn(t, s, h, g, 10, 4000)
		rvCheckpoint(t, s, h)
	}
	rebuildCheck(t, s, fs, h.cur, g.queues).Close()
}

// A rewrite cut short between batches and run again copies the first
// batch's deletions once: a checkpoint meanwhile must not find the segment
// dead while deletions in it are not copied.
func TestRewriteCutShortCopiesDeletionsOnce(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 12)
	modelDo(t, s, h, g.queuedJob(8)) // keeps the ADDs' segment
	var ids []string
	for range 200 {
		o := g.queuedJob(8)
		modelDo(t, s, h, o)
		ids = append(ids, o.id)
	}
	rvChurn(t, s, h, g, 10, 4000)
	for _, id := range ids {
		modelDo(t, s, h, &mop{kind: mopDelete, id: id})
	}
	rvChurn(t, s, h, g, 10, 4000)
	rvCheckpoint(t, s, h)
	var d wal.LSN
	for f, st := range heldSegments(s) {
		if st.Held == 200 {
			d = f
		}
	}
	if d == 0 {
		t.Fatalf("the 200 deletions are not held in one segment: %v", heldSegments(s))
	}
	defer func() { testHookRewriteBatch = nil }()
	rewrite := func(ctx context.Context) RewriteResult {
		before := storeApplied(s)
		res, err := s.RewriteSegment(ctx, d)
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		h.steps = append(h.steps, modelStep{start: before, end: storeApplied(s), records: true})
		return res
	}
	ctx, cancel := context.WithCancel(t.Context())
	testHookRewriteBatch = cancel // cut short after its first batch
	first := rewrite(ctx)
	ctx, cancel = context.WithCancel(t.Context())
	testHookRewriteBatch = func() {
		testHookRewriteBatch = nil
		rvCheckpoint(t, s, h) // the checkpoint loop, meanwhile
		cancel()
	}
	second := rewrite(ctx)
	t.Logf("first run copied %d, second %d (skipped %d)", first.Forwarded, second.Forwarded, second.Skipped)
	if first.Forwarded == 0 || first.Forwarded >= 200 {
		t.Fatalf("the first run copied %d deletions: not cut short between batches", first.Forwarded)
	}
	held := heldSegments(s)[d].Held
	if removed := !slices.ContainsFunc(s.Stats().Segments, func(st SegmentStat) bool { return st.First == d }); removed || held == 0 {
		t.Errorf("after a run cut short and one more batch, the segment is removed (%v) or holds nothing (%d), with deletions not yet copied",
			removed, held)
	}
	third := rewrite(t.Context())
	if got := first.Forwarded + second.Forwarded + third.Forwarded; got != 200 {
		t.Errorf("the three runs copied %d deletions forward, want each of the 200 once", got)
	}
	rvChurn(t, s, h, g, 10, 4000)
	rvCheckpoint(t, s, h)
	rebuildCheck(t, s, fs, h.cur, g.queues).Close()
}

// An index of format 3 counted holds in its g/ values without h/ keys: a
// check of it as it is passes, and Open gives its deletions their keys, in
// one batch with the format-4 mark. Dropping the holds instead (8b76d2d)
// let the deletion's segment go, and a rebuild brought the deleted job back.
func TestFormat3IndexUpgradeKeepsHolds(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s, h, g := openModelStore(t, rvOpts(fs), 21)
	modelDo(t, s, h, g.queuedJob(100)) // keeps the ADDs' segment
	x := g.queuedJob(100)
	modelDo(t, s, h, x)
	rvChurn(t, s, h, g, 10, 4000)
	modelDo(t, s, h, &mop{kind: mopDelete, id: x.id})
	rvChurn(t, s, h, g, 10, 4000)
	rvCheckpoint(t, s, h)
	want := heldSegments(s)
	if len(want) == 0 {
		t.Fatal("no segment is held: the case is not exercised")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	var keys [][]byte
	rewriteIndex(t, fs, eqDir, func(db *pebble.DB) {
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixHold}, UpperBound: []byte{prefixHold + 1}})
		if err != nil {
			t.Fatal(err)
		}
		for it.First(); it.Valid(); it.Next() {
			keys = append(keys, slices.Clone(it.Key()))
		}
		it.Close()
		if err := db.DeleteRange([]byte{prefixHold}, []byte{prefixHold + 1}, pebble.NoSync); err != nil {
			t.Fatal(err)
		}
		if err := db.Set(keyFormat, binary.AppendUvarint(nil, 3), pebble.NoSync); err != nil {
			t.Fatal(err)
		}
	})
	if rep, err := Check(eqDir, rvOpts(fs)); err != nil || !rep.OK() {
		t.Errorf("check of the format-3 index as it is: %v %v", rep.Problems, err)
	}
	s, err := Open(eqDir, rvOpts(fs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if got := heldSegments(s); len(got) != len(want) {
		t.Errorf("held segments after the upgrade: %v, before it %v", got, want)
	}
	if v, err := s.get(s.db, keyFormat); err != nil || len(v) == 0 || v[0] != formatVersion {
		t.Errorf("format after opening a format-3 index: %x, %v", v, err)
	}
	for _, k := range keys {
		if has, err := s.hasKey(s.buf, k); err != nil || !has {
			t.Errorf("deletion key %x not given back by the upgrade (%v)", k, err)
		}
	}
	h2 := newModelHistory(h.cur.clone(), storeApplied(s))
	for range 4 {
		rvChurn(t, s, h2, g, 10, 4000)
		rvCheckpoint(t, s, h2)
	}
	rs := rebuildCheck(t, s, fs, h2.cur, g.queues)
	defer rs.Close()
	if _, err := rs.Job(x.id); err == nil {
		t.Errorf("deleted job %s is back after the rebuild", x.id)
	}
	s.Close()
	if rep, err := Check(eqDir, rvOpts(fs)); err != nil || !rep.OK() {
		t.Errorf("check after the upgrade: %v %v", rep.Problems, err)
	}
}

// openModelStore opens a store on o, closed when the test ends, with a model
// history that follows it and an op generator seeded with seed.
func openModelStore(t *testing.T, o Options, seed uint64) (*Store, *modelHistory, *opGen) {
	t.Helper()
	s, err := Open(eqDir, o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	return s, h, newOpGen(seed, s.NodeID())
}
