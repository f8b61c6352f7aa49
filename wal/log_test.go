package wal

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"time"
)

func TestSegmentNameRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name  string
		first LSN
		ok    bool
	}{
		{"0000000000000000.wal", 0, true},
		{"00000000000000ff.wal", 255, true},
		{"ffffffffffffffff.wal", 1<<64 - 1, true},
		{"00000000000000FF.wal", 0, false},
		{"0000000000000000.wal.tmp", 0, false},
		{"0000000000000000.wal.broken", 0, false},
		{"000000000000000.wal", 0, false},
		{"zzzzzzzzzzzzzzzz.wal", 0, false},
	} {
		got, ok := parseSegmentName(tc.name)
		if ok != tc.ok || got != tc.first {
			t.Errorf("parseSegmentName(%q) = %d, %v; want %d, %v", tc.name, got, ok, tc.first, tc.ok)
		}
		if tc.ok && segmentName(tc.first) != tc.name {
			t.Errorf("segmentName(%d) = %q, want %q", tc.first, segmentName(tc.first), tc.name)
		}
	}
}

func TestAppendReadReplayAcrossSegments(t *testing.T) {
	opts := TestingOptions()
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	var lsns []LSN
	var want [][]byte
	for i := 0; i < 2000; i++ {
		p := bytes.Repeat([]byte{byte(i)}, i%300)
		p = append(p, fmt.Sprint(i)...)
		first, _, err := l.Append(Record{Type: 1, Payload: p})
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, first)
		want = append(want, p)
	}
	if n := len(l.Segments()); n < 3 {
		t.Fatalf("expected several segments, got %d", n)
	}
	for i, lsn := range lsns {
		r, err := l.Read(lsn)
		if err != nil {
			t.Fatalf("read %d: %v", lsn, err)
		}
		if !bytes.Equal(r.Payload, want[i]) {
			t.Fatalf("record %d: payload mismatch", i)
		}
	}
	check := func(l *Log, from int) {
		t.Helper()
		i := from
		err := l.Replay(lsns[from], func(lsn, _ LSN, r Record) error {
			if lsn != lsns[i] || !bytes.Equal(r.Payload, want[i]) {
				return fmt.Errorf("record %d at %d mismatches", i, lsn)
			}
			i++
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if i != len(lsns) {
			t.Fatalf("replayed %d records, want %d", i-from, len(lsns)-from)
		}
	}
	check(l, 0)
	check(l, 1234)
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l, err = Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	check(l, 0)
	if err := truncateFront(l, lsns[1500]); err != nil {
		t.Fatal(err)
	}
	if l.First() == 0 || l.First() > lsns[1500] {
		t.Fatalf("first after truncate = %d", l.First())
	}
	check(l, 1500)
	if _, err := l.Read(lsns[0]); err == nil {
		t.Fatal("read of a truncated record succeeded")
	}
}

func TestConcurrentAppendsAreContiguous(t *testing.T) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncEverySec, SyncNever} {
		t.Run(policy.String(), func(t *testing.T) {
			opts := TestingOptions()
			opts.Sync = policy
			l, err := Open("db", opts)
			if err != nil {
				t.Fatal(err)
			}
			defer l.Close()
			var wg sync.WaitGroup
			var mu sync.Mutex
			seen := map[LSN]string{}
			for w := 0; w < 16; w++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := 0; i < 200; i++ {
						p := fmt.Sprintf("w%d-%d", w, i)
						first, _, err := l.Append(Record{Type: 2, Payload: []byte(p)})
						if err != nil {
							t.Error(err)
							return
						}
						mu.Lock()
						seen[first] = p
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			n := 0
			if err := l.Replay(0, func(lsn, _ LSN, r Record) error {
				if seen[lsn] != string(r.Payload) {
					return fmt.Errorf("lsn %d holds %q, appender saw %q", lsn, r.Payload, seen[lsn])
				}
				n++
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if n != 16*200 {
				t.Fatalf("replayed %d, want %d", n, 16*200)
			}
		})
	}
}

// TestRollInsideOneFlushKeepsTheOldSegmentReadable: one flush that ends the
// old segment and starts a new one must record both segments' sizes, or
// records written just before the roll cannot be read until a restart.
func TestRollInsideOneFlushKeepsTheOldSegmentReadable(t *testing.T) {
	opts := TestingOptions()
	opts.Sync = SyncNever
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	payload := bytes.Repeat([]byte{'x'}, 1000)
	// Enqueue without waiting, so many records (and a roll) share a flush.
	var lsns []LSN
	var end LSN
	for i := 0; i < 200; i++ {
		first, e, err := l.Enqueue(Record{Type: 1, Payload: payload})
		if err != nil {
			t.Fatal(err)
		}
		lsns, end = append(lsns, first), e
	}
	if err := l.Wait(end); err != nil {
		t.Fatal(err)
	}
	if n := len(l.Segments()); n < 3 {
		t.Fatalf("want several segments, got %d", n)
	}
	for _, lsn := range lsns {
		if _, err := l.Read(lsn); err != nil {
			t.Fatalf("read %d: %v (segments %+v)", lsn, err, l.Segments())
		}
	}
	n := 0
	if err := l.Replay(0, func(LSN, LSN, Record) error { n++; return nil }); err != nil || n != len(lsns) {
		t.Fatalf("replay: %d records, %v", n, err)
	}
}

func TestReadSizedAgreesWithRead(t *testing.T) {
	l, err := Open("db", TestingOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var lsns []LSN
	for i := 0; i < 300; i++ {
		first, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{byte(i)}, i*7)})
		if err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, first)
	}
	for i, lsn := range lsns {
		want, err := l.Read(lsn)
		if err != nil {
			t.Fatal(err)
		}
		// Hints too small, exact, too large (even past the segment's end).
		for _, hint := range []int{0, i*7 - 1, i * 7, i*7 + 1000, 1 << 20} {
			got, err := l.ReadSized(lsn, hint)
			if err != nil || got.Type != want.Type || !bytes.Equal(got.Payload, want.Payload) {
				t.Fatalf("record %d hint %d: %v", i, hint, err)
			}
		}
	}
}

