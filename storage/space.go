package storage

import (
	"sync/atomic"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// DiskWrites counts the bytes the store has given its files since Open: its
// AOF and its index. A filesystem's free space, read at some moment, is
// off by what the store wrote since, so a caller that reads free space only
// now and then (a server's min-free-disk) takes Written just before the
// reading and subtracts Queued - that Written from it later: that covers
// every byte the reading may not reflect, and counts some twice, never none.
type DiskWrites struct {
	// Written: the bytes that reached the filesystem (write(2) returned).
	Written int64
	// Queued: Written and the AOF records queued but not yet written, whose
	// LSNs are fixed (an operation's record is queued before it replies).
	Queued int64
}

// DiskWrites returns the store's write counters (see DiskWrites). Only
// differences between two readings of the same store mean something.
func (s *Store) DiskWrites() DiskWrites {
	index := s.fence.written.Load()
	// One lock of the log's for both: an ADDJOB batch asks on the write
	// path (server/diskguard.go).
	written, end := s.log.Written()
	return DiskWrites{Written: int64(written) + index, Queued: int64(end) + index}
}

// countingFile counts the bytes written to one of the index's files.
type countingFile struct {
	vfs.File
	n *atomic.Int64
}

func (f countingFile) Write(p []byte) (int, error) {
	n, err := f.File.Write(p)
	f.n.Add(int64(n))
	return n, err
}

func (f countingFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := f.File.WriteAt(p, off)
	f.n.Add(int64(n))
	return n, err
}
