package wal

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

var seedFlag = flag.Uint64("wal.seed", 0, "seed for randomised wal tests (0: from the clock)")

// testSeed returns the seed of a randomised test and logs it, so that a
// failure can be replayed with -wal.seed.
func testSeed(t testing.TB) uint64 {
	t.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -wal.seed=%d)", seed, seed)
	return seed
}

const crashDir = "wal"

// markSize is the LSN space a sync mark takes: records appended after a sync
// may start that far after the previous record's end.
const markSize = LSN(frameHeaderSize + markPayloadSize)

// crashOpts are the options of the crash tests: 8 KiB segments so the log has
// several, and no logging.
func crashOpts(fs vfs.FS, sync SyncPolicy) Options {
	return Options{FS: fs, SegmentSize: 8 << 10, Sync: sync, Logger: slog.New(slog.DiscardHandler)}
}

// rec is a record a test appended and where it went.
type rec struct {
	lsn, end LSN
	typ      RecordType
	payload  []byte
}

// testRecord returns the i-th record of a test: distinct payloads of varying
// length and varying types.
func testRecord(i int) Record {
	p := fmt.Appendf(nil, "rec-%05d-", i)
	p = append(p, bytes.Repeat([]byte{'a' + byte(i%26)}, (i*37)%120)...)
	return Record{Type: RecordType(1 + i%3), Payload: p}
}

func appendRecs(t *testing.T, l *Log, from, n int) []rec {
	t.Helper()
	var out []rec
	for i := from; i < from+n; i++ {
		r := testRecord(i)
		first, end, err := l.Append(r)
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		out = append(out, rec{lsn: first, end: end, typ: r.Type, payload: r.Payload})
	}
	return out
}

// checkLog asserts that replaying l from lsn from yields exactly want, that
// each record reads back alone, and that the log ends after the last of them.
func checkLog(t *testing.T, l *Log, from LSN, want []rec) {
	t.Helper()
	i := 0
	err := l.Replay(from, func(lsn, _ LSN, r Record) error {
		if i >= len(want) {
			return fmt.Errorf("unexpected record %q at lsn %d after the last expected one", r.Payload, lsn)
		}
		w := want[i]
		if lsn != w.lsn || r.Type != w.typ || !bytes.Equal(r.Payload, w.payload) {
			return fmt.Errorf("record %d: got lsn %d type %d %q, want lsn %d type %d %q",
				i, lsn, r.Type, r.Payload, w.lsn, w.typ, w.payload)
		}
		i++
		return nil
	})
	if err != nil {
		t.Fatalf("replay from %d: %v", from, err)
	}
	if i != len(want) {
		t.Fatalf("replayed %d records from %d, want %d", i, from, len(want))
	}
	// The log ends after the last record, or after a sync mark that follows
	// it (a tail cut inside the next record may keep the mark before it).
	if end := endOf(from, want); l.End() != end && l.End() != end+markSize {
		t.Fatalf("log ends at %d, want %d", l.End(), end)
	}
	for _, w := range want {
		r, err := l.Read(w.lsn)
		if err != nil || !bytes.Equal(r.Payload, w.payload) {
			t.Fatalf("read %d: %q, %v; want %q", w.lsn, r.Payload, err, w.payload)
		}
	}
}

func readFile(t *testing.T, fs vfs.FS, path string) []byte {
	t.Helper()
	f, err := fs.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func writeFile(t *testing.T, fs vfs.FS, path string, data []byte) {
	t.Helper()
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		t.Fatal(err)
	}
	// MemFS scribbles over written buffers in race builds: hand it a copy.
	if _, err := f.Write(slices.Clone(data)); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
}

// crashLog is a log written for the crash table: records [0, synced) are
// durable, the rest were written after the last fsync, all in the last
// segment.
type crashLog struct {
	recs   []rec
	synced int
	segs   []SegmentInfo
	// syncedFS holds exactly the fsynced data, allFS everything written; the
	// log was open (so unsynced data stayed unsynced) when they were cloned.
	syncedFS, allFS *vfs.MemFS
	// random are crash clones keeping a random half of the unsynced blocks.
	random []*vfs.MemFS
}