// TestReadBatchAgreesWithRead: whatever records are asked for together —
// neighbours, far apart, across segments, repeated, out of order — and
// whatever the hints (too small, exact, too large), ReadBatch returns what
// Read returns for each, in the order asked.
func TestReadBatchAgreesWithRead(t *testing.T) {
	l, err := Open("db", TestingOptions())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var lsns []LSN
	var sizes []int
	for i := 0; i < 600; i++ {
		size := (i * 37) % 700
		if i%97 == 0 {
			size = readBatchGap + 100 // a gap wider than a batch bridges
		}
		first, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{byte(i)}, size)})
		if err != nil {
			t.Fatal(err)
		}
		lsns, sizes = append(lsns, first), append(sizes, size)
	}
	if n := len(l.Segments()); n < 3 {
		t.Fatalf("want records in several segments, got %d", n)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 300 {
		n := 1 + rng.IntN(40)
		start := rng.IntN(len(lsns))
		var ask []LSN
		var hints, which []int
		for range n {
			i := start + rng.IntN(24) // mostly neighbours
			if rng.IntN(8) == 0 {
				i = rng.IntN(len(lsns)) // and now and then anywhere
			}
			i %= len(lsns)
			hint := []int{0, sizes[i] - 1, sizes[i], sizes[i] + 200}[rng.IntN(4)]
			ask, hints, which = append(ask, lsns[i]), append(hints, hint), append(which, i)
		}
		got, err := l.ReadBatch(ask, hints)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		for k, i := range which {
			want, err := l.Read(lsns[i])
			if err != nil {
				t.Fatal(err)
			}
			if got[k].Type != want.Type || !bytes.Equal(got[k].Payload, want.Payload) {
				t.Fatalf("round %d: record %d (asked %d of %d, hint %d): %d bytes, want %d",
					round, i, k, n, hints[k], len(got[k].Payload), len(want.Payload))
			}
		}
	}
}

