package storage

import (
	"context"
	"encoding/binary"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// checkFill gives a store on the real filesystem the states Check must
// accept: queued, delayed, delivered, acked and deleted jobs, a paused
// queue, bodies moved by a rewrite and segments removed.
func checkFill(t *testing.T, s *Store) (kept []*Job) {
	t.Helper()
	churn(t, s, 200)
	for i := range 300 {
		j := newTestJob(s.NodeID(), []string{"a", "b", "c"}[i%3], uint64(5000+i), 0)
		if i%5 == 0 {
			j.State, j.AwakeTime = StateActive, 1<<50 // delayed
		}
		if err := s.Add(j, kib(i)); err != nil {
			t.Fatal(err)
		}
		switch {
		case i%7 == 1 && j.State == StateQueued:
			if _, err := s.Deliver(j.ID, 1<<49); err != nil {
				t.Fatal(err)
			}
		case i%7 == 2:
			if err := s.Delete(j.ID); err != nil {
				t.Fatal(err)
			}
			continue
		}
		kept = append(kept, j)
	}
	if err := s.Pause("b", PauseIn); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if _, err := s.RewriteSegment(context.Background(), s.Stats().Segments[0].First); err != nil {
		t.Fatal(err)
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	return kept
}

// TestCheckAcceptsAHealthyStore: after a clean close and after a kill (the
// index on disk is the last checkpoint's, the AOF has a tail after it), Check
// finds nothing wrong and counts what the store held.
func TestCheckAcceptsAHealthyStore(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	checkFill(t, s)
	st := s.Stats()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() || rep.Jobs != st.Jobs || rep.Queued != st.Queued || rep.Segments != len(st.Segments) {
		t.Fatalf("check of a healthy store: %+v; the store said jobs %d queued %d segments %d", rep, st.Jobs, st.Queued, len(st.Segments))
	}
}

// TestCheckFindsDamageAndInconsistencies: a damaged body in a sealed segment
// is reported with the job it belonged to; an index key out of line with
// the jobs is a problem; a store in use is refused.
func TestCheckFindsDamageAndInconsistencies(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	kept := checkFill(t, s)
	if _, err := Check(dir, diskOpts()); err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("check of a store in use: %v", err)
	}
	var victim *Job
	segs := s.Stats().Segments
	for _, j := range kept {
		cur, err := s.Job(j.ID)
		if err == nil && cur.BodyLSN >= segs[1].First && cur.BodyLSN < segs[1].First+wal.LSN(segs[1].Size) {
			victim = cur
			break
		}
	}
	if victim == nil {
		t.Fatal("no live job in the second segment")
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, walDir, segs[1].Name)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	b[24+int64(victim.BodyLSN-segs[1].First)+13+60] ^= 0x04 // inside its ADD record
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// And one counter off.
	db, err := pebble.Open(filepath.Join(dir, indexDir), &pebble.Options{FS: vfs.Default, DisableWAL: true,
		Logger: quietPebbleLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Set(countKey("a"), []byte{0x7f}, pebble.NoSync); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	if rep.OK() || len(rep.Damage) != 1 || rep.Damage[0].Segment != segs[1].Name {
		t.Fatalf("damage %+v: want one span in %s", rep.Damage, segs[1].Name)
	}
	found := false
	for _, id := range rep.Damage[0].Jobs {
		found = found || id == victim.ID
	}
	if !found {
		t.Fatalf("the damaged span's jobs %v do not name %s", rep.Damage[0].Jobs, victim.ID)
	}
	if rep.ProblemCount != 1 || !strings.Contains(rep.Problems[0], `queue "a"`) {
		t.Fatalf("problems %v: want the one counter", rep.Problems)
	}
}

// TestCheckAcceptsAKilledStore: killed after its last checkpoint, a store's
// index on disk lags the AOF; Check checks it as of its applied LSN and
// finds nothing wrong.
func TestCheckAcceptsAKilledStore(t *testing.T) {
	fs, opts, s := openCrashableStore(t)
	checkFill(t, s)
	churn(t, s, 50) // after the last checkpoint
	for i := range 20 {
		if err := s.Add(newTestJob(s.NodeID(), "tail", uint64(9000+i), 0), kib(i)); err != nil {
			t.Fatal(err)
		}
	}
	rep := checkKilled(t, fs, opts)
	if !rep.OK() || rep.Applied >= rep.AOFEnd {
		t.Fatalf("check of a killed store: %+v (want OK, with a tail after the applied lsn)", rep)
	}
}

// TestCheckFindsAMissingDeletionKey: the deletions a rebuild still needs are
// h/ keys counted in the g/ values; a key gone (or one too many) is a
// problem, since a checkpoint would then remove a segment still needed.
func TestCheckFindsAMissingDeletionKey(t *testing.T) {
	checkDeletionKey(t, []string{"by their keys"}, func(db *pebble.DB, key []byte, _ wal.LSN) error {
		return db.Delete(key, pebble.NoSync)
	})
}

// TestCheckFindsAMisplacedDeletionKey: a key moved to a deletion in another
// segment leaves the sums per creator right, and is a problem on both
// segments.
func TestCheckFindsAMisplacedDeletionKey(t *testing.T) {
	checkDeletionKey(t, []string{"by their keys", "by their keys"}, func(db *pebble.DB, key []byte, elsewhere wal.LSN) error {
		if err := db.Delete(key, pebble.NoSync); err != nil {
			return err
		}
		return db.Set(binary.BigEndian.AppendUint64(slices.Clone(key[:9]), uint64(elsewhere)), nil, pebble.NoSync)
	})
}

// checkDeletionKey makes a deletion that waits for an older segment, lets
// change alter its h/ key (elsewhere: an LSN in another segment), and wants
// the problems saying want, one each.
func checkDeletionKey(t *testing.T, want []string, change func(db *pebble.DB, key []byte, elsewhere wal.LSN) error) {
	t.Helper()
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	checkFill(t, s)
	// A job added now and deleted after the log rolled: its deletion
	// waits for the segment of its ADD.
	j := newTestJob(s.NodeID(), "a", 9000, 0)
	if err := s.Add(j, kib(7)); err != nil {
		t.Fatal(err)
	}
	cur, err := s.Job(j.ID)
	if err != nil {
		t.Fatal(err)
	}
	for segs := s.Stats().Segments; segs[len(segs)-1].First <= cur.BodyLSN; segs = s.Stats().Segments {
		churn(t, s, 20)
	}
	if err := s.Delete(j.ID); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	db, err := pebble.Open(filepath.Join(dir, indexDir), &pebble.Options{FS: vfs.Default, DisableWAL: true,
		Logger: quietPebbleLogger{}})
	if err != nil {
		t.Fatal(err)
	}
	it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixHold}, UpperBound: []byte{prefixHold + 1}})
	if err != nil {
		t.Fatal(err)
	}
	var key []byte
	if it.First() {
		key = append(key, it.Key()...)
	}
	if err := it.Close(); err != nil {
		t.Fatal(err)
	}
	if key == nil {
		t.Fatal("no deletion is held: the case is not exercised")
	}
	if err := change(db, key, cur.BodyLSN); err != nil {
		t.Fatal(err)
	}
	if err := db.Flush(); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	ok := rep.ProblemCount == len(want)
	for i := 0; ok && i < len(want); i++ {
		ok = strings.Contains(rep.Problems[i], want[i])
	}
	if !ok {
		t.Fatalf("problems %v: want %q", rep.Problems, want)
	}
}

