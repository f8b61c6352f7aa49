package wal

import (
	"bytes"
	"errors"
	"fmt"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestRemoveSegmentsLeavesGaps removes a segment from the middle of the log,
// as storage's collector does with a segment whose bodies are all dead, and
// checks every reader's view of the gap and what Open accepts.
func TestRemoveSegmentsLeavesGaps(t *testing.T) {
	opts := TestingOptions()
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	var lsns []LSN
	var want [][]byte
	for i := 0; i < 1500; i++ {
		p := append(bytes.Repeat([]byte{byte(i)}, i%400), fmt.Sprint(i)...)
		first, _, err := l.Append(Record{Type: 1, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		lsns, want = append(lsns, first), append(want, p)
	}
	segs := l.Segments()
	if len(segs) < 4 {
		t.Fatalf("want at least 4 segments, got %d", len(segs))
	}
	gone := segs[1]
	goneEnd := gone.First + LSN(gone.Size)
	active := segs[len(segs)-1]
	// The active segment is never removed, whatever the caller asks.
	if err := l.RemoveSegments([]LSN{gone.First, active.First, 12345}); err != nil {
		t.Fatal(err)
	}
	if got := len(l.Segments()); got != len(segs)-1 {
		t.Fatalf("%d segments after removing one of %d", got, len(segs))
	}
	inGap := func(lsn LSN) bool { return lsn >= gone.First && lsn < goneEnd }
	check := func(l *Log) {
		t.Helper()
		for i, lsn := range lsns {
			r, err := l.Read(lsn)
			switch {
			case inGap(lsn):
				if !errors.Is(err, ErrNotFound) {
					t.Fatalf("read of removed lsn %d: err %v, want ErrNotFound", lsn, err)
				}
			case err != nil:
				t.Fatalf("read %d: %v", lsn, err)
			case !bytes.Equal(r.Payload, want[i]):
				t.Fatalf("record %d: payload mismatch", i)
			}
		}
		// Replay across the gap is refused: the records are not there.
		if err := l.Replay(lsns[0], func(LSN, LSN, Record) error { return nil }); !errors.Is(err, ErrNotFound) {
			t.Fatalf("replay across the gap: err %v, want ErrNotFound", err)
		}
		// From the gap's end it works.
		n := 0
		if err := l.Replay(goneEnd, func(LSN, LSN, Record) error { n++; return nil }); err != nil {
			t.Fatal(err)
		}
		if want := countFrom(lsns, goneEnd); n != want {
			t.Fatalf("replay after the gap gave %d records, want %d", n, want)
		}
		if err := l.Verify(); err != nil {
			t.Fatalf("verify with a gap: %v", err)
		}
	}
	check(l)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Without Checkpoint a gap is damage: a segment went missing.
	if _, err := Open("db", opts); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with an unexpected gap: err %v, want ErrCorrupt", err)
	}
	// A Checkpoint short of the gap's end is not enough either.
	opts.Checkpoint = gone.First
	if _, err := Open("db", opts); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("open with Checkpoint inside the gap: err %v, want ErrCorrupt", err)
	}
	opts.Checkpoint = goneEnd
	l, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check(l)
	// Appends go on after a reopen with a gap.
	if _, _, err := l.Append(Record{Type: 1, Payload: []byte("after")}); err != nil {
		t.Fatal(err)
	}
}

func countFrom(lsns []LSN, from LSN) int {
	n := 0
	for _, lsn := range lsns {
		if lsn >= from {
			n++
		}
	}
	return n
}

func TestScanSegment(t *testing.T) {
	l, err := Open("db", TestingOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var lsns []LSN
	for i := 0; i < 800; i++ {
		first, _, err := l.Append(Record{Type: 3, Payload: bytes.Repeat([]byte{'x'}, 200)})
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, first)
	}
	segs := l.Segments()
	if len(segs) < 2 {
		t.Fatalf("want several segments, got %d", len(segs))
	}
	seg := segs[0]
	var got []LSN
	if err := l.ScanSegment(seg.First, func(lsn LSN, r Record) error {
		if r.Type != 3 || len(r.Payload) != 200 {
			return fmt.Errorf("bad record at %d", lsn)
		}
		got = append(got, lsn)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	wantN := 0
	for _, lsn := range lsns {
		if lsn < seg.First+LSN(seg.Size) {
			wantN++
		}
	}
	if len(got) != wantN || got[0] != seg.First {
		t.Fatalf("scanned %d records from %d, want %d from %d", len(got), got[0], wantN, seg.First)
	}
	if err := l.ScanSegment(segs[len(segs)-1].First, func(LSN, Record) error { return nil }); err == nil {
		t.Fatal("scan of the active segment succeeded")
	}
	if err := l.ScanSegment(seg.First+1, func(LSN, Record) error { return nil }); !errors.Is(err, ErrNotFound) {
		t.Fatalf("scan of no segment: %v", err)
	}
}

// TestOpenTrustsTheCheckpointedPrefix: with Options.Checkpoint inside the
// last segment, Open reads only the tail after it for a torn record, cuts a
// torn tail there exactly as without it, and leaves damage before it to
// Read and Verify (their CRC checks), which still find it.
func TestOpenTrustsTheCheckpointedPrefix(t *testing.T) {
	opts := TestingOptions()
	opts.SegmentSize = 1 << 20 // one segment
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	var lsns []LSN
	for i := range 100 {
		first, _, err := l.Append(Record{Type: 1, Payload: []byte(fmt.Sprintf("record %03d", i))})
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, first)
	}
	end := l.End()
	// A crash, not a Close: a Close states the last records durable with a
	// final sync mark, and damage to them would then be corruption.
	opts.FS = opts.FS.(*vfs.MemFS).CrashClone(vfs.CrashCloneCfg{})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	path := "db/" + segmentName(0)
	corrupt := func(lsn LSN) {
		t.Helper()
		f, err := opts.FS.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
		if err != nil {
			t.Fatal(err)
		}
		b := []byte{0}
		if _, err := f.ReadAt(b, segmentHeaderSize+int64(lsn)+frameHeaderSize+2); err != nil {
			t.Fatal(err)
		}
		b[0] ^= 0x40
		if _, err := f.WriteAt(b, segmentHeaderSize+int64(lsn)+frameHeaderSize+2); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Damage in the last record: a torn tail, cut at that record.
	corrupt(lsns[99])
	opts.Checkpoint = lsns[50]
	l, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	if got := l.End(); got != lsns[99] {
		t.Fatalf("log ends at %d after cutting a torn last record, want %d (was %d)", got, lsns[99], end)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	// Damage before the checkpoint is not Open's to find, but Verify and
	// Read find it.
	corrupt(lsns[10])
	l, err = Open("db", opts)
	if err != nil {
		t.Fatalf("open with damage before the checkpoint: %v", err)
	}
	defer l.Close()
	if err := l.Verify(); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("verify: %v, want ErrCorrupt", err)
	}
	if _, err := l.Read(lsns[10]); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("read of the damaged record: %v, want ErrCorrupt", err)
	}
	if r, err := l.Read(lsns[98]); err != nil || string(r.Payload) != "record 098" {
		t.Fatalf("read after the damage: %q, %v", r.Payload, err)
	}
}