// writeCrashLog writes a crashLog of four segments of segSize bytes, the last
// holding at least 2 KiB of synced records and then unsynced ones.
func writeCrashLog(t *testing.T, segSize int64, unsynced int) *crashLog {
	t.Helper()
	fs := vfs.NewCrashableMem()
	opts := crashOpts(fs, SyncNever)
	opts.SegmentSize = segSize
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	c := &crashLog{}
	// Fill three segments and 2 KiB of a fourth, so the last segment holds
	// synced records followed by unsynced ones.
	for len(l.Segments()) < 4 || l.Segments()[3].Size < 2<<10 {
		c.recs = append(c.recs, appendRecs(t, l, len(c.recs), 1)...)
	}
	if err := l.Sync(); err != nil {
		t.Fatal(err)
	}
	c.synced = len(c.recs)
	c.recs = append(c.recs, appendRecs(t, l, len(c.recs), unsynced)...)
	c.segs = l.Segments()
	if len(c.segs) != 4 {
		t.Fatalf("unsynced records rolled the log: %d segments", len(c.segs))
	}
	if d := l.Durable(); d != c.recs[c.synced-1].end {
		t.Fatalf("durable %d, want %d", d, c.recs[c.synced-1].end)
	}
	c.syncedFS = fs.CrashClone(vfs.CrashCloneCfg{})
	seed := testSeed(t)
	rng := rand.New(rand.NewPCG(seed, seed))
	c.allFS = fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rng})
	for range 16 {
		c.random = append(c.random, fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 50, RNG: rng}))
	}
	return c
}

// seg returns the index in c.segs of the segment holding record i.
func (c *crashLog) seg(i int) int {
	s := len(c.segs) - 1
	for c.segs[s].First > c.recs[i].lsn {
		s--
	}
	return s
}

// pos returns the path of the segment holding record i and the record's file
// offset.
func (c *crashLog) pos(i int) (path string, off int64) {
	s := c.segs[c.seg(i)]
	return crashDir + "/" + s.Name, segmentHeaderSize + int64(c.recs[i].lsn-s.First)
}

// firstIn returns the index of the first record of segment s.
func (c *crashLog) firstIn(s int) int {
	return slices.IndexFunc(c.recs, func(r rec) bool { return r.lsn >= c.segs[s].First })
}

func (c *crashLog) lastPath() string { return crashDir + "/" + c.segs[len(c.segs)-1].Name }

// outcome is what a crash case expects of Open and of the reopened log.
type outcome struct {
	// openErr, if set, are substrings of the ErrCorrupt Open must return.
	openErr []string
	// Records [from, to) survive, and replay from the first of them.
	from, to int
	// broken, if set, is what the last segment's .broken copy must hold; if
	// nil there must be none.
	broken []byte
	// bad, if >= 0, is a record that Open does not read but Replay(0),
	// Verify and Read must report as corrupt with badErr in the message.
	bad    int
	badErr string
}

func flipBit(t *testing.T, fs vfs.FS, path string, off int64, bit uint) {
	t.Helper()
	b := readFile(t, fs, path)
	b[off] ^= 1 << bit
	writeFile(t, fs, path, b)
}

