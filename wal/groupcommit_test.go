package wal

import (
	"sync"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestConcurrentWaitersShareFlushes: many goroutines appending under
// SyncAlways get every record durable before their Append returns, in one
// contiguous log that a crash clone reopens with all of them.
func TestConcurrentWaitersShareFlushes(t *testing.T) {
	opts := TestingOptions()
	opts.Sync = SyncAlways
	mem := opts.FS.(*vfs.MemFS)
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 100
	var wg sync.WaitGroup
	errs := make(chan error, writers)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				_, end, err := l.Append(Record{Type: 1, Payload: []byte{byte(w), byte(i)}})
				if err == nil && l.Durable() < end {
					err = errNotDurable
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	fsyncs := l.Fsyncs()
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	crashed, err := Open("db", Options{FS: mem.CrashClone(vfs.CrashCloneCfg{}), SegmentSize: opts.SegmentSize})
	if err != nil {
		t.Fatal(err)
	}
	defer crashed.Close()
	n := 0
	if err := crashed.ReplayAll(func(lsn, end LSN, r Record) error { n++; return nil }); err != nil {
		t.Fatal(err)
	}
	if n != writers*each {
		t.Fatalf("after a crash the log holds %d records, want %d", n, writers*each)
	}
	t.Logf("%d appends, %d fsyncs", writers*each, fsyncs)
}

var errNotDurable = errorString("an Append under SyncAlways returned before its record was durable")

type errorString string

func (e errorString) Error() string { return string(e) }
