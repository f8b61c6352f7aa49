package gc

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/diskque/diskque/storage"
)

// sparseFixture fills about 20 segments of which one job in eight lives.
func sparseFixture(t *testing.T) *fixture {
	f := &fixture{t: t, s: openStore(t, t.TempDir()), bodies: map[string][]byte{}}
	for i := range 1200 {
		j := f.add(1000, false)
		if i%8 != 0 {
			f.del(j.ID)
		}
	}
	if err := f.s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	return f
}

// rewriteNeed is what rewriting every sealed segment with something live
// would write, as the collector counts it.
func rewriteNeed(s *storage.Store) (n int64) {
	for _, seg := range s.Stats().Segments {
		if !seg.Active && (seg.LiveBodies > 0 || seg.Held > 0) {
			n += seg.RewriteDiskBytes()
		}
	}
	return n
}

// TestFullCollectionDoesNotStartPastTheRoom: a full collection that would
// write more than the Room allows does not start — nothing is rewritten or
// checkpointed — and says why; with room it runs.
func TestFullCollectionDoesNotStartPastTheRoom(t *testing.T) {
	f := sparseFixture(t)
	c, err := New(f.s, quietOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	need := rewriteNeed(f.s)
	var room atomic.Int64
	room.Store(need / 2)
	c.SetRoom(func(*storage.Store) (int64, bool) { return room.Load(), true })
	before := f.s.Stats()
	if err := c.Start(true); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("Start(full) with half the room: %v, want ErrNoRoom", err)
	}
	if _, err := c.Collect(true); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("Collect(full) with half the room: %v, want ErrNoRoom", err)
	}
	after := f.s.Stats()
	if after.Collect.SegmentsRewritten != before.Collect.SegmentsRewritten || after.AOFEnd != before.AOFEnd {
		t.Fatalf("a refused collection wrote: rewritten %d → %d, aof end %d → %d",
			before.Collect.SegmentsRewritten, after.Collect.SegmentsRewritten, before.AOFEnd, after.AOFEnd)
	}
	st := c.Stats()
	if st.SkippedForSpace != 2 || st.Collections != 0 || !strings.Contains(st.LastSkip, "would write") {
		t.Fatalf("stats after two refusals: %+v", st)
	}
	room.Store(2 * need)
	rep, err := c.Collect(true)
	if err != nil || rep.Rewritten == 0 {
		t.Fatalf("Collect(full) with room: %+v, %v", rep, err)
	}
	f.check(f.s)
}

// TestBackgroundCollectionKeepsToTheRoom: a background collection takes
// only the segments whose rewrite fits the room, and one whose room runs
// out midway (others wrote) stops before the next batch; what it moved is
// intact, and a later collection with room goes on.
func TestBackgroundCollectionKeepsToTheRoom(t *testing.T) {
	f := sparseFixture(t)
	opts := quietOptions()
	c, err := New(f.s, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	need := rewriteNeed(f.s)
	var one int64 // the largest segment's rewrite
	for _, seg := range f.s.Stats().Segments {
		if !seg.Active {
			one = max(one, seg.RewriteDiskBytes())
		}
	}
	// Room for about three segments' rewrites, less what was written since.
	start := f.s.DiskWrites().Queued
	c.SetRoom(func(s *storage.Store) (int64, bool) { return 3*one - (s.DiskWrites().Queued - start), true })
	rep, err := c.Collect(false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rewritten == 0 || rep.Rewritten > 3 || rep.BytesMoved+int64(rep.BodiesMoved)*256 > 3*one {
		t.Fatalf("with room for 3 segments' rewrites (%d bytes of %d): %+v", 3*one, need, rep)
	}
	st := c.Stats()
	if st.SkippedForSpace != 1 || !strings.Contains(st.LastSkip, "cut to") || st.LastErr != nil {
		t.Fatalf("stats: %+v", st)
	}
	f.check(f.s)

	// The room runs out after the first batch: the rewrite stops there.
	var calls atomic.Int64
	c.SetRoom(func(*storage.Store) (int64, bool) {
		if calls.Add(1) <= 2 { // the pick's, and the first batch's
			return 1 << 40, true
		}
		return 0, true
	})
	rep, err = c.Collect(false)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Rewritten != 1 || rep.BodiesMoved == 0 {
		t.Fatalf("stopped after the first batch: %+v", rep)
	}
	if st := c.Stats(); st.SkippedForSpace != 2 || !strings.Contains(st.LastSkip, "stopped after 1 of") {
		t.Fatalf("stats: %+v", st)
	}
	f.check(f.s)

	c.SetRoom(nil)
	if rep, err := c.Collect(true); err != nil || rep.Rewritten == 0 {
		t.Fatalf("a full collection with no limit: %+v, %v", rep, err)
	}
	f.check(f.s)
}
