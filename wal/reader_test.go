package wal

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSegmentOfGap: an LSN inside a segment removed from the middle of the
// log belongs to no segment. (SegmentOf used to answer the segment before
// the gap, and storage charged that segment's live count for a body that was
// not in it, which could let a checkpoint delete a live segment.)
func TestSegmentOfGap(t *testing.T) {
	l, err := Open("db", TestingOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for i := 0; i < 600; i++ {
		if _, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{1}, 300)}); err != nil {
			t.Fatal(err)
		}
	}
	segs := l.Segments()
	if len(segs) < 4 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	gone := segs[1]
	if err := l.RemoveSegments([]LSN{gone.First}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		lsn  LSN
		want LSN
		ok   bool
	}{
		{segs[0].First + 5, segs[0].First, true},
		{gone.First, 0, false},
		{gone.First + LSN(gone.Size) - 1, 0, false},
		{segs[2].First, segs[2].First, true},
		{segs[len(segs)-1].First + 1, segs[len(segs)-1].First, true},
	} {
		got, ok := l.SegmentOf(tc.lsn)
		if ok != tc.ok || got != tc.want {
			t.Errorf("SegmentOf(%d) = %d, %v; want %d, %v", tc.lsn, got, ok, tc.want, tc.ok)
		}
	}
	// A record still pending belongs to the segment it is bound for.
	first, end, err := l.Enqueue(Record{Type: 1, Payload: bytes.Repeat([]byte{2}, 60<<10)})
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := l.SegmentOf(first); !ok || got > first {
		t.Fatalf("SegmentOf(pending %d) = %d, %v", first, got, ok)
	}
	if err := l.Wait(end); err != nil {
		t.Fatal(err)
	}
}

// TestReadsAfterCloseAndRemoval: a read after Close is ErrClosed (the reader
// cache used to reopen and cache files for a closed log), and a read of a
// removed segment is ErrNotFound, whether it was removed before the read
// located it or between locating and opening it — never ErrCorrupt, and
// never a handle cached on the removed file.
func TestReadsAfterCloseAndRemoval(t *testing.T) {
	l, err := Open("db", TestingOptions())
	if err != nil {
		t.Fatal(err)
	}
	var lsns []LSN
	for i := 0; i < 400; i++ {
		lsn, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{byte(i)}, 500)})
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, lsn)
	}
	segs := l.Segments()
	victim := segs[1]
	in := victim.First
	for _, lsn := range lsns {
		if lsn >= victim.First && lsn < victim.First+LSN(victim.Size) {
			in = lsn
			break
		}
	}
	// Between locate and open: the cache is told the segment is gone.
	if err := l.readers.drop(victim.First); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read(in); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of a dropped segment: %v, want ErrNotFound", err)
	}
	if err := l.RemoveSegments([]LSN{victim.First}); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read(in); !errors.Is(err, ErrNotFound) {
		t.Fatalf("read of a removed segment: %v, want ErrNotFound", err)
	}
	if _, errs := l.ReadEach([]LSN{lsns[0], in, lsns[len(lsns)-1]}, []int{500, 500, 500}); errs[0] != nil || !errors.Is(errs[1], ErrNotFound) || errs[2] != nil {
		t.Fatalf("ReadEach: %v, want only the removed record to fail", errs)
	}
	l.readers.mu.Lock()
	_, cached := l.readers.files[victim.First]
	l.readers.mu.Unlock()
	if cached {
		t.Fatal("a handle on a removed segment is cached")
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Read(lsns[0]); !errors.Is(err, ErrClosed) {
		t.Fatalf("read after Close: %v, want ErrClosed", err)
	}
	if err := l.readers.readAt(segs[0].First, make([]byte, 10), 0); !errors.Is(err, ErrClosed) {
		t.Fatalf("reader cache after Close: %v, want ErrClosed", err)
	}
	if n := len(l.readers.files); n != 0 {
		t.Fatalf("%d handles cached after Close", n)
	}
}

// TestReadEachIsolatesDamage: one damaged record among neighbours read with
// one pread fails alone.
func TestReadEachIsolatesDamage(t *testing.T) {
	opts := TestingOptions()
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var lsns []LSN
	var hints []int
	for i := 0; i < 10; i++ {
		lsn, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{byte('a' + i)}, 100)})
		if err != nil {
			t.Fatal(err)
		}
		lsns, hints = append(lsns, lsn), append(hints, 100)
	}
	b, err := opts.FS.(*vfs.MemFS).UnsafeGetFileDataBuffer("db/" + segmentName(0))
	if err != nil {
		t.Fatal(err)
	}
	b[segmentHeaderSize+int(lsns[4])+frameHeaderSize+7] ^= 0x40
	out, errs := l.ReadEach(lsns, hints)
	for i := range lsns {
		switch {
		case i == 4 && !errors.Is(errs[i], ErrCorrupt):
			t.Fatalf("damaged record: %v, want ErrCorrupt", errs[i])
		case i != 4 && (errs[i] != nil || out[i].Payload[0] != byte('a'+i)):
			t.Fatalf("record %d: %v", i, errs[i])
		}
	}
	if _, err := l.ReadBatch(lsns, hints); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("ReadBatch: %v, want ErrCorrupt", err)
	}
}

