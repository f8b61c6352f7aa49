package wal

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncedLog writes n records under SyncAlways, each its own group commit, so
// that a sync mark before each record states the one before it durable, and
// returns the filesystem (the log closed) and the records.
func syncedLog(t *testing.T, n int) (*vfs.MemFS, []rec) {
	t.Helper()
	fs := vfs.NewCrashableMem()
	opts := crashOpts(fs, SyncAlways)
	opts.SegmentSize = 1 << 20
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	recs := appendRecs(t, l, 0, n)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	return fs, recs
}

// TestDurableDamageIsRefused: the two cases the torn-tail rule used to
// swallow. In a last segment of fsynced records, a flipped bit in one
// record's length field, or 4 KiB of zeros with valid records after them,
// is damage in the durable part: Open refuses with a DamageError that names
// the offset and what follows it, and changes nothing. (The flat frame of
// format 1 could not tell: the first truncated the log to the 5 records before
// the flip, the second to the records before the zeros, under appendfsync
// always, losing acknowledged writes.)
func TestDurableDamageIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		n       int
		corrupt func(b []byte, recs []rec) (at int) // returns the damaged record
	}{
		{"length bit of the 6th of 20 fsynced records", 20, func(b []byte, recs []rec) int {
			b[segmentHeaderSize+int(recs[5].lsn)+5] ^= 1 << 2 // the length field: bytes 4..8
			return 5
		}},
		{"4 KiB of zeros among fsynced records", 200, func(b []byte, recs []rec) int {
			off := segmentHeaderSize + int(recs[40].lsn)
			clear(b[off : off+4096])
			return 40
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs, recs := syncedLog(t, tc.n)
			path := crashDir + "/" + segmentName(0)
			b, err := fs.UnsafeGetFileDataBuffer(path)
			if err != nil {
				t.Fatal(err)
			}
			k := tc.corrupt(b, recs)
			before := bytes.Clone(b)
			_, err = Open(crashDir, crashOpts(fs, SyncAlways))
			var de *DamageError
			if !errors.As(err, &de) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open: %v, want a DamageError", err)
			}
			if want := segmentHeaderSize + int64(recs[k].lsn); de.Offset != want || de.LSN != recs[k].lsn {
				t.Fatalf("damage reported at offset %d (lsn %d), want %d (lsn %d)", de.Offset, de.LSN, want, recs[k].lsn)
			}
			if de.RecordsAfter == 0 || de.ResumeOffset <= de.Offset || de.DurableTo <= de.LSN {
				t.Fatalf("damage report %+v: want the records after it and a durable end past it", de)
			}
			msg := err.Error()
			for _, want := range []string{segmentName(0), fmt.Sprintf("offset %d", de.Offset), "corruption", "nothing was changed",
				fmt.Sprintf("%d valid records", de.RecordsAfter)} {
				if !strings.Contains(msg, want) {
					t.Fatalf("message %q does not say %q", msg, want)
				}
			}
			after, _ := fs.UnsafeGetFileDataBuffer(path)
			if !bytes.Equal(after, before) {
				t.Fatal("a refused Open changed the segment")
			}
			if names, _ := fs.List(crashDir); len(names) != 1 {
				t.Fatalf("a refused Open left files behind: %v", names)
			}
		})
	}
}

// TestRefusedOpenChangesNothing: a last segment cut short below the
// checkpoint its owner recorded (the index applied records that are gone)
// is refused before anything is touched — the torn-tail repair used to cut
// it and rename the original first — and so are stale temporary files: they
// stay until an Open succeeds.
func TestRefusedOpenChangesNothing(t *testing.T) {
	fs, recs := syncedLog(t, 50)
	path := crashDir + "/" + segmentName(0)
	tmp := crashDir + "/" + segmentName(99999) + tmpSuffix
	writeFile(t, fs, tmp, []byte("stale"))
	b := readFile(t, fs, path)
	cut := b[:segmentHeaderSize+int(recs[30].lsn)+3] // inside record 30
	writeFile(t, fs, path, cut)
	opts := crashOpts(fs, SyncAlways)
	opts.Checkpoint = recs[40].end // the owner applied up to record 40
	_, err := Open(crashDir, opts)
	if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "missing") {
		t.Fatalf("Open: %v, want ErrCorrupt saying the end of the log is missing", err)
	}
	if got := readFile(t, fs, path); !bytes.Equal(got, cut) {
		t.Fatal("the segment changed")
	}
	for _, p := range []string{path + brokenSuffix} {
		if _, err := fs.Stat(p); err == nil {
			t.Fatalf("%s exists after a refused Open", p)
		}
	}
	if _, err := fs.Stat(tmp); err != nil {
		t.Fatalf("stale temporary file removed by a refused Open: %v", err)
	}
	// With the checkpoint below the cut it is a torn tail: cut, and the
	// stale file goes.
	opts.Checkpoint = recs[20].end
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	checkLog(t, l, 0, recs[:30])
	if _, err := fs.Stat(tmp); err == nil {
		t.Fatal("stale temporary file survived an Open")
	}
}