func TestCrashRepairTable(t *testing.T) {
	c := writeCrashLog(t, 8<<10, 10)
	n, last := len(c.recs), len(c.segs)-1
	survive := func(to int) outcome { return outcome{to: to, bad: -1} }
	// cut keeps the first size bytes of the last segment.
	cut := func(t *testing.T, fs *vfs.MemFS, size int64) []byte {
		b := readFile(t, fs, c.lastPath())[:size]
		writeFile(t, fs, c.lastPath(), b)
		return b
	}
	zeroFrom := func(t *testing.T, fs *vfs.MemFS, off int64) []byte {
		b := readFile(t, fs, c.lastPath())
		clear(b[off:])
		writeFile(t, fs, c.lastPath(), b)
		return b
	}
	// flipLast flips bit bit of byte delta of record k, in the last segment,
	// and expects k and the records after it to be cut off.
	flipLast := func(k int, delta int64, bit uint) func(*testing.T, *vfs.MemFS) outcome {
		return func(t *testing.T, fs *vfs.MemFS) outcome {
			path, off := c.pos(k)
			flipBit(t, fs, path, off+delta, bit)
			return outcome{to: k, bad: -1, broken: readFile(t, fs, path)}
		}
	}
	corruptMiddle := func(delta int64, bit uint) func(*testing.T, *vfs.MemFS) outcome {
		return func(t *testing.T, fs *vfs.MemFS) outcome {
			k := c.firstIn(last) + 3
			path, off := c.pos(k)
			flipBit(t, fs, path, off+delta, bit)
			return outcome{openErr: []string{fmt.Sprintf("segment %s offset %d", c.segs[last].Name, off)}}
		}
	}

	for _, tc := range []struct {
		name    string
		fs      *vfs.MemFS // the crash clone to start from
		corrupt func(t *testing.T, fs *vfs.MemFS) outcome
	}{
		{"drop unsynced writes", c.syncedFS, func(*testing.T, *vfs.MemFS) outcome { return survive(c.synced) }},
		{"keep unsynced writes", c.allFS, func(*testing.T, *vfs.MemFS) outcome { return survive(n) }},
		{"truncate mid-header", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			_, off := c.pos(n - 3)
			return outcome{to: n - 3, bad: -1, broken: cut(t, fs, off+4)}
		}},
		{"truncate mid-payload", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			_, off := c.pos(n - 5)
			return outcome{to: n - 5, bad: -1, broken: cut(t, fs, off+frameHeaderSize+3)}
		}},
		{"truncate synced record", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			k := c.firstIn(last) + 1
			_, off := c.pos(k)
			return outcome{to: k, bad: -1, broken: cut(t, fs, off+int64(len(c.recs[k].payload)))}
		}},
		{"truncate at record boundary", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			_, off := c.pos(n - 2)
			cut(t, fs, off)
			return survive(n - 2) // nothing torn, so no .broken
		}},
		{"truncate to header", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			cut(t, fs, segmentHeaderSize)
			return survive(c.firstIn(last))
		}},
		{"zero tail mid-record", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			_, off := c.pos(n - 4)
			return outcome{to: n - 4, bad: -1, broken: zeroFrom(t, fs, off+frameHeaderSize+1)}
		}},
		{"zero tail mid-header", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			_, off := c.pos(n - 6)
			return outcome{to: n - 6, bad: -1, broken: zeroFrom(t, fs, off+2)}
		}},
		{"zero tail at record boundary", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			_, off := c.pos(n - 7)
			return outcome{to: n - 7, bad: -1, broken: zeroFrom(t, fs, off)}
		}},
		{"flip payload bit of last record", c.allFS, flipLast(n-1, frameHeaderSize+2, 0)},
		{"flip crc bit of last record", c.allFS, flipLast(n-1, 5, 7)},
		{"flip type bit of last record", c.allFS, flipLast(n-1, 8, 1)},
		{"flip length bit of last record", c.allFS, flipLast(n-1, 0, 6)},
		{"flip last synced record after drop", c.syncedFS, flipLast(c.synced-1, frameHeaderSize, 3)},
		{"flip payload bit mid last segment", c.allFS, corruptMiddle(frameHeaderSize+4, 2)},
		{"flip crc bit mid last segment", c.allFS, corruptMiddle(6, 0)},
		{"zero type mid last segment", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			k := c.firstIn(last) + 5
			path, off := c.pos(k)
			b := readFile(t, fs, path)
			b[off+8] = 0
			writeFile(t, fs, path, b)
			return outcome{openErr: []string{fmt.Sprintf("segment %s offset %d", c.segs[last].Name, off)}}
		}},
		{"flip bit in earlier segment", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			k := c.firstIn(1) + 7
			path, off := c.pos(k)
			flipBit(t, fs, path, off+frameHeaderSize+1, 5)
			return outcome{to: n, bad: k, badErr: fmt.Sprintf("segment %s offset %d", c.segs[1].Name, off)}
		}},
		{"remove middle segment", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			if err := fs.Remove(crashDir + "/" + c.segs[1].Name); err != nil {
				t.Fatal(err)
			}
			return outcome{openErr: []string{"segment " + c.segs[0].Name, c.segs[2].Name}}
		}},
		{"remove first segment", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			if err := fs.Remove(crashDir + "/" + c.segs[0].Name); err != nil {
				t.Fatal(err)
			}
			return outcome{from: c.firstIn(1), to: n, bad: -1}
		}},
		{"bad header in last segment", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			flipBit(t, fs, c.lastPath(), 3, 0)
			return outcome{openErr: []string{"bad segment header", c.segs[last].Name}}
		}},
		{"stale tmp files", c.allFS, func(t *testing.T, fs *vfs.MemFS) outcome {
			// A crash while creating the next segment, and while repairing.
			writeFile(t, fs, crashDir+"/"+segmentName(c.recs[n-1].end)+tmpSuffix, []byte("dqwal"))
			writeFile(t, fs, c.lastPath()+tmpSuffix, []byte("garbage"))
			return survive(n)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fs := tc.fs.CrashClone(vfs.CrashCloneCfg{}) // a private copy
			want := tc.corrupt(t, fs)
			checkCrashOutcome(t, c, fs, want)
		})
	}
}