// TestMarksAreInvisible: sync marks sit between records in the file, but no
// reader returns one, and Append refuses their type.
func TestMarksAreInvisible(t *testing.T) {
	opts := TestingOptions()
	opts.SegmentSize = 8 << 10
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recs := appendRecs(t, l, 0, 200) // SyncAlways: a mark before nearly every record
	marks := 0
	for i := 1; i < len(recs); i++ {
		if recs[i].lsn != recs[i-1].end {
			marks++
		}
	}
	if marks < 100 {
		t.Fatalf("%d marks between 200 records written one fsync each, want most of them", marks)
	}
	checkLog(t, l, 0, recs)
	segs := l.Segments()
	n := 0
	if err := l.ScanSegment(segs[0].First, func(lsn LSN, r Record) error {
		if r.Type == MarkType {
			t.Fatalf("ScanSegment returned a mark at %d", lsn)
		}
		n++
		return nil
	}); err != nil || n == 0 {
		t.Fatalf("scan: %d records, %v", n, err)
	}
	if _, _, err := l.Append(Record{Type: MarkType, Payload: make([]byte, 8)}); err == nil {
		t.Fatal("Append of the mark type succeeded")
	}
}

// TestReadOnlyOpenChangesNothing: a read-only Open of a log with a torn
// tail and stale files reads what is valid, refuses writes and leaves every
// file as it was.
func TestReadOnlyOpenChangesNothing(t *testing.T) {
	c := writeCrashLog(t, 8<<10, 10)
	fs := c.allFS.CrashClone(vfs.CrashCloneCfg{})
	n := len(c.recs)
	b := readFile(t, fs, c.lastPath())
	_, off := c.pos(n - 3)
	torn := b[:off+5]
	writeFile(t, fs, c.lastPath(), torn)
	writeFile(t, fs, crashDir+"/"+segmentName(999999)+tmpSuffix, []byte("stale"))
	names, _ := fs.List(crashDir)
	opts := crashOpts(fs, SyncAlways)
	opts.ReadOnly = true
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	checkLog(t, l, 0, c.recs[:n-3])
	if _, _, err := l.Append(testRecord(1)); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("append to a read-only log: %v", err)
	}
	if err := l.RemoveSegments([]LSN{0}); !errors.Is(err, ErrReadOnly) {
		t.Fatalf("remove from a read-only log: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	after, _ := fs.List(crashDir)
	if len(after) != len(names) {
		t.Fatalf("files %v, were %v", after, names)
	}
	if got := readFile(t, fs, c.lastPath()); !bytes.Equal(got, torn) {
		t.Fatal("a read-only Open changed the last segment")
	}
}

// TestVerifySegmentPaced: a paced verification reads no faster than asked
// (it may be slower on a busy machine: only the lower bound is checked),
// finds damage like Verify, and stops when its context is canceled.
func TestVerifySegmentPaced(t *testing.T) {
	opts := TestingOptions()
	opts.SegmentSize = 1 << 20
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	recs := appendRecs(t, l, 0, 3000) // about 220 KiB
	seg := l.Segments()[0]
	start := time.Now()
	if err := l.VerifySegmentPaced(context.Background(), seg.First, 1<<20); err != nil {
		t.Fatal(err)
	}
	if min := time.Duration(float64(seg.Size) / (1 << 20) * float64(time.Second)); time.Since(start) < min*9/10 {
		t.Fatalf("verified %d bytes in %v at 1 MiB/s, want at least %v", seg.Size, time.Since(start), min)
	}
	b, _ := opts.FS.(*vfs.MemFS).UnsafeGetFileDataBuffer("db/" + seg.Name)
	b[segmentHeaderSize+int(recs[2000].lsn)+frameHeaderSize+3] ^= 1
	if err := l.VerifySegmentPaced(context.Background(), seg.First, 0); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("paced verify of a damaged segment: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := l.VerifySegmentPaced(ctx, seg.First, 1<<10); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled verify: %v", err)
	}
}
