package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// Options configure a Store. The zero value of a field means its default.
type Options struct {
	// FS holds the AOF and the index. Default vfs.Default (the OS);
	// vfs.NewMem() gives a store that lives in memory only (appendonly no,
	// and users' tests).
	FS vfs.FS
	// Sync is the AOF fsync policy. Default wal.SyncEverySec.
	Sync wal.SyncPolicy
	// SegmentSize is the AOF segment size. Default 64 MiB.
	SegmentSize int64
	// CompressThreshold: bodies of at least this many bytes are
	// s2-compressed in the AOF when that saves space. Default 1024; negative
	// disables compression.
	CompressThreshold int
	// MemTableSize is the index's memtable size. Default 32 MiB.
	MemTableSize uint64
	// CacheSize is the index's block cache. Default 32 MiB. (Pebble
	// charges its memtables to the cache too; the store sizes the cache
	// for two memtables more, so that CacheSize is left for blocks.)
	CacheSize int64
	// JobCacheSize is how many recently written jobs are kept in memory so
	// the commit path skips the index for them (about 300 bytes each).
	// Default 32768; negative disables it.
	JobCacheSize int
	// WriteBufferSize is how many bytes of index writes (keys, values and
	// about 56 bytes each) live commits gather before they are given to
	// Pebble as one batch; a job whose index keys are written and deleted
	// within one buffer never reaches Pebble (see write_buffer.go). Default
	// 2 MiB (a flush holds the commit lock for a few milliseconds; 8 MiB made
	// p99 worse); negative gives every commit's writes to Pebble at once.
	WriteBufferSize int64
	// CheckpointInterval is how often the index is flushed and the AOF
	// truncated in the background. Default 1 minute; negative disables the
	// background checkpoint (Checkpoint can still be called).
	CheckpointInterval time.Duration
	// CheckpointBytes triggers a checkpoint once this many AOF bytes were
	// appended since the last one, bounding the replay after a crash (about
	// 2 s per 64 MiB of small jobs on a 2-core machine). Default 64 MiB.
	CheckpointBytes int64
	// Logger receives recovery progress and errors. Default slog.Default().
	Logger *slog.Logger
	// VerifyRate bounds the bytes per second the background verification
	// of the sealed AOF segments reads after Open (see verify.go). Default
	// 32 MiB/s; negative disables it.
	VerifyRate int64
	// Rebuild says when Open rebuilds the index from the whole AOF (see
	// rebuild.go). Default RebuildWhenLost: when the index is missing, a
	// rebuild cut short, or found corrupt as it opens.
	Rebuild RebuildMode
	// Rewrite is what a store that failed an fsync kept in memory
	// (Store.Unsynced): Open writes it again before it recovers, so that
	// nothing acknowledged is lost to pages the operating system dropped
	// after the failed fsync (see wal.Options.Rewrite). Default nil.
	Rewrite *wal.Unsynced
	// ReadOnlyBelow: when the filesystem holding the store has fewer free
	// bytes than this at Open, the store opens read-only (the index without
	// writing to it, the AOF's tail replayed into memory only) instead of
	// failing as Pebble does on a full disk: it serves reads and refuses
	// every write with ErrNoSpace; reopen it once RoomToWrite says there is
	// room. Default 2 × MemTableSize (room for the flushes of a replay and
	// a checkpoint); negative: never (a filesystem that cannot tell never
	// either).
	ReadOnlyBelow int64
}

// DefaultOptions returns the options a server uses.
func DefaultOptions() Options {
	o := Options{}
	o.EnsureDefaults()
	return o
}

// TestingOptions returns options for tests: a crashable in-memory
// filesystem, small segments, SyncAlways, no background checkpoint.
func TestingOptions() Options {
	o := Options{
		FS:                 vfs.NewCrashableMem(),
		Sync:               wal.SyncAlways,
		SegmentSize:        64 << 10,
		MemTableSize:       1 << 20,
		CacheSize:          1 << 20,
		JobCacheSize:       64,      // small, so tests run through evictions and the index
		WriteBufferSize:    4 << 10, // small, so tests read through the buffer and Pebble
		CheckpointInterval: -1,
		VerifyRate:         -1, // tests that verify ask for it
	}
	o.EnsureDefaults()
	return o
}

// EnsureDefaults fills in every zero field with its default.
func (o *Options) EnsureDefaults() {
	if o.FS == nil {
		o.FS = vfs.Default
	}
	if o.SegmentSize == 0 {
		o.SegmentSize = 64 << 20
	}
	if o.CompressThreshold == 0 {
		o.CompressThreshold = 1024
	}
	if o.MemTableSize == 0 {
		o.MemTableSize = 32 << 20
	}
	if o.CacheSize == 0 {
		o.CacheSize = 32 << 20
	}
	if o.JobCacheSize == 0 {
		o.JobCacheSize = 32768
	}
	if o.WriteBufferSize == 0 {
		o.WriteBufferSize = 2 << 20
	}
	if o.CheckpointInterval == 0 {
		o.CheckpointInterval = time.Minute
	}
	if o.CheckpointBytes == 0 {
		o.CheckpointBytes = 64 << 20
	}
	if o.VerifyRate == 0 {
		o.VerifyRate = 32 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.ReadOnlyBelow == 0 {
		o.ReadOnlyBelow = 2 * int64(o.MemTableSize)
	}
}

// Validate reports every invalid field.
func (o *Options) Validate() error {
	var errs []error
	if o.MemTableSize < 64<<10 || o.MemTableSize >= 4<<30 {
		errs = append(errs, fmt.Errorf("storage: MemTableSize %d outside [64 KiB, 4 GiB)", o.MemTableSize))
	}
	if o.CacheSize < 0 {
		errs = append(errs, fmt.Errorf("storage: negative CacheSize %d", o.CacheSize))
	}
	if o.CheckpointBytes < 0 {
		errs = append(errs, fmt.Errorf("storage: negative CheckpointBytes %d", o.CheckpointBytes))
	}
	w := o.walOptions()
	if err := w.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

func (o *Options) walOptions() wal.Options {
	w := wal.Options{FS: o.FS, SegmentSize: o.SegmentSize, Sync: o.Sync, Logger: o.Logger, Rewrite: o.Rewrite}
	w.EnsureDefaults()
	return w
}