// checkCrashOutcome opens the log in fs and checks want; if the log survives
// it appends more records and checks them across another reopen.
func checkCrashOutcome(t *testing.T, c *crashLog, fs *vfs.MemFS, want outcome) {
	t.Helper()
	opts := crashOpts(fs, SyncAlways)
	l, err := Open(crashDir, opts)
	if want.openErr != nil {
		if err == nil {
			l.Close()
			t.Fatal("Open succeeded on a corrupt log")
		}
		if !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open: %v, want ErrCorrupt", err)
		}
		for _, s := range want.openErr {
			if !strings.Contains(err.Error(), s) {
				t.Fatalf("Open: %v, want it to mention %q", err, s)
			}
		}
		return
	}
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	names, err := fs.List(crashDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasSuffix(name, tmpSuffix) {
			t.Fatalf("stale %s survived Open", name)
		}
	}
	brokenPath := c.lastPath() + brokenSuffix
	if want.broken == nil {
		if _, err := fs.Stat(brokenPath); err == nil {
			t.Fatalf("%s exists, want none", brokenPath)
		}
	} else if got := readFile(t, fs, brokenPath); !bytes.Equal(got, want.broken) {
		t.Fatalf("%s holds %d bytes, not the %d of the original", brokenPath, len(got), len(want.broken))
	}

	survivors := slices.Clone(c.recs[want.from:want.to])
	from := LSN(0)
	if want.from > 0 {
		from = c.segs[c.seg(want.from)].First
	}
	if l.First() != from {
		t.Fatalf("First() = %d, want %d", l.First(), from)
	}
	checkBad := func(l *Log) {
		if want.bad < 0 {
			return
		}
		for _, err := range []error{
			l.Replay(0, func(LSN, LSN, Record) error { return nil }),
			l.Verify(),
			func() error { _, err := l.Read(c.recs[want.bad].lsn); return err }(),
		} {
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), want.badErr) {
				t.Fatalf("got %v, want ErrCorrupt naming %q", err, want.badErr)
			}
		}
	}
	replayFrom := from
	if want.bad >= 0 {
		// Records after the damaged segment still replay.
		next := c.seg(want.bad) + 1
		survivors = survivors[c.firstIn(next)-want.from:]
		replayFrom = c.segs[next].First
	}
	checkBad(l)
	checkLog(t, l, replayFrom, survivors)

	// The log goes on from where it now ends.
	end := l.End()
	more := appendRecs(t, l, 1000, 40)
	if more[0].lsn != end && more[0].lsn != end+markSize {
		t.Fatalf("new records start at %d, want %d (or after a sync mark)", more[0].lsn, end)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open(crashDir, opts)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	defer l.Close()
	checkBad(l)
	checkLog(t, l, replayFrom, append(survivors, more...))
}

// endOf returns the end of recs, which start at from.
func endOf(from LSN, recs []rec) LSN {
	if len(recs) == 0 {
		return from
	}
	return recs[len(recs)-1].end
}

