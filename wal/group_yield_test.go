package wal

import (
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// writeCountingFS counts the writes to the AOF's segments (.wal files).
type writeCountingFS struct {
	vfs.FS
	writes atomic.Int64
}

func (fs *writeCountingFS) wrap(name string, f vfs.File, err error) (vfs.File, error) {
	if err != nil || !strings.HasSuffix(name, ".wal") {
		return f, err
	}
	return &writeCountingFile{File: f, writes: &fs.writes}, nil
}

func (fs *writeCountingFS) Create(name string, c vfs.DiskWriteCategory) (vfs.File, error) {
	f, err := fs.FS.Create(name, c)
	return fs.wrap(name, f, err)
}

func (fs *writeCountingFS) OpenReadWrite(name string, c vfs.DiskWriteCategory, opts ...vfs.OpenOption) (vfs.File, error) {
	f, err := fs.FS.OpenReadWrite(name, c, opts...)
	return fs.wrap(name, f, err)
}

type writeCountingFile struct {
	vfs.File
	writes *atomic.Int64
}

func (f *writeCountingFile) Write(p []byte) (int, error) {
	f.writes.Add(1)
	return f.File.Write(p)
}

func (f *writeCountingFile) WriteAt(p []byte, off int64) (int, error) {
	f.writes.Add(1)
	return f.File.WriteAt(p, off)
}

// TestWriterLetsRunnableCommittersJoinItsWrite: on one P, committers made
// runnable together (clients whose commands arrived together) share one
// write. The writer, kicked by the first record, yields before it takes
// the pending records, so that the others, already runnable, enqueue
// theirs first — as Disque's event loop writes its AOF once per pass over
// the clients that were ready. Without the yield the kicked writer runs as
// soon as the first committer waits, and writes that record alone.
func TestWriterLetsRunnableCommittersJoinItsWrite(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	opts := TestingOptions()
	opts.Sync = SyncEverySec
	fs := &writeCountingFS{FS: opts.FS}
	opts.FS = fs
	l, err := Open("db", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	const committers = 16
	before := fs.writes.Load()
	start := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, committers)
	for range committers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			if _, _, err := l.Append(Record{Type: 1, Payload: []byte("record")}); err != nil {
				errs <- err
			}
		}()
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := fs.writes.Load() - before; n > committers/4 {
		t.Fatalf("%d committers made runnable together took %d writes, want at most %d", committers, n, committers/4)
	}
}
