package storage

import (
	"errors"
	"fmt"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/diskque/diskque/wal"
)

// Rebuilding the index. The AOF is the truth and the index is derived from
// it, and the collector keeps it so (forward.go): a replay of every record
// the AOF holds, from its first segment, across the segments removed from
// it, gives the index exactly. So a lost or corrupt index is rebuilt:
//
//   - when Open finds no index over an AOF that has records (index/ was
//     removed), or an index whose rebuild was cut short;
//   - when Pebble reports the index corrupt as Open opens it;
//   - when asked (Options.Rebuild = RebuildAlways: --rebuild-index, and
//     what a server does after the index was found corrupt at run time).
//
// A corrupt index is kept beside the new one as index.broken-<time>. While
// the rebuild runs, the key mrebuild marks the index as incomplete, so that
// a crash in the middle makes the next Open start over.

// RebuildMode says when Open rebuilds the index from the AOF.
type RebuildMode uint8

const (
	// RebuildWhenLost rebuilds an index that is missing, corrupt at Open,
	// or a rebuild cut short. The default.
	RebuildWhenLost RebuildMode = iota
	// RebuildAlways sets the index aside and rebuilds it.
	RebuildAlways
	// RebuildNever refuses to open instead (a missing index over an AOF
	// with records is then an error).
	RebuildNever
)

// openIndex opens Pebble and reads the index's metadata, and decides
// whether the index is to be rebuilt (s.rebuilding), opening a fresh one if
// so.
func (s *Store) openIndex(popts *pebble.Options) error {
	fs := s.opts.FS
	path := fs.PathJoin(s.dir, indexDir)
	open := func() error {
		gate := newCompactionGate()
		s.gate = gate
		popts.Experimental.CompactionScheduler = gate
		db, err := pebble.Open(path, popts)
		if err != nil {
			return fmt.Errorf("storage: open index: %w", err)
		}
		s.db = db
		s.buf.pebble = db // the write buffer's invariant checks read it
		s.room.start(db)  // backpressure.go
		// Compactions were held so that pebble.Open did not wait for one
		// (see compactionGate). They must run from now on: the replay may
		// flush memtables, and with L0 at Pebble's stop-writes threshold
		// and no compaction allowed it would wait for ever.
		gate.Open()
		return s.loadMeta()
	}
	closeDB := func() {
		if s.db != nil {
			s.closeIndex()
			s.db = nil
			s.fence = newFenceFS(fs)
			popts.FS = s.fence
		}
		s.resetCounters()
	}
	mode := s.opts.Rebuild
	if s.readOnly {
		mode = RebuildNever // a rebuild writes the whole index
	}
	if mode == RebuildAlways {
		if err := s.setIndexAside("asked to rebuild it"); err != nil {
			return err
		}
		s.rebuilding = true
	}
	err := open()
	if err != nil && isCorrupt(err) && mode == RebuildWhenLost {
		s.opts.Logger.Error("storage: the index is corrupt; it is set aside and rebuilt from the aof", "err", err)
		closeDB()
		if err := s.setIndexAside("corrupt"); err != nil {
			return err
		}
		s.rebuilding = true
		err = open()
	}
	if err != nil {
		return err
	}
	if s.rebuilding {
		return s.markRebuild()
	}
	switch {
	case mode == RebuildNever && s.rebuildCutShort:
		return errors.New("storage: the index is a rebuild that was cut short, and it may not be rebuilt here " +
			"(read-only, or rebuilds refused): open it writable to finish the rebuild")
	case mode == RebuildNever && s.newIndex:
		// A replay from the start is the index when nothing was ever
		// removed from the aof (an index that never flushed); otherwise it
		// takes a rebuild.
		whole, err := aofWhole(s)
		if err != nil {
			return err
		}
		if !whole {
			return errors.New("storage: there is no index, and the aof no longer holds its whole history, so the index " +
				"must be rebuilt, which may not be done here (read-only, or rebuilds refused): open it writable to rebuild it")
		}
	case mode == RebuildNever:
	case s.rebuildCutShort:
		s.opts.Logger.Warn("storage: the index is a rebuild that was cut short; rebuilding it again")
		closeDB()
		if err := fs.RemoveAll(path); err != nil {
			return fmt.Errorf("storage: remove the unfinished index: %w", err)
		}
		if err := open(); err != nil {
			return err
		}
		s.rebuilding = true
	case s.newIndex:
		has, err := aofHasRecords(s)
		if err != nil || !has {
			return err
		}
		s.opts.Logger.Warn("storage: no index, but the aof has records: rebuilding the index from the aof")
		s.rebuilding = true
	}
	if s.rebuilding {
		return s.markRebuild()
	}
	return nil
}

func isCorrupt(err error) bool {
	return pebble.IsCorruptionError(err) || errors.Is(err, ErrIndexCorrupt)
}

// resetCounters forgets what loadMeta read, before the index is opened
// again.
func (s *Store) resetCounters() {
	clear(s.queued)
	clear(s.paused)
	clear(s.segments)
	s.applied, s.jobs, s.maxCtime, s.nodeID = 0, 0, 0, ""
	s.names.Store(&nodeNames{})
	s.setNodeTable(nil)
	s.noResumeSet = false
	s.newIndex, s.rebuildCutShort = false, false
	s.upgradeFrom, s.legacyHolds = 0, nil
}

