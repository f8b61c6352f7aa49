package wal

import (
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// syncGateFS holds every fsync of a segment, while armed, until the test
// lets one through (a send on gate).
type syncGateFS struct {
	vfs.FS
	armed atomic.Bool
	gate  chan struct{}
	fail  atomic.Bool // the fsync let through fails
}

type syncGateFile struct {
	vfs.File
	fs *syncGateFS
}

func (f syncGateFile) Sync() error {
	if f.fs.armed.Load() {
		<-f.fs.gate
		if f.fs.fail.Load() {
			return errors.New("injected fsync failure")
		}
	}
	return f.File.Sync()
}

func (fs *syncGateFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, o ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, o...)
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return syncGateFile{f, fs}, nil
}

// TestFailedFsyncWakesEveryWaiter: a failed fsync poisons the log and
// every parked Wait and WaitSynced returns its error, also those whose
// records the failed flush did not hold.
func TestFailedFsyncWakesEveryWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &syncGateFS{FS: vfs.NewMem(), gate: make(chan struct{})}
		opts := TestingOptions()
		opts.FS, opts.Sync = fs, SyncAlways
		l, err := Open("db", opts)
		if err != nil {
			t.Fatal(err)
		}
		fs.armed.Store(true)
		_, endA, _ := l.Enqueue(Record{Type: 1, Payload: []byte("a")})
		synctest.Wait()
		_, endB, _ := l.Enqueue(Record{Type: 1, Payload: []byte("b")})
		errs := make(chan error, 3)
		go func() { errs <- l.Wait(endA) }()
		go func() { errs <- l.Wait(endB) }()
		go func() { errs <- l.WaitSynced(endB) }()
		synctest.Wait()
		fs.fail.Store(true)
		fs.gate <- struct{}{}
		for range 3 {
			if err := <-errs; !errors.Is(err, ErrPoisoned) {
				t.Errorf("a waiter got %v after the failed fsync, want ErrPoisoned", err)
			}
		}
		fs.armed.Store(false)
		_ = l.Close()
	})
}

// TestEverySecWaitWakesOnWrite: under SyncEverySec a Wait returns once its
// record is written, before any fsync, and a WaitSynced for the same record
// only once the record is fsynced.
func TestEverySecWaitWakesOnWrite(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fs := &syncGateFS{FS: vfs.NewMem(), gate: make(chan struct{})}
		opts := TestingOptions()
		opts.FS, opts.Sync = fs, SyncEverySec
		l, err := Open("db", opts)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		fs.armed.Store(true)
		_, end, err := l.Enqueue(Record{Type: 1, Payload: []byte("a")})
		if err != nil {
			t.Fatal(err)
		}
		if err := l.Wait(end); err != nil {
			t.Fatal(err)
		}
		var synced atomic.Bool
		syncErr := make(chan error, 1)
		go func() { syncErr <- l.WaitSynced(end); synced.Store(true) }()
		synctest.Wait() // the writer is held in the fsync WaitSynced asked for
		if synced.Load() {
			t.Fatal("WaitSynced returned before the fsync")
		}
		fs.armed.Store(false)
		fs.gate <- struct{}{}
		if err := <-syncErr; err != nil {
			t.Fatal(err)
		}
		if l.Durable() < end {
			t.Fatalf("WaitSynced returned with durable end %d < %d", l.Durable(), end)
		}
	})
}
