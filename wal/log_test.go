package wal

import (
	"bytes"
	"fmt"
	"sync"
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
		err := l.Replay(lsns[from], func(lsn LSN, r Record) error {
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
	if err := l.TruncateFront(lsns[1500]); err != nil {
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
			if err := l.Replay(0, func(lsn LSN, r Record) error {
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
	if err := l.Replay(0, func(LSN, Record) error { n++; return nil }); err != nil || n != len(lsns) {
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
	if crashed.End() != end {
		t.Fatalf("after a crash the log ends at %d, want %d", crashed.End(), end)
	}
}
