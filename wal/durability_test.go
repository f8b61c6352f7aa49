package wal

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/cockroachdb/pebble/v2/vfs/errorfs"
)

// TestFailedWriteOrSyncPoisonsLog injects one failure into the writer: the
// failing Append, a record enqueued while the writer was failing, and every
// later call must return ErrPoisoned, nothing may be written or fsynced after
// the failure, and a reopen must find exactly the records durable before it.
func TestFailedWriteOrSyncPoisonsLog(t *testing.T) {
	isSegment := func(op errorfs.Op) bool { return strings.HasSuffix(op.Path, segmentSuffix) }
	for _, tc := range []struct {
		name  string
		match func(op errorfs.Op) bool
		// written: the failing record may be in the OS (not durable).
		written bool
	}{
		{"write", func(op errorfs.Op) bool {
			return (op.Kind == errorfs.OpFileWriteAt || op.Kind == errorfs.OpFileWrite) && isSegment(op)
		}, false},
		{"fsync", func(op errorfs.Op) bool { return op.Kind == errorfs.OpFileSync && isSegment(op) }, true},
		// Creating the next segment fails after the active one was closed.
		{"roll", func(op errorfs.Op) bool { return op.Kind == errorfs.OpCreate }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := vfs.NewCrashableMem()
			var (
				armed   atomic.Bool
				l       *Log
				late    sync.Once
				lateEnd LSN
				lateErr error
			)
			fs := errorfs.Wrap(mem, errorfs.InjectorFunc(func(op errorfs.Op) error {
				// Fail one operation only: the disk then works again, and
				// the log must stay poisoned all the same.
				if !tc.match(op) || !armed.CompareAndSwap(true, false) {
					return nil
				}
				// The writer is failing and holds no lock: another caller
				// enqueues a record now. It must not be written after the
				// failed one.
				late.Do(func() { _, lateEnd, lateErr = l.Enqueue(Record{Type: 9, Payload: []byte("late")}) })
				return errorfs.ErrInjected
			}))
			opts := crashOpts(fs, SyncAlways)
			opts.SegmentSize = 4096
			var err error
			if l, err = Open(crashDir, opts); err != nil {
				t.Fatal(err)
			}
			durable := appendRecs(t, l, 0, 20)
			armed.Store(true)
			var failed Record
			var failedAt LSN
			for i := len(durable); ; i++ {
				failed = testRecord(i)
				first, end, err := l.Append(failed)
				failedAt = first
				if err == nil {
					// Only "roll" lets appends through until the log rolls.
					durable = append(durable, rec{lsn: first, end: end, typ: failed.Type, payload: failed.Payload})
					continue
				}
				if !errors.Is(err, ErrPoisoned) || !errors.Is(err, errorfs.ErrInjected) {
					t.Fatalf("failed append: %v, want ErrPoisoned wrapping the injected error", err)
				}
				break
			}
			if lateErr != nil {
				t.Fatalf("enqueue before the failure was reported: %v", lateErr)
			}
			if err := l.Wait(lateEnd); !errors.Is(err, ErrPoisoned) {
				t.Fatalf("wait for the late record: %v, want ErrPoisoned", err)
			}
			for name, call := range map[string]func() error{
				"append":  func() error { _, _, err := l.Append(testRecord(500)); return err },
				"enqueue": func() error { _, _, err := l.Enqueue(testRecord(501)); return err },
				"sync":    l.Sync,
				"wait":    func() error { return l.WaitSynced(l.End()) },
				"truncate": func() error {
					return truncateFront(l, durable[len(durable)-1].end)
				},
			} {
				if err := call(); !errors.Is(err, ErrPoisoned) {
					t.Errorf("%s after the failure: %v, want ErrPoisoned", name, err)
				}
			}
			if err := l.Close(); !errors.Is(err, ErrPoisoned) {
				t.Fatalf("close: %v, want the poisoning error", err)
			}

			// After a machine crash exactly the durable records are there.
			crashed := mem.CrashClone(vfs.CrashCloneCfg{})
			l2, err := Open(crashDir, crashOpts(crashed, SyncAlways))
			if err != nil {
				t.Fatal(err)
			}
			checkLog(t, l2, 0, durable)
			checkLog(t, l2, 0, append(durable, appendRecs(t, l2, 100, 3)...))
			l2.Close()

			// Without a machine crash the failed record may have reached the
			// OS, but no record enqueued after it.
			l3, err := Open(crashDir, crashOpts(mem, SyncAlways))
			if err != nil {
				t.Fatal(err)
			}
			defer l3.Close()
			want := durable
			end := durable[len(durable)-1].end
			if tc.written && l3.End() > end && failedAt >= end {
				// After the records, and maybe a sync mark.
				want = append(want, rec{lsn: failedAt, end: failedAt + LSN(frameSize(len(failed.Payload))),
					typ: failed.Type, payload: failed.Payload})
			}
			checkLog(t, l3, 0, want)
		})
	}
}

