package wal

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// writeV1Log writes a log as builds before format 2 did: segments of
// segSize bytes holding n records in flat len|crc|type frames after a
// 16-byte header. It returns the records.
func writeV1Log(t *testing.T, fs vfs.FS, n int, segSize int) []rec {
	t.Helper()
	if err := fs.MkdirAll(crashDir, 0o755); err != nil {
		t.Fatal(err)
	}
	var recs []rec
	var seg []byte
	first, lsn := LSN(0), LSN(0)
	flush := func() {
		writeFile(t, fs, crashDir+"/"+segmentName(first), append(segmentHeaderV1(first), seg...))
		first, seg = lsn, nil
	}
	for i := range n {
		r := testRecord(i)
		fr := appendFrameV1(nil, r)
		if len(seg) > 0 && len(seg)+len(fr) > segSize {
			flush()
		}
		seg = append(seg, fr...)
		recs = append(recs, rec{lsn: lsn, end: lsn + LSN(len(fr)), typ: r.Type, payload: r.Payload})
		lsn += LSN(len(fr))
	}
	flush()
	return recs
}

// TestOpensFormat1Logs: a log written before format 2 opens as it is: its
// records read, replay and verify; new records go to a new format-2 segment;
// and all of it reopens.
func TestOpensFormat1Logs(t *testing.T) {
	fs := vfs.NewMem()
	old := writeV1Log(t, fs, 300, 4096)
	opts := crashOpts(fs, SyncAlways)
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	segs := l.Segments()
	if len(segs) < 4 || segs[0].Version != 1 || segs[len(segs)-1].Version != formatVersion {
		t.Fatalf("segments %+v: want the old format-1 ones, then a new format-2 active one", segs)
	}
	checkLog(t, l, 0, old)
	if err := l.Verify(); err != nil {
		t.Fatal(err)
	}
	more := appendRecs(t, l, 300, 100)
	all := append(old, more...)
	checkLog(t, l, 0, all)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkLog(t, l, 0, all)
	got, err := l.ReadBatch([]LSN{old[3].lsn, more[2].lsn, old[299].lsn}, []int{0, 0, 0})
	if err != nil || string(got[0].Payload) != string(old[3].payload) || string(got[1].Payload) != string(more[2].payload) {
		t.Fatalf("ReadBatch across formats: %v", err)
	}
}

// TestFormat1TailRepair: the last segment of an old log is recovered by the
// old rules — a torn tail is cut, a bad frame that a valid one follows is
// refused unless it holds a zeroed sector — and refusing changes nothing.
func TestFormat1TailRepair(t *testing.T) {
	for _, tc := range []struct {
		name    string
		corrupt func(b []byte, off int) // off: file offset of the damaged record
		refused bool
	}{
		{"torn tail", func(b []byte, off int) { clear(b[off+3:]) }, false},
		{"bad crc followed by a valid frame", func(b []byte, off int) { b[off+5] ^= 1 }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := vfs.NewMem()
			recs := writeV1Log(t, fs, 20, 1<<20)
			path := crashDir + "/" + segmentName(0)
			b := readFile(t, fs, path)
			k := 15
			tc.corrupt(b, segmentHeaderSizeV1+int(recs[k].lsn))
			writeFile(t, fs, path, b)
			l, err := Open(crashDir, crashOpts(fs, SyncAlways))
			if tc.refused {
				if !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Open: %v, want ErrCorrupt", err)
				}
				if got := readFile(t, fs, path); string(got) != string(b) {
					t.Fatal("a refused Open changed the segment")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			checkLog(t, l, 0, recs[:k])
		})
	}
}