// TestReadBatchReadsNeighboursOnce: sixteen records side by side, asked for
// in any order, take one read of the segment, not sixteen.
func TestReadBatchReadsNeighboursOnce(t *testing.T) {
	opts := TestingOptions()
	fs := &countingFS{FS: opts.FS}
	opts.FS = fs
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var lsns []LSN
	var hints []int
	for i := range 16 {
		first, _, err := l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{byte(i)}, 100+i)})
		if err != nil {
			t.Fatal(err)
		}
		lsns, hints = append(lsns, first), append(hints, 100+i)
	}
	slices.Reverse(lsns)
	slices.Reverse(hints)
	before := fs.reads.Load()
	got, err := l.ReadBatch(lsns, hints)
	if err != nil {
		t.Fatal(err)
	}
	if n := fs.reads.Load() - before; n != 1 {
		t.Fatalf("%d reads for 16 neighbouring records, want 1", n)
	}
	for k := range got {
		if want := 100 + 15 - k; len(got[k].Payload) != want || got[k].Payload[0] != byte(15-k) {
			t.Fatalf("record %d: %d bytes starting %d, want %d bytes of %d", k, len(got[k].Payload), got[k].Payload[0], want, 15-k)
		}
	}
}

// countingFS counts the reads of the files it opens.
type countingFS struct {
	vfs.FS
	reads atomic.Int64
}

func (fs *countingFS) Open(name string, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.Open(name, opts...)
	if err != nil {
		return nil, err
	}
	return &countingFile{File: f, reads: &fs.reads}, nil
}

type countingFile struct {
	vfs.File
	reads *atomic.Int64
}

func (f *countingFile) ReadAt(p []byte, off int64) (int, error) {
	f.reads.Add(1)
	return f.File.ReadAt(p, off)
}

// TestEverySecSyncsInTheBackground: under SyncEverySec, appended records
// become durable within about SyncInterval without anyone asking, through the
// loop's own handle, across a segment roll.
func TestEverySecSyncsInTheBackground(t *testing.T) {
	opts := TestingOptions()
	opts.Sync = SyncEverySec
	opts.SyncInterval = 5 * time.Millisecond
	fs := opts.FS.(*vfs.MemFS)
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var end LSN
	for i := 0; i < 150; i++ { // about 150 KiB: rolls the 64 KiB segments
		if _, end, err = l.Append(Record{Type: 1, Payload: bytes.Repeat([]byte{'s'}, 1000)}); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for l.Durable() < end {
		if time.Now().After(deadline) {
			t.Fatalf("durable %d, end %d: the background sync never caught up", l.Durable(), end)
		}
		time.Sleep(time.Millisecond)
	}
	crashed, err := Open("db", Options{FS: fs.CrashClone(vfs.CrashCloneCfg{}), SegmentSize: opts.SegmentSize})
	if err != nil {
		t.Fatal(err)
	}
	defer crashed.Close()
	// (or after the mark the loop writes after its fsync, if a later tick
	// synced that too)
	if crashed.End() != end && crashed.End() != end+markSize {
		t.Fatalf("after a crash the log ends at %d, want %d", crashed.End(), end)
	}
}

// truncateFront removes every whole segment that ends at or before lsn, by
// RemoveSegments (a store removes dead segments from anywhere in the log;
// these tests remove its front).
func truncateFront(l *Log, lsn LSN) error {
	var firsts []LSN
	for _, seg := range l.Segments() {
		if seg.First+LSN(seg.Size) > lsn {
			break
		}
		firsts = append(firsts, seg.First)
	}
	return l.RemoveSegments(firsts)
}