// setIndexAside renames the index directory to index.broken-<time>, where
// it stays for the operator, and makes an empty one.
func (s *Store) setIndexAside(why string) error {
	fs := s.opts.FS
	path := fs.PathJoin(s.dir, indexDir)
	if names, err := fs.List(path); err != nil || len(names) == 0 {
		return nil // nothing to keep
	}
	aside := fs.PathJoin(s.dir, indexDir+".broken-"+time.Now().UTC().Format("20060102T150405"))
	if _, err := fs.Stat(aside); err == nil {
		aside += fmt.Sprintf("-%d", time.Now().UnixNano())
	}
	if err := fs.Rename(path, aside); err != nil {
		return fmt.Errorf("storage: set the index aside: %w", err)
	}
	if err := fs.MkdirAll(path, 0o755); err != nil {
		return fmt.Errorf("storage: create %s: %w", path, err)
	}
	s.opts.Logger.Warn("storage: the index was set aside (delete it once the rebuilt one serves)", "why", why, "kept_as", aside)
	return nil
}

// markRebuild marks the index as a rebuild in progress, durably, before
// anything of the rebuild reaches it.
func (s *Store) markRebuild() error {
	if err := s.db.Set(keyRebuild, []byte{1}, pebble.NoSync); err != nil {
		return err
	}
	return s.flushIndex()
}

// aofHasRecords reports whether the store's AOF holds any record.
func aofHasRecords(s *Store) (bool, error) {
	fs := s.opts.FS
	dir := fs.PathJoin(s.dir, walDir)
	if _, err := fs.Stat(dir); err != nil {
		return false, nil
	}
	segs, err := wal.ListSegments(fs, dir)
	if err != nil {
		return false, err
	}
	for _, seg := range segs {
		if seg.Size > 0 {
			return true, nil
		}
	}
	return false, nil
}

// aofWhole reports whether the store's AOF holds every record it was
// ever written: its segments start at LSN 0 and follow each other.
func aofWhole(s *Store) (bool, error) {
	fs := s.opts.FS
	dir := fs.PathJoin(s.dir, walDir)
	if _, err := fs.Stat(dir); err != nil {
		return true, nil
	}
	segs, err := wal.ListSegments(fs, dir)
	if err != nil {
		return false, err
	}
	next := wal.LSN(0)
	for _, seg := range segs {
		if seg.First != next {
			return false, nil
		}
		next = seg.First + wal.LSN(seg.Size)
	}
	return true, nil
}

// replayAll rebuilds the index from every record of the AOF.
func (s *Store) replayAll() error {
	start := time.Now()
	end := s.log.End()
	s.recoveryInfo.From, s.recoveryInfo.To = s.log.First(), end
	s.opts.Logger.Info("storage: rebuilding the index from the whole aof", "from", s.log.First(), "to", end)
	lastLog := time.Now()
	n, skipped := 0, 0
	err := s.log.ReplayAll(func(lsn, next wal.LSN, r wal.Record) error {
		o, err := decodeOp(r.Type, r.Payload)
		if err != nil {
			return fmt.Errorf("storage: aof record at lsn %d: %w", lsn, err)
		}
		o.replay, o.rebuild = true, true
		// An ADD of a job the replay has is a job added again after a
		// deletion whose record was collected (the add was refused live
		// while the job existed): it replaces it.
		old, nj, err := s.resolve(nil, o)
		if err == nil && nj == nil && old == nil && o.id != "" {
			skipped++ // a record of a job the collected history had deleted
		}
		if err == nil {
			err = s.write(s.buf, o, old, nj, lsn)
		}
		if err != nil {
			return fmt.Errorf("storage: rebuild at lsn %d: %w", lsn, err)
		}
		s.applied = next
		n++
		if len(s.buf.rangeDels) > 0 || s.buf.bytes >= 8*s.opts.WriteBufferSize {
			s.waitForIndexRoomToClose() // nobody else holds mu yet
			if err := s.flushBufferLocked(); err != nil {
				return err
			}
		}
		if time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			s.opts.Logger.Info("storage: rebuild progress", "lsn", lsn, "to", end, "records", n, "jobs", s.jobs)
		}
		return nil
	})
	if err == nil {
		// The mark goes with the last of the rebuild: Pebble persists
		// memtables in order, so an index without it is whole.
		err = s.buf.Delete(keyRebuild)
	}
	if err == nil {
		err = s.flushBufferLocked()
	}
	if err == nil {
		err = s.flushIndex()
	}
	if s.flushBatch != nil {
		err = errors.Join(err, s.flushBatch.Close())
		s.flushBatch = nil
	}
	if err != nil {
		return err
	}
	s.rebuilding = false
	s.recoveryInfo.Records, s.recoveryInfo.Rebuilt = n, true
	s.opts.Logger.Info("storage: index rebuilt from the aof", "records", n, "skipped", skipped, "jobs", s.jobs,
		"took", time.Since(start).Round(time.Millisecond))
	return nil
}