// readAtLSN decodes the record at lsn straight from the segment files in fs,
// without a Log.
func readAtLSN(fs vfs.FS, lsn LSN) (Record, error) {
	names, err := fs.List(crashDir)
	if err != nil {
		return Record{}, err
	}
	var seg LSN
	found := false
	for _, name := range names {
		if first, ok := parseSegmentName(name); ok && first <= lsn && (!found || first > seg) {
			seg, found = first, true
		}
	}
	if !found {
		return Record{}, fmt.Errorf("no segment holds lsn %d", lsn)
	}
	sg, err := statSegment(fs, crashDir, seg)
	if err != nil {
		return Record{}, err
	}
	f, err := fs.Open(fs.PathJoin(crashDir, segmentName(seg)))
	if err != nil {
		return Record{}, err
	}
	defer f.Close()
	off := sg.fileOffset(lsn)
	if lsn >= sg.end() {
		return Record{}, fmt.Errorf("lsn %d is past the end of %s", lsn, segmentName(seg))
	}
	b := make([]byte, sg.end()-lsn)
	if _, err := f.ReadAt(b, off); err != nil {
		return Record{}, err
	}
	r, _, err := DecodeFrame(b, sg.salt, lsn)
	return r, err
}

// TestSyncAlwaysAppendIsDurable checks, with concurrent appenders sharing
// fsyncs, that each record whose Append returned is in a crash clone taken
// right after.
func TestSyncAlwaysAppendIsDurable(t *testing.T) {
	mem := vfs.NewCrashableMem()
	opts := crashOpts(mem, SyncAlways)
	opts.SegmentSize = 4096 // roll often, under the appenders' feet
	l, err := Open(crashDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const writers, perWriter = 8, 40
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		recs = map[LSN][]byte{}
	)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				p := fmt.Appendf(nil, "writer %d record %d", w, i)
				first, end, err := l.Append(Record{Type: 1, Payload: p})
				if err != nil {
					t.Error(err)
					return
				}
				if d := l.Durable(); d < end {
					t.Errorf("append of [%d, %d) returned with Durable() = %d", first, end, d)
				}
				crashed := mem.CrashClone(vfs.CrashCloneCfg{})
				r, err := readAtLSN(crashed, first)
				if err != nil || !bytes.Equal(r.Payload, p) {
					t.Errorf("record %q at %d lost in a crash after Append returned: %q, %v", p, first, r.Payload, err)
					return
				}
				mu.Lock()
				recs[first] = p
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	if n := len(l.Segments()); n < 3 {
		t.Fatalf("want several segments, got %d", n)
	}
	// A crash now keeps every record, in LSN order.
	l2, err := Open(crashDir, crashOpts(mem.CrashClone(vfs.CrashCloneCfg{}), SyncAlways))
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	n := 0
	if err := l2.Replay(0, func(lsn, _ LSN, r Record) error {
		if !bytes.Equal(recs[lsn], r.Payload) {
			return fmt.Errorf("lsn %d holds %q, appender saw %q", lsn, r.Payload, recs[lsn])
		}
		n++
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n != writers*perWriter {
		t.Fatalf("recovered %d records, want %d", n, writers*perWriter)
	}
}