// TestCrashKeepsDurablePrefix opens crash clones that kept a random half of
// the 4 KiB blocks of unsynced writes (about 20 KiB): each must recover every
// synced record, then a prefix of the rest, and nothing else.
func TestCrashKeepsDurablePrefix(t *testing.T) {
	c := writeCrashLog(t, 32<<10, 250)
	for i, fs := range c.random {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			l, err := Open(crashDir, crashOpts(fs, SyncAlways))
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			k := 0
			for k < len(c.recs) && c.recs[k].lsn < l.End() {
				k++
			}
			if k < c.synced {
				t.Fatalf("recovered %d records, but %d were synced", k, c.synced)
			}
			t.Logf("recovered %d of %d unsynced records", k-c.synced, len(c.recs)-c.synced)
			checkLog(t, l, 0, c.recs[:k])
			more := appendRecs(t, l, 1000, 5)
			checkLog(t, l, 0, append(slices.Clone(c.recs[:k]), more...))
		})
	}
}

// TestDamageInsideARecordIsTornOnlyIfUnsynced: unsynced pages reach the
// disk in any order, so a crash can leave a large record with a zeroed sector
// (or any garbage) followed by whole records. In the unsynced tail that is a
// torn write, cut off; in the part a sync mark states durable, the same
// damage is corruption, and Open refuses without changing the file.
func TestDamageInsideARecordIsTornOnlyIfUnsynced(t *testing.T) {
	zeroSector := func(b []byte, start int) {
		sec := (start+frameHeaderSize+sectorSize-1)/sectorSize*sectorSize + sectorSize
		clear(b[sec : sec+sectorSize])
	}
	flip := func(b []byte, start int) { b[start+frameHeaderSize+2000] ^= 0x10 }
	for _, tc := range []struct {
		name    string
		synced  bool // the big record was fsynced, and a mark after it says so
		corrupt func(b []byte, start int)
	}{
		{"unsynced zeroed sector", false, zeroSector},
		{"unsynced bit flip", false, flip},
		{"synced zeroed sector", true, zeroSector},
		{"synced bit flip", true, flip},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := TestingOptions()
			opts.Sync = SyncNever
			l, err := Open("db", opts)
			if err != nil {
				t.Fatal(err)
			}
			if _, _, err := l.Append(Record{Type: 1, Payload: []byte("before")}); err != nil {
				t.Fatal(err)
			}
			big, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{0xab}, 6000)})
			if err != nil {
				t.Fatal(err)
			}
			if tc.synced {
				if err := l.Sync(); err != nil {
					t.Fatal(err)
				}
			}
			for i := 0; i < 3; i++ {
				if _, _, err := l.Append(Record{Type: 1, Payload: []byte("after")}); err != nil {
					t.Fatal(err)
				}
			}
			// A crash that kept every write (a Close would fsync them and
			// say so with a mark).
			fs := opts.FS.(*vfs.MemFS).CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(1, 1))})
			l.Close()
			opts.FS = fs
			b, err := fs.UnsafeGetFileDataBuffer("db/" + segmentName(0))
			if err != nil {
				t.Fatal(err)
			}
			tc.corrupt(b, segmentHeaderSize+int(big))
			before := bytes.Clone(b)
			l, err = Open("db", opts)
			if tc.synced {
				var de *DamageError
				if !errors.As(err, &de) || de.Offset != segmentHeaderSize+int64(big) || de.RecordsAfter != 3 {
					t.Fatalf("open after damage in the synced part: %v, want a DamageError at offset %d with 3 records after it",
						err, segmentHeaderSize+int64(big))
				}
				if got, _ := fs.UnsafeGetFileDataBuffer("db/" + segmentName(0)); !bytes.Equal(got, before) {
					t.Fatal("a refused Open changed the segment")
				}
				return
			}
			if err != nil {
				t.Fatalf("open after damage in the unsynced tail: %v", err)
			}
			defer l.Close()
			if l.End() != big {
				t.Fatalf("log ends at %d, want the torn record's start %d", l.End(), big)
			}
		})
	}
}
