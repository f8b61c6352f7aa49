package storage

// Crash tests for the store, in the style of etcd's wal repair_test.go: write
// jobs and transitions, note what each AOF record did (a modelHistory), damage
// copies of the files the way a crash or a bad disk would, reopen, and assert
// exactly which jobs and states survived; then write more and reopen again.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
	"github.com/diskque/diskque/wal"
)

const crashSegSize = 4096

// crashOpts are TestingOptions with 4 KiB segments, so a few dozen jobs span
// several, and no logging. The 1 MiB memtable is never flushed by the small
// runs here, so nothing but Checkpoint and Close moves the index's applied
// LSN: without them every record is in the replay range.
func crashOpts(fs vfs.FS, sync wal.SyncPolicy) Options {
	o := TestingOptions()
	o.FS, o.Sync, o.SegmentSize = fs, sync, crashSegSize
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

func openCrash(t *testing.T, fs vfs.FS, sync wal.SyncPolicy) *Store {
	t.Helper()
	s, err := Open(eqDir, crashOpts(fs, sync))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func readMemFile(t *testing.T, fs vfs.FS, path string) []byte {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, st.Size())
	if _, err := f.ReadAt(b, 0); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return b
}

// writeMemFile replaces path with b, synced.
func writeMemFile(t *testing.T, fs vfs.FS, path string, b []byte) {
	t.Helper()
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// crashLog is a store's files written by a known sequence of records, as a
// crash left them.
type crashLog struct {
	h       *modelHistory
	segs    []wal.SegmentInfo
	durable wal.LSN
	tail    int        // h.steps[tail:] are the last records, unsynced under SyncNever
	synced  *vfs.MemFS // exactly the synced data
	all     *vfs.MemFS // every write
	queues  []string
	node    string
}

// writeCrashLog writes about 150 random valid operations over at least four
// segments with a Sync every 25, then a Sync and six small operations that
// stay in the last segment: under SyncNever they are the unsynced tail.
func writeCrashLog(t *testing.T, sync wal.SyncPolicy) *crashLog {
	fs := vfs.NewCrashableMem()
	s := openCrash(t, fs, sync)
	defer s.Close()
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	g := newOpGen(20261129, s.NodeID())
	g.strict = true
	for i := 0; i < 150 || len(s.log.Segments()) < 4; i++ {
		modelDo(t, s, h, g.op(h.cur))
		if i%25 == 24 {
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// Leave room for the tail in the active segment: a roll would fsync it.
	for segs := s.log.Segments(); segs[len(segs)-1].Size > crashSegSize-1200; segs = s.log.Segments() {
		modelDo(t, s, h, &mop{kind: mopPause, queue: "alpha", pause: PauseIn})
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	c := &crashLog{h: h, tail: len(h.steps), queues: g.queues, node: s.NodeID()}
	nsegs := len(s.log.Segments())
	a, b, d := g.queuedJob(40), g.queuedJob(60), g.queuedJob(80)
	for _, o := range []*mop{a, b, d,
		{kind: mopDeliver, id: a.id, qtime: g.time()},
		{kind: mopAck, id: b.id},
		{kind: mopPause, queue: "beta", pause: PauseOut},
	} {
		modelDo(t, s, h, o)
	}
	c.segs, c.durable = s.log.Segments(), s.log.Durable()
	if len(c.segs) != nsegs || c.h.steps[c.tail].start < c.segs[len(c.segs)-1].First {
		t.Fatalf("the tail rolled the log or is not in the last segment")
	}
	want := h.steps[c.tail-1].end
	if sync == wal.SyncAlways {
		want = h.end()
	}
	if c.durable != want {
		t.Fatalf("durable %d, want %d", c.durable, want)
	}
	c.synced = fs.CrashClone(vfs.CrashCloneCfg{})
	c.all = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(1, 2))})
	return c
}

// seg returns the segment holding step i; pos its path and the file offset
// of the step's record.
func (c *crashLog) seg(i int) wal.SegmentInfo {
	k := len(c.segs) - 1
	for c.segs[k].First > c.h.steps[i].start {
		k--
	}
	return c.segs[k]
}

func (c *crashLog) pos(i int) (path string, off int64) {
	seg := c.seg(i)
	path = eqDir + "/aof/" + seg.Name
	off = walHeaderSize + int64(c.h.steps[i].start-seg.First)
	if c.all != nil && isWalMark(c.file(path), off) {
		off += int64(walMarkSize) // the step's record comes after a sync mark
	}
	return path, off
}

// file returns the bytes of path as the crash left them (every write).
func (c *crashLog) file(path string) []byte {
	b, err := c.all.UnsafeGetFileDataBuffer(path)
	if err != nil {
		panic(err)
	}
	return b
}

// The wal's format-2 layout, as the crash tests damage it: a 24-byte segment
// header, then frames of a 13-byte header (crc 4, length 4, type 1, payload
// crc 4) and the payload; a sync mark is a type-255 frame of 8 bytes.
const (
	walHeaderSize      = 24
	walFrameHeaderSize = 13
)

func isWalMark(b []byte, off int64) bool {
	return int64(len(b)) >= off+walFrameHeaderSize && b[off+8] == 0xff && binary.LittleEndian.Uint32(b[off+4:]) == 8
}

func (c *crashLog) lastPath() string { return eqDir + "/aof/" + c.segs[len(c.segs)-1].Name }

// flipPayloadBit flips a bit in the middle of step i's payload.
func (c *crashLog) flipPayloadBit(t *testing.T, fs vfs.FS, i int) {
	path, off := c.pos(i)
	b := readMemFile(t, fs, path)
	st := c.h.steps[i]
	b[off+walFrameHeaderSize+int64(st.end-st.start-walFrameHeaderSize-walMarkSize)/2] ^= 0x10
	writeMemFile(t, fs, path, b)
}

// TestCrashTable damages copies of a store's files and checks what Open
// makes of them: every durable record survives and nothing of a torn one, or
// Open refuses with wal.ErrCorrupt naming the segment and offset.
func TestCrashTable(t *testing.T) {
	for _, sync := range []wal.SyncPolicy{wal.SyncNever, wal.SyncAlways} {
		t.Run(sync.String(), func(t *testing.T) { testCrashTable(t, sync) })
	}
}

func testCrashTable(t *testing.T, sync wal.SyncPolicy) {
	c := writeCrashLog(t, sync)
	n := len(c.h.steps)
	last := n - 1
	durableSteps := 0
	for durableSteps < n && c.h.steps[durableSteps].end <= c.durable {
		durableSteps++
	}
	prev := len(c.segs) - 2 // an earlier segment: a record in its middle
	var inPrev []int
	for i := range c.h.steps {
		if c.seg(i).Name == c.segs[prev].Name {
			inPrev = append(inPrev, i)
		}
	}
	mid := inPrev[len(inPrev)/2]
	cases := []struct {
		name    string
		all     bool // start from every write (else exactly the synced data)
		damage  func(t *testing.T, fs vfs.FS)
		survive int      // steps [0, survive) survive
		openErr []string // or Open fails with ErrCorrupt and these substrings
		broken  bool     // the last segment's damaged original is kept as .broken
	}{
		{name: "drop-unsynced", survive: durableSteps},
		{name: "keep-everything", all: true, survive: n},
		{name: "truncate-inside-last-record", all: true, survive: last, broken: true,
			damage: func(t *testing.T, fs vfs.FS) {
				_, off := c.pos(last)
				writeMemFile(t, fs, c.lastPath(), readMemFile(t, fs, c.lastPath())[:off+12])
			}},
		{name: "truncate-inside-first-tail-record", all: true, survive: c.tail, broken: true,
			damage: func(t *testing.T, fs vfs.FS) {
				_, off := c.pos(c.tail)
				writeMemFile(t, fs, c.lastPath(), readMemFile(t, fs, c.lastPath())[:off+5])
			}},
		{name: "zero-tail", all: true, survive: last - 2, broken: true,
			damage: func(t *testing.T, fs vfs.FS) {
				_, off := c.pos(last - 2)
				b := append(readMemFile(t, fs, c.lastPath()), make([]byte, 4096)...)
				clear(b[off+11:])
				writeMemFile(t, fs, c.lastPath(), b)
			}},
		{name: "flip-bit-in-last-record", all: true, survive: last, broken: true,
			damage: func(t *testing.T, fs vfs.FS) { c.flipPayloadBit(t, fs, last) }},
		// Under SyncNever the tail was never fsynced: damage in it is a
		// torn write, whatever follows. Under SyncAlways a sync mark after
		// it says it was durable: corruption, refused.
		{name: "flip-bit-mid-last-segment", all: true, survive: map[bool]int{true: -1, false: c.tail + 1}[sync == wal.SyncAlways],
			broken:  sync != wal.SyncAlways,
			openErr: []string{c.segs[len(c.segs)-1].Name, fmt.Sprintf("offset %d", c.mustPos(c.tail+1)), "not a torn write"},
			damage:  func(t *testing.T, fs vfs.FS) { c.flipPayloadBit(t, fs, c.tail+1) }},
		// The two cases the flat frame of format 1 took for a torn tail,
		// losing acknowledged writes under always: a flipped bit in a
		// record's length, and a run of zeros with records after it.
		{name: "flip-length-bit-mid-last-segment", all: true, survive: map[bool]int{true: -1, false: c.tail + 1}[sync == wal.SyncAlways],
			broken:  sync != wal.SyncAlways,
			openErr: []string{c.segs[len(c.segs)-1].Name, fmt.Sprintf("offset %d", c.mustPos(c.tail+1)), "not a torn write"},
			damage: func(t *testing.T, fs vfs.FS) {
				path, off := c.pos(c.tail + 1)
				b := readMemFile(t, fs, path)
				b[off+5] ^= 0x02 // length bytes 4..8
				writeMemFile(t, fs, path, b)
			}},
		{name: "zeros-mid-last-segment", all: true, survive: map[bool]int{true: -1, false: c.tail + 1}[sync == wal.SyncAlways],
			broken:  sync != wal.SyncAlways,
			openErr: []string{c.segs[len(c.segs)-1].Name, fmt.Sprintf("offset %d", c.mustPos(c.tail+1)), "not a torn write"},
			damage: func(t *testing.T, fs vfs.FS) {
				path, off := c.pos(c.tail + 1)
				_, end := c.pos(c.tail + 2)
				b := readMemFile(t, fs, path)
				clear(b[off:end])
				writeMemFile(t, fs, path, b)
			}},
		{name: "flip-bit-in-earlier-segment", survive: -1,
			openErr: []string{c.segs[prev].Name, fmt.Sprintf("offset %d", c.mustPos(mid))},
			damage:  func(t *testing.T, fs vfs.FS) { c.flipPayloadBit(t, fs, mid) }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			base := c.synced
			if tc.all {
				base = c.all
			}
			fs := base.CrashClone(vfs.CrashCloneCfg{}) // a private copy
			var damaged []byte
			if tc.damage != nil {
				tc.damage(t, fs)
				damaged = readMemFile(t, fs, c.lastPath())
			}
			s, err := Open(eqDir, crashOpts(fs, sync))
			if tc.survive < 0 {
				if err == nil {
					s.Close()
					t.Fatalf("Open succeeded on a log damaged before its tail")
				}
				if !errors.Is(err, wal.ErrCorrupt) {
					t.Fatalf("Open: %v, want an error wrapping wal.ErrCorrupt", err)
				}
				t.Logf("Open: %v", err)
				for _, sub := range tc.openErr {
					if !strings.Contains(err.Error(), sub) {
						t.Errorf("Open error %q does not name %q", err, sub)
					}
				}
				// Nothing was left open or locked: a second try says the same.
				if _, err2 := Open(eqDir, crashOpts(fs, sync)); err2 == nil || err2.Error() != err.Error() {
					t.Errorf("second Open: %v, want %v", err2, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			want := c.h.steps[tc.survive-1].end
			m, _, _ := c.h.at(want)
			// The log may end with the sync mark before the torn record.
			if ri := s.RecoveryInfo(); ri.To != want && ri.To != want+walMarkSize || ri.From != 0 {
				t.Fatalf("recovered [%d, %d), want [0, %d): %d of %d records", ri.From, ri.To, want, tc.survive, n)
			}
			checkStore(t, s, m, c.queues)
			if s.NodeID() != c.node {
				t.Fatalf("node id %s, want %s", s.NodeID(), c.node)
			}
			broken := c.lastPath() + ".broken"
			if _, err := fs.Stat(broken); (err == nil) != tc.broken {
				t.Fatalf("%s exists: %v, want %v", broken, err == nil, tc.broken)
			}
			if tc.broken && !bytes.Equal(readMemFile(t, fs, broken), damaged) {
				t.Fatalf("%s does not hold the damaged segment", broken)
			}
			// The recovered store takes more work, and a clean restart keeps it.
			h := newModelHistory(m, want)
			g := newOpGen(uint64(tc.survive), c.node)
			g.strict = true
			for range 30 {
				modelDo(t, s, h, g.op(h.cur))
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			s = openCrash(t, fs, sync)
			defer s.Close()
			if ri := s.RecoveryInfo(); ri.Records != 0 {
				t.Fatalf("a clean reopen replayed %d records", ri.Records)
			}
			checkStore(t, s, h.cur, c.queues)
		})
	}
}

func (c *crashLog) mustPos(i int) int64 { _, off := c.pos(i); return off }

// TestAOFWriteErrorFailsStore injects write errors into the AOF files of an
// open store: the operation that hits one fails, the store refuses
// everything after it with ErrFailed (even once the disk is fine again), the
// fenced index cannot flush, Close returns, and a reopen recovers exactly
// the operations that succeeded.
func TestAOFWriteErrorFailsStore(t *testing.T) {
	for _, sync := range []wal.SyncPolicy{wal.SyncAlways, wal.SyncNever} {
		t.Run(sync.String(), func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			var failing atomic.Bool
			efs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
				if failing.Load() && op.Kind.ReadOrWrite() == errorfs.OpIsWrite && strings.HasSuffix(op.Path, ".wal") {
					return errorfs.ErrInjected
				}
				return nil
			}))
			// Every commit's writes go to Pebble at once, so that its
			// memtable holds records the failed AOF never got: the case
			// the fence is for.
			opts := crashOpts(efs, sync)
			opts.WriteBufferSize = -1
			s, err := Open(eqDir, opts)
			if err != nil {
				t.Fatal(err)
			}
			h := newModelHistory(newJobModel(), 0)
			noteOpen(h, s)
			g := newOpGen(7, s.NodeID())
			g.strict = true
			for i := range 80 {
				modelDo(t, s, h, g.op(h.cur))
				if i == 40 {
					if err := s.Checkpoint(); err != nil { // the index on disk has state too
						t.Fatal(err)
					}
				}
			}
			good := h.cur
			failing.Store(true)
			o := g.queuedJob(100)
			j := *o.job
			if err := s.Add(&j, o.body); !errors.Is(err, errorfs.ErrInjected) || !errors.Is(err, wal.ErrPoisoned) {
				t.Fatalf("Add with a failing AOF: %v", err)
			}
			failing.Store(false) // the disk recovers; the store must not
			ids := good.sortedIDs()
			errs := []error{s.Add(g.queuedJob(10).job, nil), s.Pause("alpha", PauseAll), s.Delete(ids[0]), s.Checkpoint()}
			for _, op := range []func(string) (*Job, error){
				func(id string) (*Job, error) { return s.Queue(id, 1) }, func(id string) (*Job, error) { return s.Deliver(id, 1) },
				func(id string) (*Job, error) { return s.Requeue(id, 1) }, func(id string) (*Job, error) { return s.Nack(id, 1, 0) },
				func(id string) (*Job, error) { return s.Working(id, 1) }, s.Dequeue, s.Ack,
			} {
				for _, id := range []string{ids[0], ids[len(ids)-1], o.id} {
					_, err := op(id)
					errs = append(errs, err)
				}
			}
			b := s.NewBatch()
			b.Ack(ids[1])
			for _, r := range s.Commit(b) {
				errs = append(errs, r.Err)
			}
			for i, err := range errs {
				if !errors.Is(err, ErrFailed) {
					t.Errorf("operation %d after the failure: %v, want ErrFailed", i, err)
				}
			}
			if err := s.Sync(); err == nil {
				t.Errorf("Sync of a poisoned log succeeded")
			}
			// Pebble flushing on its own now would persist batches whose
			// records never reached the log; the fence must stop it.
			if done, err := s.db.AsyncFlush(); err == nil {
				select {
				case <-done:
					t.Errorf("the index flushed after the aof failed")
				case <-time.After(50 * time.Millisecond):
				}
			}
			t.Logf("close after the failure: %v", s.Close())
			synced := mem.CrashClone(vfs.CrashCloneCfg{})
			for name, fs := range map[string]vfs.FS{"os": mem, "synced": synced} {
				if name == "synced" && sync != wal.SyncAlways {
					continue // under SyncNever a machine crash may lose what succeeded
				}
				s := openCrash(t, fs, sync)
				if _, err := s.Job(o.id); !errors.Is(err, ErrNotFound) {
					t.Errorf("%s: the failed Add left job %s: %v", name, o.id, err)
				}
				checkStore(t, s, good, g.queues)
				s.Close()
			}
		})
	}
}

// TestCheckpointReplaysOnlyTheTail checks that Checkpoint removes the front
// segments whose bodies were all deleted and keeps the first one with a live
// body (which still reads), and that a crash after it replays from the
// checkpointed LSN only.
func TestCheckpointReplaysOnlyTheTail(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := crashOpts(fs, wal.SyncNever)
	opts.CompressThreshold = -1
	s, err := Open(eqDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	g := newOpGen(11, s.NodeID())
	g.strict = true
	var jobs []*mop
	for range 36 { // ~600-byte records: six per segment
		o := g.queuedJob(600)
		modelDo(t, s, h, o)
		jobs = append(jobs, o)
	}
	before := s.Stats().Segments
	if len(before) < 5 {
		t.Fatalf("%d segments, want at least 5", len(before))
	}
	segName := func(id string) string {
		j := h.cur.jobs[id].job
		return s.log.Segments()[slices.IndexFunc(s.log.Segments(), func(si wal.SegmentInfo) bool {
			return si.First <= j.BodyLSN && j.BodyLSN < si.First+wal.LSN(si.Size)
		})].Name
	}
	// Keep one body in the third segment; delete every other in the first three.
	var keep string
	for _, o := range jobs {
		switch name := segName(o.id); {
		case name == before[2].Name && keep == "":
			keep = o.id
		case name <= before[2].Name:
			modelDo(t, s, h, &mop{kind: mopDelete, id: o.id})
		}
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	// What the checkpoint wrote forward (the node id, from the first
	// segment, which it removed) is in the index it flushed.
	ckpt := storeApplied(s)
	after := s.Stats().Segments
	if after[0].Name != before[2].Name || after[0].LiveBodies != 1 {
		t.Fatalf("after the checkpoint the log starts with %s (%d live bodies), want %s with 1", after[0].Name, after[0].LiveBodies, before[2].Name)
	}
	files, _ := fs.List(eqDir + "/aof")
	for _, seg := range before[:2] {
		if slices.Contains(files, seg.Name) {
			t.Fatalf("segment %s is still on disk: %v", seg.Name, files)
		}
	}
	checkStore(t, s, h.cur, g.queues) // the kept body still reads
	// More work after the checkpoint, partly synced, then a crash.
	for i := range 30 {
		modelDo(t, s, h, g.op(h.cur))
		if i == 20 {
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	durable := s.log.Durable()
	crashed := fs.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	opts.FS = crashed
	if s, err = Open(eqDir, opts); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	m, n, exact := h.at(durable)
	ri := s.RecoveryInfo()
	replayed := 0
	for _, st := range h.steps[:n] {
		if st.start >= ckpt {
			replayed++
		}
	}
	if !exact || ri.From != ckpt || ri.To != durable || ri.Records != replayed {
		t.Fatalf("replayed %d records [%d, %d), want %d records [%d, %d)", ri.Records, ri.From, ri.To, replayed, ckpt, durable)
	}
	checkStore(t, s, m, g.queues)
	// Once the kept body is deleted, the next checkpoint drops its segment.
	h = newModelHistory(m, durable)
	modelDo(t, s, h, &mop{kind: mopDelete, id: keep})
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	if first := s.Stats().Segments[0].Name; first <= before[2].Name {
		t.Fatalf("the log still starts with %s after its last body was deleted", first)
	}
	checkStore(t, s, h.cur, g.queues)
}

// gateFS blocks the first creation of an index sstable after it is armed
// until released: a flush stopped between its FlushBegin hook and its output.
type gateFS struct {
	vfs.FS
	armed            atomic.Bool
	entered, release chan struct{}
}

func (g *gateFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	if strings.HasSuffix(name, ".sst") && g.armed.CompareAndSwap(true, false) {
		close(g.entered)
		<-g.release
	}
	return g.FS.Create(name, c)
}

// Regression test; the bug it caught, now fixed (storage/store.go, Checkpoint → truncateLog): truncateLog decides which
// front segments hold no live body from the in-memory counts as they are when
// it runs, not as of the flushed checkpoint. An operation applied while the
// index flush runs (the background checkpoint loop runs concurrently with
// operations) lands in the next memtable; if it deletes the last live body of
// a front segment, the segment is removed although the durable index still
// references it:
//
//   - undurable-delete: the delete's record is not yet durable (SyncNever,
//     everysec, or not yet fsynced under always). After a crash the job is
//     back, as it must be, but its body is gone.
//   - durable-delete: replaying the delete charges the body to a segment it
//     is not in, because wal.Log.SegmentOf maps an LSN below the first
//     segment to the first segment (wal/log.go SegmentOf, `if i < 0`). That
//     segment's live count drops below its real one, reaches zero while one
//     of its bodies is live, and the next checkpoint deletes it: data loss.
//
// truncateLog should use the live counts captured with the checkpoint's
// applied LSN (or make the log durable up to what its counts reflect), and
// SegmentOf should not silently clamp.
func TestCheckpointKeepsSegmentsTheFlushedIndexNeeds(t *testing.T) {
	for _, durable := range []bool{false, true} {
		name := map[bool]string{false: "undurable-delete", true: "durable-delete"}[durable]
		t.Run(name, func(t *testing.T) { testCheckpointDeleteRace(t, durable) })
	}
}

func testCheckpointDeleteRace(t *testing.T, durable bool) {
	mem := vfs.NewCrashableMem()
	gate := &gateFS{FS: mem, entered: make(chan struct{}), release: make(chan struct{})}
	opts := crashOpts(gate, wal.SyncNever)
	opts.CompressThreshold = -1
	s, err := Open(eqDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	g := newOpGen(9, s.NodeID())
	x := g.queuedJob(1000) // its body goes to the first segment
	modelDo(t, s, h, x)
	var others []*mop
	for len(s.log.Segments()) < 4 {
		o := g.queuedJob(1000)
		modelDo(t, s, h, o)
		others = append(others, o)
	}
	// x is the only live body of the first segment, y of the second.
	segs := s.log.Segments()
	var y string
	for _, o := range others {
		if lsn := h.cur.jobs[o.id].job.BodyLSN; lsn < segs[1].First || lsn < segs[2].First && y != "" {
			modelDo(t, s, h, &mop{kind: mopDelete, id: o.id})
		} else if lsn < segs[2].First {
			y = o.id
		}
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	gate.armed.Store(true)
	ckpt := make(chan error, 1)
	go func() { ckpt <- s.Checkpoint() }()
	select {
	case <-gate.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the checkpoint's index flush never started")
	}
	modelDo(t, s, h, &mop{kind: mopDelete, id: x.id}) // written, not fsynced
	close(gate.release)
	if err := <-ckpt; err != nil {
		t.Fatal(err)
	}
	if durable {
		if err := s.Sync(); err != nil {
			t.Fatal(err)
		}
	}
	crashed := mem.CrashClone(vfs.CrashCloneCfg{})
	s.Close()
	opts.FS = crashed
	if s, err = Open(eqDir, opts); err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if !durable {
		j, err := s.Job(x.id)
		if err != nil {
			t.Fatalf("job %s: %v (its delete was never durable)", x.id, err)
		}
		if _, err := s.Body(j); err != nil {
			t.Fatalf("regression: the checkpoint removed segment %s while the durable index still needed it "+
				"(the delete of its last body ran during the index flush and was not durable): %v", segs[0].Name, err)
		}
		return
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	j, err := s.Job(y)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Body(j); err != nil {
		t.Fatalf("regression: after replaying the delete of %s (body in removed segment %s) the store charged it to %s, "+
			"whose live count fell to zero, and the next checkpoint removed it with job %s's body in it: %v\nsegments: %+v",
			x.id, segs[0].Name, segs[1].Name, y, err, s.Stats().Segments)
	}
}

// Regression test; the bug it caught, now fixed (storage/store.go, Checkpoint): Checkpoint checks that the store is
// usable only before it waits for the AOF. If the AOF fails after that wait
// but before the index flush (an operation applied meanwhile cannot be
// written), the FlushBegin hook fences the index, the flush can never write
// its output, and db.Flush waits for it for ever: Checkpoint hangs, and so
// would Close if the background loop were the one checkpointing. Checkpoint
// should not wait on a flush of a fenced index (check the fence, or flush
// with a cancellable wait).
func TestCheckpointReturnsWhenTheAOFFailsDuringItsFlush(t *testing.T) {
	mem := vfs.NewCrashableMem()
	var stage atomic.Int32 // 1: hold the next fsync of a segment; 2: fail segment writes
	held, resume := make(chan struct{}), make(chan struct{})
	efs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if !strings.HasSuffix(op.Path, ".wal") {
			return nil
		}
		if op.Kind == errorfs.OpFileSync && stage.CompareAndSwap(1, 3) {
			close(held)
			<-resume
			return nil
		}
		if stage.Load() == 2 && op.Kind.ReadOrWrite() == errorfs.OpIsWrite {
			return errorfs.ErrInjected
		}
		return nil
	}))
	s := openCrash(t, efs, wal.SyncNever)
	g := newOpGen(13, s.NodeID())
	for range 5 {
		o := g.queuedJob(50)
		if err := s.Add(o.job, o.body); err != nil {
			t.Fatal(err)
		}
	}
	applied := storeApplied(s)
	stage.Store(1)
	ckpt := make(chan error, 1)
	go func() { ckpt <- s.Checkpoint() }()
	<-held // Checkpoint is waiting for the AOF fsync of what it will flush
	add := make(chan error, 1)
	o := g.queuedJob(50)
	go func() { add <- s.Add(o.job, o.body) }()
	for deadline := time.Now().Add(10 * time.Second); storeApplied(s) == applied; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the add was never applied")
		}
	}
	stage.Store(2) // the add's write will fail
	close(resume)
	if err := <-add; err == nil {
		t.Fatal("the add succeeded with a failing aof")
	}
	select {
	case err := <-ckpt:
		t.Logf("checkpoint: %v", err)
	case <-time.After(2 * time.Second):
		// The checkpoint goroutine stays blocked in db.Flush; Close below
		// does not wait for it (the store has failed, so Close skips its
		// own checkpoint).
		t.Errorf("regression: Checkpoint hangs in the index flush after the aof failed under it")
	}
	t.Logf("close: %v", s.Close())
}

// TestRefusedOpenLeavesTheDirectoryAlone: an AOF whose last segment lost
// records the checkpointed index has applied is refused — and refused
// before anything is touched. (Open used to cut the segment and keep the
// original as .broken, and only then refuse because the index was ahead of
// the log, leaving the directory changed by a start that did not happen.)
func TestRefusedOpenLeavesTheDirectoryAlone(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openCrash(t, fs, wal.SyncAlways)
	g := newOpGen(5, s.NodeID())
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	for range 40 {
		modelDo(t, s, h, g.queuedJob(100))
	}
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	applied := storeApplied(s)
	crashed := fs.CrashClone(vfs.CrashCloneCfg{}) // killed: no clean close
	s.Close()
	segs := s.log.Segments()
	last := eqDir + "/aof/" + segs[len(segs)-1].Name
	b := readMemFile(t, crashed, last)
	cut := bytes.Clone(b[:len(b)-100])               // inside the last record, below the index's applied LSN
	writeMemFile(t, crashed, last, bytes.Clone(cut)) // MemFS scribbles on what it is given in race builds
	list := func() map[string]int64 {
		out := map[string]int64{}
		names, _ := crashed.List(eqDir + "/aof")
		for _, n := range names {
			st, _ := crashed.Stat(eqDir + "/aof/" + n)
			out[n] = st.Size()
		}
		return out
	}
	before := list()
	_, err := Open(eqDir, crashOpts(crashed, wal.SyncAlways))
	if !errors.Is(err, wal.ErrCorrupt) || !strings.Contains(err.Error(), fmt.Sprint(applied)) {
		t.Fatalf("Open: %v, want ErrCorrupt naming the index's applied lsn %d", err, applied)
	}
	if after := list(); !maps.Equal(before, after) {
		t.Fatalf("a refused Open changed the aof directory: %v, was %v", after, before)
	}
	if got := readMemFile(t, crashed, last); !bytes.Equal(got, cut) {
		t.Fatal("a refused Open changed the last segment")
	}
}

// TestFailedFsyncLosesNothingAcknowledged is fsyncgate at the store: under
// SyncNever (and everysec) an operation is acknowledged once written; an
// fsync then fails, and the operating system drops those pages (a crash
// clone keeps only what was synced) though it served them to the failed
// store. Reopened with what the failed store kept (Store.Unsynced), the
// store has every acknowledged operation; reopened without it, it would
// have lost them — which the test checks too, to show what it guards.
func TestFailedFsyncLosesNothingAcknowledged(t *testing.T) {
	mem := vfs.NewCrashableMem()
	var failing atomic.Bool
	efs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
		if failing.Load() && op.Kind == errorfs.OpFileSync && strings.HasSuffix(op.Path, ".wal") {
			return errorfs.ErrInjected
		}
		return nil
	}))
	opts := crashOpts(efs, wal.SyncNever)
	opts.SegmentSize = 1 << 20
	s, err := Open(eqDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	g := newOpGen(11, s.NodeID())
	g.strict = true
	for range 40 {
		modelDo(t, s, h, g.op(h.cur))
	}
	if err := s.Sync(); err != nil {
		t.Fatal(err)
	}
	durableModel := h.cur.clone()
	for range 40 { // acknowledged, written, not yet fsynced
		modelDo(t, s, h, g.op(h.cur))
	}
	acked := h.cur
	failing.Store(true)
	if err := s.Sync(); err == nil {
		t.Fatal("Sync with a failing disk succeeded")
	}
	s.Close()
	u := s.Unsynced()
	if u == nil || len(u.Data) == 0 {
		t.Fatalf("Unsynced() = %+v after a failed fsync with acknowledged writes after the last good one", u)
	}
	dropped := mem.CrashClone(vfs.CrashCloneCfg{}) // the pages the OS dropped are gone
	without := openCrash(t, dropped.CrashClone(vfs.CrashCloneCfg{}), wal.SyncNever)
	checkStore(t, without, durableModel, g.queues) // what a plain reopen would have served
	without.Close()
	ropts := crashOpts(dropped, wal.SyncNever)
	ropts.Rewrite = u
	s2, err := Open(eqDir, ropts)
	if err != nil {
		t.Fatal(err)
	}
	checkStore(t, s2, acked, g.queues)
	s2.Close()
}
