package wal

// Tests from a review of the format-2 log (2026-12-01): each failed on the
// code it reviewed.

import (
	"bytes"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestRefusedRewriteChangesNothing: an Open given what a failed fsync kept
// decides on the rewritten segment before it writes it: refused, it leaves
// the segment as it was.
func TestRefusedRewriteChangesNothing(t *testing.T) {
	fs, recs := syncedLog(t, 40)
	path := crashDir + "/" + segmentName(0)
	b, _ := fs.UnsafeGetFileDataBuffer(path)
	b[segmentHeaderSize+int(recs[5].lsn)+frameHeaderSize+1] ^= 1 // durable damage
	before := bytes.Clone(b)
	opts := crashOpts(fs, SyncAlways)
	opts.Rewrite = &Unsynced{Segment: 0, Synced: recs[30].end} // only a cut
	_, err := Open(crashDir, opts)
	var de *DamageError
	if !errors.As(err, &de) {
		t.Fatalf("Open: %v", err)
	}
	after := readFile(t, fs, path)
	if !bytes.Equal(after, before) {
		t.Errorf("a refused Open changed the segment: %d -> %d bytes", len(before), len(after))
	}
}

// TestCheckpointInsideARepairedSpan: damage that spans the owner's
// checkpoint is refused; a repair told the checkpoint splits its filler
// there, and the log then opens, with every record but the damaged ones.
func TestCheckpointInsideARepairedSpan(t *testing.T) {
	fs, recs := syncedLog(t, 60)
	path := crashDir + "/" + segmentName(0)
	b, _ := fs.UnsafeGetFileDataBuffer(path)
	start := segmentHeaderSize + int(recs[30].lsn) + frameHeaderSize + 2
	stop := segmentHeaderSize + int(recs[31].lsn) + frameHeaderSize + 2
	clear(b[start:stop]) // a bad sector across records 30, the mark, 31
	opts := crashOpts(fs, SyncAlways)
	opts.Checkpoint = recs[30].end
	if _, err := Open(crashDir, opts); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open before the repair: %v, want ErrCorrupt", err)
	}
	if _, err := RepairSegment(fs, crashDir, 0, opts.Checkpoint); err != nil {
		t.Fatal(err)
	}
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatalf("open after the repair: %v", err)
	}
	defer l.Close()
	if sr, err := l.CheckSegment(0); err != nil || len(sr.Damage) != 0 {
		t.Fatalf("check after the repair: %+v, %v", sr.Damage, err)
	}
	checkLog(t, l, recs[32].lsn, recs[32:])
}

// TestCleanCloseStatesItsRecordsDurable: after a clean Close every record is
// fsynced and a final mark says so: damage to one of them is corruption,
// refused, not a torn tail cut off with the acknowledged records after it.
func TestCleanCloseStatesItsRecordsDurable(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := crashOpts(fs, SyncEverySec)
	opts.SegmentSize = 1 << 20
	opts.SyncInterval = time.Hour
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	recs := appendRecs(t, l, 0, 100)
	if err := l.Close(); err != nil { // fsyncs everything
		t.Fatal(err)
	}
	b, _ := fs.UnsafeGetFileDataBuffer(crashDir + "/" + segmentName(0))
	b[segmentHeaderSize+int(recs[10].lsn)+frameHeaderSize+1] ^= 1
	var de *DamageError
	if _, err := Open(crashDir, crashOpts(fs, SyncEverySec)); !errors.As(err, &de) || de.LSN != recs[10].lsn {
		t.Fatalf("open after damage to a closed log: %v, want a DamageError at lsn %d", err, recs[10].lsn)
	}
}

// TestReadAtAMarkIsNoRecord: a reader never gets a sync mark (or a filler).
func TestReadAtAMarkIsNoRecord(t *testing.T) {
	fs, recs := syncedLog(t, 3)
	l, err := Open(crashDir, crashOpts(fs, SyncAlways))
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	markLSN := recs[1].lsn - markSize
	if r, err := l.Read(markLSN); !errors.Is(err, ErrCorrupt) {
		t.Errorf("Read(%d) = type %d, %v; want ErrCorrupt (a sync mark is no record)", markLSN, r.Type, err)
	}
	if _, errs := l.ReadEach([]LSN{markLSN, recs[1].lsn}, []int{8, 0}); !errors.Is(errs[0], ErrCorrupt) || errs[1] != nil {
		t.Errorf("ReadEach: %v", errs)
	}
}

// D: the everysec sync handle keeps a removed segment open.
type trackFS struct {
	vfs.FS
	mu   sync.Mutex
	open map[string]int
}
type trackFile struct {
	vfs.File
	fs   *trackFS
	name string
	once sync.Once
}

func (f *trackFile) Close() error {
	f.once.Do(func() { f.fs.mu.Lock(); f.fs.open[f.name]--; f.fs.mu.Unlock() })
	return f.File.Close()
}
func (fs *trackFS) Open(name string, o ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, o...)
	if err != nil {
		return f, err
	}
	fs.mu.Lock()
	fs.open[fs.PathBase(name)]++
	fs.mu.Unlock()
	return &trackFile{File: f, fs: fs, name: fs.PathBase(name)}, nil
}