// TestCheckAcceptsAStoreClosedAfterRemovingHeldSegments: the close's
// checkpoint removes creator segments on which later deletions held; the
// release of their hold keys (and the accounting) must reach the index
// before it closes, so that Check of the closed directory finds no key
// waiting for a segment the log no longer has. (It did not: the release
// stayed in the write buffer, for the next Open to redo.)
func TestCheckAcceptsAStoreClosedAfterRemovingHeldSegments(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	fillHeldSegments(t, s)
	before := len(s.Stats().Segments)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	rep, err := Check(dir, diskOpts())
	if err != nil {
		t.Fatal(err)
	}
	if rep.Segments >= before {
		t.Fatalf("the close removed no segment (%d before, %d after): the test proves nothing", before, rep.Segments)
	}
	if !rep.OK() || rep.ReleasePending != 0 {
		t.Fatalf("check after a clean close: %d problems %v, %d deletion keys pending release",
			rep.ProblemCount, rep.Problems, rep.ReleasePending)
	}
}

// TestCheckAcceptsAStoreKilledAfterRemovingHeldSegments: a kill right after
// a checkpoint removed creator segments leaves their deletion keys in the
// index (the release was still in the write buffer); Open releases them, so
// Check counts them as pending, not as problems.
func TestCheckAcceptsAStoreKilledAfterRemovingHeldSegments(t *testing.T) {
	fs, opts, s := openCrashableStore(t)
	fillHeldSegments(t, s)
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if s.segmentsRemoved() == 0 {
		t.Fatal("the checkpoint removed no segment: the test proves nothing")
	}
	rep := checkKilled(t, fs, opts)
	if !rep.OK() || rep.ReleasePending == 0 {
		t.Fatalf("check of a store killed after a removal: %d problems %v, %d deletion keys pending release (want some)",
			rep.ProblemCount, rep.Problems, rep.ReleasePending)
	}
}

// fillHeldSegments adds jobs, checkpoints, then deletes each one beside a
// new job: the deletions land in later segments and hold on the first ones,
// which the next checkpoint removes; the new jobs keep the later ones.
func fillHeldSegments(t *testing.T, s *Store) {
	t.Helper()
	var first []*Job
	for i := range 300 {
		j := newTestJob(s.NodeID(), "q", uint64(7000+i), 0)
		if err := s.Add(j, kib(i)); err != nil {
			t.Fatal(err)
		}
		first = append(first, j)
	}
	if err := s.Checkpoint(); err != nil { // the creators are in the index
		t.Fatal(err)
	}
	for i, j := range first {
		if err := s.Delete(j.ID); err != nil {
			t.Fatal(err)
		}
		k := newTestJob(s.NodeID(), "keep", uint64(9000+i), 0)
		if err := s.Add(k, kib(1000+i)); err != nil {
			t.Fatal(err)
		}
	}
}

// openCrashableStore opens a store with SyncAlways on a crashable in-memory
// FS, closed when the test ends, for tests that check a kill-time clone.
func openCrashableStore(t *testing.T) (*vfs.MemFS, Options, *Store) {
	t.Helper()
	fs := vfs.NewCrashableMem()
	opts := crashOpts(fs, wal.SyncAlways)
	s, err := Open(eqDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return fs, opts, s
}

// checkKilled runs Check on what a kill at this instant would leave of fs:
// only what was synced.
func checkKilled(t *testing.T, fs *vfs.MemFS, opts Options) *CheckReport {
	t.Helper()
	kopts := opts
	kopts.FS = fs.CrashClone(vfs.CrashCloneCfg{})
	rep, err := Check(eqDir, kopts)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}
