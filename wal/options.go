package wal

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// SyncPolicy says when appended records are fsynced. The names are Disque's
// appendfsync values.
type SyncPolicy uint8

const (
	// SyncEverySec fsyncs once a second: Append returns after write(2), so a
	// process crash loses nothing and a machine crash about a second.
	SyncEverySec SyncPolicy = iota
	// SyncAlways fsyncs before Append returns; concurrent appends share one
	// fsync.
	SyncAlways
	// SyncNever leaves flushing to the operating system (and to Sync calls,
	// segment roll-over and Close).
	SyncNever
)

// String returns the policy's appendfsync name.
func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncEverySec:
		return "everysec"
	case SyncNever:
		return "no"
	}
	return fmt.Sprintf("SyncPolicy(%d)", uint8(p))
}

// ParseSyncPolicy parses an appendfsync value: always, everysec or no.
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	switch strings.ToLower(s) {
	case "always":
		return SyncAlways, nil
	case "everysec":
		return SyncEverySec, nil
	case "no":
		return SyncNever, nil
	}
	return 0, fmt.Errorf("wal: unknown fsync policy %q (want always, everysec or no)", s)
}

// Options configure a Log. The zero value of a field means its default.
type Options struct {
	// FS is the filesystem all files go through. Default vfs.Default (the OS).
	FS vfs.FS
	// SegmentSize is the size at which the log rolls to a new segment. A
	// record larger than this gets a segment of its own. Default 64 MiB.
	SegmentSize int64
	// Sync is the fsync policy at Open (Log.SetSync changes it). Default
	// SyncEverySec.
	Sync SyncPolicy
	// SyncInterval is how often SyncEverySec fsyncs. Default 1s.
	SyncInterval time.Duration
	// MaxPending bounds the bytes queued but not yet written; Enqueue blocks
	// past it, so a slow disk pushes back on writers. Default 64 MiB.
	MaxPending int
	// Logger receives recovery and repair messages. Default slog.Default().
	Logger *slog.Logger
	// Checkpoint is the LSN up to which the log's owner has durably
	// consumed it (storage: the applied LSN of the index on disk). Open
	// accepts missing segments (gaps) that end at or before it — the owner
	// removed them with RemoveSegments — and does not re-read the last
	// segment's records before it when it looks for a torn tail: they were
	// fsynced before the owner recorded the checkpoint (Read and Verify
	// still check their CRCs). Every record at or after it must be present.
	// Damage below it is corruption, never a torn tail; a last segment
	// that ends before it is refused (its end was lost). Default 0: the log
	// must be contiguous and is checked whole.
	Checkpoint LSN
	// AllowGaps: Open accepts missing segments anywhere, as a replay of
	// the whole log for an index rebuild needs (ReplayAll): the owner
	// removed them (RemoveSegments) after writing forward what a replay
	// would miss. Default false: gaps must end at or before Checkpoint.
	AllowGaps bool
	// MaxUnsynced bounds the bytes written since the last fsync, which the
	// log keeps in memory until an fsync covers them, so that after a
	// failed fsync they can be written again (see Unsynced). Under
	// SyncEverySec the background fsync runs early once half of it is
	// written; past it the writer fsyncs itself, whatever the policy.
	// Default 16 MiB.
	MaxUnsynced int
	// ReadOnly opens the log without changing anything on disk: no repair
	// (a torn tail is only reported, and the log ends before it), no stale
	// temporary files removed, no fsync, no new segment; every write returns
	// ErrReadOnly. For offline checks and for a store that must not write.
	ReadOnly bool
	// Rewrite, when set, is what a log that failed an fsync still held in
	// memory (Log.Unsynced): Open cuts the last segment back to its durable
	// end and writes the kept bytes again, then fsyncs, before it recovers
	// the log — so records the operating system may have dropped after the
	// failed fsync are on disk again, or Open fails and nothing was lost
	// yet. Ignored with ReadOnly.
	Rewrite *Unsynced
}

// DefaultOptions returns the options a server uses.
func DefaultOptions() Options {
	o := Options{}
	o.EnsureDefaults()
	return o
}

// TestingOptions returns options for tests: an in-memory crashable
// filesystem, 64 KiB segments so roll-over is exercised, and SyncAlways.
func TestingOptions() Options {
	o := Options{FS: vfs.NewCrashableMem(), SegmentSize: 64 << 10, Sync: SyncAlways}
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
	if o.SyncInterval == 0 {
		o.SyncInterval = time.Second
	}
	if o.MaxPending == 0 {
		o.MaxPending = 64 << 20
	}
	if o.MaxUnsynced == 0 {
		o.MaxUnsynced = 16 << 20
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports the first invalid field.
func (o *Options) Validate() error {
	var errs []error
	if o.SegmentSize < 4096 {
		errs = append(errs, fmt.Errorf("wal: SegmentSize %d is below 4096", o.SegmentSize))
	}
	if o.Sync > SyncNever {
		errs = append(errs, fmt.Errorf("wal: unknown sync policy %d", o.Sync))
	}
	if o.SyncInterval < 0 {
		errs = append(errs, fmt.Errorf("wal: negative SyncInterval %v", o.SyncInterval))
	}
	if o.MaxPending < 0 {
		errs = append(errs, fmt.Errorf("wal: negative MaxPending %d", o.MaxPending))
	}
	if o.MaxUnsynced < 0 {
		errs = append(errs, fmt.Errorf("wal: negative MaxUnsynced %d", o.MaxUnsynced))
	}
	return errors.Join(errs...)
}