// TestDamageBelowTheCheckpointIsLeftToVerify: Open does not read what the
// owner checkpointed (a restart costs the tail, not the segment), so damage
// there is found by Verify and by the read that trips on it, each naming the
// offset; records after the checkpoint are still checked by Open.
func TestDamageBelowTheCheckpointIsLeftToVerify(t *testing.T) {
	fs, recs := syncedLog(t, 30)
	path := crashDir + "/" + segmentName(0)
	b, _ := fs.UnsafeGetFileDataBuffer(path)
	b[segmentHeaderSize+int(recs[10].lsn)+frameHeaderSize+1] ^= 1
	opts := crashOpts(fs, SyncAlways)
	opts.Checkpoint = recs[20].end
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	at := fmt.Sprintf("segment %s offset %d", segmentName(0), segmentHeaderSize+int64(recs[10].lsn))
	for name, err := range map[string]error{
		"verify": l.Verify(),
		"read":   func() error { _, err := l.Read(recs[10].lsn); return err }(),
		"replay": l.Replay(0, func(LSN, LSN, Record) error { return nil }),
	} {
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), at) {
			t.Fatalf("%s: %v, want ErrCorrupt naming %q", name, err, at)
		}
	}
	checkLog(t, l, recs[11].lsn, recs[11:])
}

// TestRepairSegmentKeepsWhatFollowsTheDamage: a segment refused for damage
// in its durable part is repaired in place — the damaged span becomes a
// filler frame — and then opens with every other record where it was; the
// original is kept as .broken.
func TestRepairSegmentKeepsWhatFollowsTheDamage(t *testing.T) {
	fs, recs := syncedLog(t, 60)
	path := crashDir + "/" + segmentName(0)
	b, _ := fs.UnsafeGetFileDataBuffer(path)
	b[segmentHeaderSize+int(recs[20].lsn)+5] ^= 0x08                 // record 20's length
	b[segmentHeaderSize+int(recs[40].lsn)+frameHeaderSize+2] ^= 0x01 // record 40's payload
	damaged := bytes.Clone(b)
	if _, err := Open(crashDir, crashOpts(fs, SyncAlways)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("Open: %v, want ErrCorrupt", err)
	}
	rep, err := RepairSegment(fs, crashDir, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Damage) != 2 || rep.Damage[0].LSN != recs[20].lsn || rep.Damage[1].LSN != recs[40].lsn || rep.Records != 58 {
		t.Fatalf("repair report %+v: want 2 spans at records 20 and 40, 58 records", rep)
	}
	if got := readFile(t, fs, path+brokenSuffix); !bytes.Equal(got, damaged) {
		t.Fatal(".broken does not hold the damaged original")
	}
	l, err := Open(crashDir, crashOpts(fs, SyncAlways))
	if err != nil {
		t.Fatalf("Open after the repair: %v", err)
	}
	defer l.Close()
	var want []rec
	for i, r := range recs {
		if i != 20 && i != 40 {
			want = append(want, r)
		}
	}
	n := 0
	if err := l.Replay(0, func(lsn, _ LSN, r Record) error {
		if lsn != want[n].lsn || !bytes.Equal(r.Payload, want[n].payload) {
			return fmt.Errorf("record %d at %d, want %d", n, lsn, want[n].lsn)
		}
		n++
		return nil
	}); err != nil || n != len(want) {
		t.Fatalf("replay after the repair: %d records, %v", n, err)
	}
	if err := l.Verify(); err != nil {
		t.Fatal(err)
	}
}