// TestSyncHandleLetsGoOfSealedSegments: the everysec loop's own handle on a
// segment is closed once the segment is sealed, even when every tick finds
// nothing to sync, so a removed segment is not held open.
func TestSyncHandleLetsGoOfSealedSegments(t *testing.T) {
	tfs := &trackFS{FS: vfs.NewMem(), open: map[string]int{}}
	opts := crashOpts(tfs, SyncEverySec)
	opts.SegmentSize = 4096
	opts.SyncInterval = 2 * time.Millisecond
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, end, err := l.Append(testRecord(0))
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Durable() < end { // a tick opens the handle on segment 0 and syncs
		if time.Now().After(deadline) {
			t.Fatal("the everysec loop never synced")
		}
		time.Sleep(time.Millisecond)
	}
	l.mu.Lock()
	l.opts.MaxUnsynced = 1 // from now on every flush fsyncs inline (as past 64 MiB)
	l.mu.Unlock()
	for i := 1; len(l.Segments()) < 4; i++ {
		appendRecs(t, l, i, 1)
		if err := l.Sync(); err != nil { // the owner syncs: ticks find nothing to do
			t.Fatal(err)
		}
	}
	if err := truncateFront(l, l.Segments()[1].First); err != nil {
		t.Fatal(err)
	}
	if _, err := tfs.Stat(crashDir + "/" + segmentName(0)); err == nil {
		t.Fatal("not removed")
	}
	for {
		tfs.mu.Lock()
		n := tfs.open[segmentName(0)]
		tfs.mu.Unlock()
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("removed segment %s still held open (%d handles)", segmentName(0), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// E: a concurrent writer fsync that "succeeds" after the background fsync
// failed advances synced and throws away the kept bytes.
type splitFS struct {
	vfs.FS
	armed           atomic.Bool
	writerIn, bgErr chan struct{}
	once1, once2    sync.Once
	log             atomic.Pointer[Log]
}
type roFile struct {
	vfs.File
	fs *splitFS
}
type rwFile struct {
	vfs.File
	fs *splitFS
}

func (f roFile) Sync() error {
	if f.fs.armed.Load() {
		<-f.fs.writerIn
		f.fs.once2.Do(func() { close(f.fs.bgErr) })
		return errors.New("injected EIO on the sync handle")
	}
	return f.File.Sync()
}
func (f rwFile) Sync() error {
	if f.fs.armed.Load() {
		f.fs.once1.Do(func() { close(f.fs.writerIn) })
		<-f.fs.bgErr
		// Returns once the log has taken in the other handle's failure.
		for l := f.fs.log.Load(); l != nil && l.Err() == nil; {
			time.Sleep(time.Millisecond)
		}
		return nil // pages were dropped by the failed writeback; "success"
	}
	return f.File.Sync()
}
func (fs *splitFS) Open(name string, o ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, o...)
	if err != nil {
		return nil, err
	}
	return roFile{f, fs}, nil
}
func (fs *splitFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, o ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, o...)
	if err != nil {
		return nil, err
	}
	return rwFile{f, fs}, nil
}

// TestNoFsyncIsTrustedAfterOneFailed: the everysec handle's fsync fails
// while the writer's own "succeeds" (on some kernels and filesystems only
// one handle is told): the log keeps what it wrote since its last good fsync
// all the same, instead of dropping it on the later fsync's word.
func TestNoFsyncIsTrustedAfterOneFailed(t *testing.T) {
	sfs := &splitFS{FS: vfs.NewCrashableMem(), writerIn: make(chan struct{}), bgErr: make(chan struct{})}
	opts := crashOpts(sfs, SyncEverySec)
	opts.SegmentSize = 1 << 20
	opts.SyncInterval = 5 * time.Millisecond
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	sfs.log.Store(l)
	durable := appendRecs(t, l, 0, 20)
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	sfs.armed.Store(true)
	appendRecs(t, l, 20, 30) // acknowledged under everysec
	done := make(chan error)
	go func() { done <- l.Sync() }()
	err = <-done
	t.Logf("sync: %v", err)
	l.Close()
	u := l.Unsynced()
	t.Logf("unsynced: %+v", func() any {
		if u == nil {
			return nil
		}
		return struct {
			Seg, Synced LSN
			N           int
		}{u.Segment, u.Synced, len(u.Data)}
	}())
	// Synced is the end of the durable records, or of the mark the
	// everysec loop writes after them if a tick synced before the fsyncs
	// failed.
	end := durable[len(durable)-1].end
	if u == nil || u.Synced != end && u.Synced != end+markSize || len(u.Data) == 0 {
		t.Errorf("after a failed fsync the kept bytes were dropped on the word of a later fsync")
	}
}

type blockFS struct {
	vfs.FS
	armed atomic.Bool
	gate  chan struct{}
}
type blockFile struct {
	vfs.File
	fs *blockFS
}

func (f blockFile) WriteAt(p []byte, off int64) (int, error) {
	if f.fs.armed.Load() {
		<-f.fs.gate
	}
	return f.File.WriteAt(p, off)
}
func (fs *blockFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, o ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, o...)
	if err != nil {
		return nil, err
	}
	return blockFile{f, fs}, nil
}

