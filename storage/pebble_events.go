package storage

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// What the store does with what Pebble reports.
//
//   - FlushBegin syncs the AOF first (the index on disk never reflects a
//     record that is not durable); if that fails the store fails.
//   - A background error (a flush or compaction that failed, table stats
//     that could not be read, disk usage that could not be measured) is an
//     I/O error on the index's own files — the data directory vanished, EIO,
//     ENOSPC: the store fails (ErrFailed), which fences the index so that
//     Pebble's retries block instead of spinning (fence.go), and the daemon
//     reopens it once the disk works again.
//   - A corrupt index file (DataCorruption, or a read that returns a
//     corruption error) fails the store with ErrIndexCorrupt.
//   - Logger.Fatalf is what Pebble calls when it cannot go on (a MANIFEST
//     write failed, an invariant broke): the store fails the same way, and
//     Fatalf returns instead of ending the process. The index is derived from
//     the AOF, so a reopen rebuilds whatever Pebble left behind.
//   - Errors are logged at WARN, at most one line per pebbleLogEvery with a
//     count of the lines suppressed; informational lines go to Debug.

// pebbleLogEvery bounds Pebble's error lines in the log: a failing disk
// repeats the same error many times a second.
const pebbleLogEvery = 10 * time.Second

// ErrIndexFailed is wrapped (in ErrFailed) when the index could not read or
// write its own files, or Pebble reported a fatal error.
var ErrIndexFailed = errors.New("storage: the index failed")

// ErrIndexCorrupt is wrapped (in ErrFailed, and in the error of the read
// that met it) when Pebble found a damaged index file: a checksum that does
// not match. The AOF is intact, so the index can be rebuilt from it; until
// then the store refuses writes. The error names the file and its keys.
var ErrIndexCorrupt = errors.New("storage: the index is corrupt")

// indexCorruption is the error for corruption in file path over bounds.
func indexCorruption(path, bounds string, details error) error {
	return fmt.Errorf("%w: %s (keys %s): %w", ErrIndexCorrupt, path, bounds, details)
}

// indexErr returns err, which a read of Pebble returned, as ErrIndexCorrupt
// if it is a corruption, failing the store; other errors are returned as
// they are.
func (s *Store) indexErr(err error) error {
	if err == nil || !pebble.IsCorruptionError(err) || errors.Is(err, ErrIndexCorrupt) {
		return err
	}
	path, bounds := "an index file", "unknown"
	if info := pebble.ExtractDataCorruptionInfo(err); info != nil {
		path, bounds = info.Path, info.Bounds.String()
	}
	e := indexCorruption(path, bounds, err)
	s.failAsync(e)
	return e
}

func (s *Store) eventListener() *pebble.EventListener {
	return &pebble.EventListener{
		// Pebble persists a memtable only after this returns: make every
		// record the memtable holds durable in the AOF first.
		FlushBegin: func(pebble.FlushInfo) {
			s.room.flushBegin() // backpressure.go
			// Before the AOF is open the index holds nothing from it.
			if l := s.logRef.Load(); l != nil {
				if err := l.Sync(); err != nil {
					s.failAsync(err)
				}
			}
		},
		// The store's back-pressure waits for flushes and compactions
		// (backpressure.go); these take only its leaf lock.
		FlushEnd:      func(pebble.FlushInfo) { s.room.flushEnd() },
		CompactionEnd: func(pebble.CompactionInfo) { s.room.kick() },
		// Pebble's default ends the process (Logger.Fatalf). The store
		// fails instead; the read that met the corruption returns it too
		// (indexErr).
		DataCorruption: func(info pebble.DataCorruptionInfo) {
			e := indexCorruption(info.Path, info.Bounds.String(), info.Details)
			s.pebbleLog.warn(s.fence.fenced(), "pebble: "+info.String())
			s.failAsync(e)
		},
		BackgroundError: func(err error) {
			s.pebbleLog.warn(s.fence.fenced(), "pebble: background error: "+err.Error())
			s.failAsync(fmt.Errorf("%w: %w", ErrIndexFailed, err))
		},
	}
}

// failAsync fails the store from a Pebble callback, which may run under
// Pebble's own locks while a goroutine holding mu waits for Pebble: the
// index is fenced at once (an atomic store), and mu is taken on another
// goroutine.
func (s *Store) failAsync(err error) {
	s.fenceIndex(err)
	if s.failing.CompareAndSwap(false, true) {
		go s.fail(err)
	}
}

// pebbleLogger routes Pebble's messages to slog. See the top of this file.
type pebbleLogger struct {
	s *Store
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.s.opts.Logger.Debug("pebble: " + fmt.Sprintf(format, args...))
}

func (p pebbleLogger) Errorf(format string, args ...any) {
	p.s.pebbleLog.warn(p.s.fence.fenced(), "pebble: "+fmt.Sprintf(format, args...))
}

// Fatalf fails the store; unlike Pebble's default it does not end the
// process (see the top of this file).
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.s.pebbleLog.warn(p.s.fence.fenced(), "pebble: fatal: "+msg)
	p.s.failAsync(fmt.Errorf("%w: pebble: %s", ErrIndexFailed, msg))
}

// rateLimitedLog writes at most one line per every, with the number of
// lines it suppressed since the last one.
type rateLimitedLog struct {
	l          *slog.Logger
	every      time.Duration
	mu         sync.Mutex
	last       time.Time
	suppressed int
	lines      atomic.Int64 // lines written (tests)
}

func (r *rateLimitedLog) warn(fenced bool, msg string) {
	r.mu.Lock()
	now := time.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := r.suppressed
	r.last, r.suppressed = now, 0
	r.mu.Unlock()
	r.lines.Add(1)
	attrs := []any{"suppressed_since_last", suppressed}
	if fenced {
		attrs = append(attrs, "index", "fenced: the store has failed and refuses writes until it is reopened")
	}
	r.l.Warn(msg, attrs...)
}