// TestRemoveSegmentsKeepsQueuedSpans: RemoveSegments given the first LSN of a
// segment still queued for creation ignores it, as documented.
func TestRemoveSegmentsKeepsQueuedSpans(t *testing.T) {
	bfs := &blockFS{FS: vfs.NewMem(), gate: make(chan struct{})}
	opts := crashOpts(bfs, SyncAlways)
	opts.SegmentSize = 4096
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; len(l.Segments()) < 2; i++ {
		appendRecs(t, l, i, 1)
	}
	bfs.armed.Store(true)
	var queued LSN
	for i := 0; ; i++ {
		first, _, _ := l.Enqueue(Record{Type: 1, Payload: make([]byte, 1000)})
		if s, _ := l.SegmentOf(first); s != l.Segments()[1].First {
			queued = s
			break
		}
	}
	if err := l.RemoveSegments([]LSN{0, queued}); err != nil {
		t.Fatal(err)
	}
	if _, ok := l.SegmentOf(queued); !ok {
		t.Errorf("SegmentOf(%d) false after RemoveSegments was given a queued segment's first", queued)
	}
	bfs.armed.Store(false)
	close(bfs.gate)
}

// TestKeptBytesAcrossARoll: the failing fsync is in a segment the unsynced
// window rolled into, or the roll's own fsync: every acknowledged record
// comes back with the rewrite.
func TestKeptBytesAcrossARoll(t *testing.T) {
	for _, failSeg := range []int{0, 1} {
		mem := vfs.NewCrashableMem()
		var fail atomic.Bool
		var segFirst atomic.Uint64
		fs := errorfsWrap(mem, func(kind string, path string) error {
			if kind == "sync" && fail.Load() && path == crashDir+"/"+segmentName(LSN(segFirst.Load())) {
				return errors.New("injected")
			}
			return nil
		})
		opts := crashOpts(fs, SyncEverySec)
		opts.SegmentSize = 4096
		opts.SyncInterval = time.Hour
		l, err := Open(crashDir, opts)
		if err != nil {
			t.Fatal(err)
		}
		durable := appendRecs(t, l, 0, 10)
		l.Sync()
		if failSeg == 0 {
			segFirst.Store(0)
		} else {
			segFirst.Store(1 << 62) // set once the log rolls
		}
		fail.Store(true)
		var acked []rec
		for i := 10; len(l.Segments()) < 2 || len(acked) < 60; i++ {
			r := testRecord(i)
			first, end, err := l.Append(r)
			if err != nil {
				break
			}
			acked = append(acked, rec{first, end, r.Type, r.Payload})
			if n := l.Segments(); failSeg == 1 && len(n) == 2 {
				segFirst.Store(uint64(n[1].First))
			}
		}
		l.Sync()
		l.Close()
		u := l.Unsynced()
		if u == nil {
			t.Fatalf("fail %d: no Unsynced (err %v)", failSeg, l.Err())
		}
		dropped := mem.CrashClone(vfs.CrashCloneCfg{})
		ropts := crashOpts(dropped, SyncEverySec)
		ropts.SegmentSize = 4096
		ropts.Rewrite = u
		l2, err := Open(crashDir, ropts)
		if err != nil {
			t.Fatalf("fail %d: reopen: %v", failSeg, err)
		}
		n := 0
		l2.Replay(0, func(LSN, LSN, Record) error { n++; return nil })
		t.Logf("fail seg %d: u{Segment %d Synced %d data %d}, %d records back of %d", failSeg, u.Segment, u.Synced, len(u.Data), n, len(durable)+len(acked))
		if n != len(durable)+len(acked) {
			t.Errorf("fail %d: lost acked records", failSeg)
		}
		l2.Close()
	}
}

// TestEveryReadAfterCloseIsErrClosed: no reader reopens a closed log's files.
func TestEveryReadAfterCloseIsErrClosed(t *testing.T) {
	fs, _ := syncedLog(t, 30)
	l, err := Open(crashDir, crashOpts(fs, SyncAlways))
	if err != nil {
		t.Fatal(err)
	}
	l.Close()
	_, cerr := l.CheckSegment(0)
	for name, err := range map[string]error{
		"VerifySegment": l.VerifySegment(0), "Verify": l.Verify(),
		"ScanSegment": l.ScanSegment(0, func(LSN, Record) error { return nil }), "CheckSegment": cerr,
		"Replay": l.Replay(0, func(LSN, LSN, Record) error { return nil }),
	} {
		if !errors.Is(err, ErrClosed) {
			t.Errorf("%s after Close: %v, want ErrClosed", name, err)
		}
	}
}

func errorfsWrap(fs vfs.FS, f func(kind, path string) error) vfs.FS {
	return errorfs.Wrap(fs, errorfs.InjectorFunc(func(op errorfs.Op) error {
		k := ""
		if op.Kind == errorfs.OpFileSync {
			k = "sync"
		}
		return f(k, op.Path)
	}))
}
