package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/diskque/diskque/internal/durable"
	"github.com/diskque/diskque/wal"
)

// Store is the job store: the AOF plus its Pebble index. See doc.go.
type Store struct {
	opts  Options
	dir   string
	log   *wal.Log
	db    *pebble.DB
	fence *fenceFS
	lock  io.Closer

	// mu serialises state changes: reading a job, checking the transition,
	// enqueueing its record and applying its batch happen under mu, so AOF
	// order and index order agree. Lock order: mu, then wal's internal lock.
	// mu is never held while waiting for I/O.
	mu      sync.Mutex
	applied wal.LSN // end of the last record applied to the index
	failed  error   // sticky: the index and the log may disagree; reopen
	closed  bool
	scratch []byte
	// Derived counters, persisted in every batch that changes them.
	queued   map[string]int64        // queued jobs per queue
	paused   map[string]PauseState   // non-none pause states
	segments map[wal.LSN]segmentLive // live bodies per AOF segment
	jobs     int64
	nodeID   string

	ckptMu       sync.Mutex // one checkpoint at a time
	lastCkptEnd  wal.LSN    // AOF end at the last checkpoint
	ckptKick     chan struct{}
	ckptStop     chan struct{}
	ckptDone     chan struct{}
	recoveryInfo RecoveryInfo
}

// segmentLive counts the bodies of one AOF segment still referenced by jobs.
type segmentLive struct {
	bodies int64
	bytes  int64
}

// RecoveryInfo describes what Open did.
type RecoveryInfo struct {
	// From and To bound the AOF records replayed into the index.
	From, To wal.LSN
	Records  int
	Duration time.Duration
}

const (
	walDir   = "aof"
	indexDir = "index"
	lockFile = "LOCK"
)

// Open opens (or creates) the store in dir: it opens the AOF (repairing a
// torn tail), opens the index, and replays the AOF records the index has not
// applied. The index persists only state whose records are durable in the
// AOF, so replay from the index's applied LSN is exact.
func Open(dir string, opts Options) (*Store, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	fs := opts.FS
	if err := durable.MkdirAll(fs, fs.PathJoin(dir, indexDir)); err != nil {
		return nil, fmt.Errorf("storage: create %s: %w", dir, err)
	}
	lock, err := fs.Lock(fs.PathJoin(dir, lockFile))
	if err != nil {
		return nil, fmt.Errorf("storage: lock %s (is another server using it?): %w", dir, err)
	}
	s := &Store{
		opts:     opts,
		dir:      dir,
		lock:     lock,
		queued:   map[string]int64{},
		paused:   map[string]PauseState{},
		segments: map[wal.LSN]segmentLive{},
		ckptKick: make(chan struct{}, 1),
		ckptStop: make(chan struct{}),
		ckptDone: make(chan struct{}),
	}
	if err := s.open(); err != nil {
		s.closeFiles()
		return nil, err
	}
	go s.checkpointLoop()
	return s, nil
}

func (s *Store) open() error {
	fs := s.opts.FS
	start := time.Now()
	var err error
	s.log, err = wal.Open(fs.PathJoin(s.dir, walDir), s.opts.walOptions())
	if err != nil {
		return err
	}
	s.fence = &fenceFS{FS: fs}
	popts := &pebble.Options{
		FS:           s.fence,
		DisableWAL:   true,
		MemTableSize: s.opts.MemTableSize,
		Logger:       pebbleLogger{s.opts.Logger},
		EventListener: &pebble.EventListener{
			// Pebble persists a memtable only after this returns: make every
			// record the memtable holds durable in the AOF first.
			FlushBegin: func(pebble.FlushInfo) {
				if err := s.log.Sync(); err != nil {
					s.fence.fence(err)
				}
			},
		},
	}
	cache := pebble.NewCache(s.opts.CacheSize)
	defer cache.Unref()
	popts.Cache = cache
	s.db, err = pebble.Open(fs.PathJoin(s.dir, indexDir), popts)
	if err != nil {
		return fmt.Errorf("storage: open index: %w", err)
	}
	if err := s.loadMeta(); err != nil {
		return err
	}
	if err := s.replay(); err != nil {
		return err
	}
	s.lastCkptEnd = s.log.End()
	if s.nodeID == "" {
		if _, err := s.commitOp(&op{typ: recNode, node: NewNodeID()}); err != nil {
			return err
		}
	}
	s.recoveryInfo.Duration = time.Since(start)
	return nil
}

// loadMeta reads the index's applied LSN and the derived counters.
func (s *Store) loadMeta() error {
	v, err := s.get(s.db, keyFormat)
	if err != nil {
		return err
	}
	if v == nil {
		if err := s.db.Set(keyFormat, binary.AppendUvarint(nil, formatVersion), pebble.NoSync); err != nil {
			return err
		}
	} else if ver, _ := binary.Uvarint(v); ver != formatVersion {
		return fmt.Errorf("storage: index format %d, this build reads %d", ver, formatVersion)
	}
	if v, err = s.get(s.db, keyApplied); err != nil {
		return err
	} else if v != nil {
		s.applied = wal.LSN(binary.BigEndian.Uint64(v))
	}
	if v, err = s.get(s.db, keyNodeID); err != nil {
		return err
	} else if v != nil {
		s.nodeID = string(v)
	}
	if v, err = s.get(s.db, keyJobs); err != nil {
		return err
	} else if v != nil {
		n, _ := binary.Uvarint(v)
		s.jobs = int64(n)
	}
	err = s.scanPrefix([]byte{prefixCount}, func(k, v []byte) error {
		n, _ := binary.Uvarint(v)
		s.queued[string(k[1:])] = int64(n)
		return nil
	})
	if err != nil {
		return err
	}
	err = s.scanPrefix([]byte{prefixPause}, func(k, v []byte) error {
		if len(v) == 1 {
			s.paused[string(k[1:])] = PauseState(v[0])
		}
		return nil
	})
	if err != nil {
		return err
	}
	return s.scanPrefix([]byte{prefixSegment}, func(k, v []byte) error {
		d := decoder{b: v}
		live := segmentLive{bodies: int64(d.uvarint()), bytes: int64(d.uvarint())}
		if d.err != nil || len(k) != 9 {
			return fmt.Errorf("storage: malformed segment accounting key %x", k)
		}
		s.segments[wal.LSN(binary.BigEndian.Uint64(k[1:]))] = live
		return nil
	})
}

// replay applies the AOF records after the index's applied LSN.
func (s *Store) replay() error {
	from := s.applied
	if first := s.log.First(); from < first {
		return fmt.Errorf("storage: the index has applied the aof up to lsn %d but the aof starts at %d: records are missing", from, first)
	}
	end := s.log.End()
	if from > end {
		return fmt.Errorf("storage: the index has applied the aof up to lsn %d but the aof ends at %d: the index is ahead of the log", from, end)
	}
	s.recoveryInfo.From, s.recoveryInfo.To = from, end
	if from == end {
		return nil
	}
	s.opts.Logger.Info("storage: replaying aof", "from", from, "to", end, "bytes", end-from)
	b := s.db.NewIndexedBatch()
	lastLog := time.Now()
	n := 0
	err := s.log.Replay(from, func(lsn wal.LSN, r wal.Record) error {
		o, err := decodeOp(r.Type, r.Payload)
		if err != nil {
			return fmt.Errorf("storage: aof record at lsn %d: %w", lsn, err)
		}
		old, nj, err := s.resolve(b, o)
		if err == nil {
			err = s.write(b, o, old, nj, lsn, lsn+wal.FrameSize(len(r.Payload)))
		}
		if err != nil {
			return fmt.Errorf("storage: replay lsn %d: %w", lsn, err)
		}
		n++
		if b.Len() > 16<<20 {
			if err := b.Commit(pebble.NoSync); err != nil {
				return err
			}
			b.Close()
			b = s.db.NewIndexedBatch()
		}
		if time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			s.opts.Logger.Info("storage: replay progress", "lsn", lsn, "to", end, "records", n)
		}
		return nil
	})
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	b.Close()
	if err != nil {
		return err
	}
	s.recoveryInfo.Records = n
	s.opts.Logger.Info("storage: replay done", "records", n, "to", end)
	return nil
}

// RecoveryInfo tells what Open replayed.
func (s *Store) RecoveryInfo() RecoveryInfo { return s.recoveryInfo }

// resolve reads the job a record concerns (through r: the DB for live
// operations, the replay batch during recovery) and computes its next state
// with transition. Records that are not about one job resolve to nil, nil.
func (s *Store) resolve(r pebble.Reader, o *op) (old, nj *Job, err error) {
	switch o.typ {
	case recNode, recPause:
		return nil, nil, nil
	case recAdd:
		old, err = s.getJob(r, o.id)
		j := *o.job
		j.StoredSize = uint32(len(o.body))
		return old, &j, err
	}
	if old, err = s.getJob(r, o.id); err != nil || old == nil {
		return old, nil, err
	}
	nj, err = transition(old, o)
	return old, nj, err
}

// write adds a resolved record's effects to b and advances the applied LSN.
// Live operations and replay both end here, so the index is a function of the
// log alone.
func (s *Store) write(b *pebble.Batch, o *op, old, nj *Job, lsn, end wal.LSN) error {
	switch o.typ {
	case recNode:
		s.nodeID = o.node
		if err := b.Set(keyNodeID, []byte(o.node), nil); err != nil {
			return err
		}
	case recPause:
		if o.pause == PauseNone {
			delete(s.paused, o.queue)
			if err := b.Delete(pauseKey(o.queue), nil); err != nil {
				return err
			}
		} else {
			s.paused[o.queue] = o.pause
			if err := b.Set(pauseKey(o.queue), []byte{byte(o.pause)}, nil); err != nil {
				return err
			}
		}
	default:
		if o.typ == recAdd {
			nj.BodyLSN = lsn
		}
		// A transition of a job deleted earlier in the log resolves to
		// nothing: there is nothing to write.
		if old != nil || nj != nil {
			if err := s.putJob(b, old, nj); err != nil {
				return err
			}
		}
	}
	s.applied = end
	return b.Set(keyApplied, binary.BigEndian.AppendUint64(nil, uint64(end)), nil)
}

// putJob writes the index changes that take a job from old to nj (either may
// be nil) and updates the derived counters.
func (s *Store) putJob(b *pebble.Batch, old, nj *Job) error {
	var errs []error
	set := func(k, v []byte) { errs = append(errs, b.Set(k, v, nil)) }
	del := func(k []byte) { errs = append(errs, b.Delete(k, nil)) }

	if nj != nil {
		set(jobKey(nj.ID), encodeJob(nil, nj))
	} else {
		del(jobKey(old.ID))
	}
	// Queue order.
	wasQueued := old != nil && old.State == StateQueued
	isQueued := nj != nil && nj.State == StateQueued
	if wasQueued && (!isQueued || old.Queue != nj.Queue || old.Ctime != nj.Ctime) {
		del(queueKey(old.Queue, old.Ctime, old.ID))
		s.addQueued(b, old.Queue, -1)
	}
	if isQueued && (!wasQueued || old.Queue != nj.Queue || old.Ctime != nj.Ctime) {
		set(queueKey(nj.Queue, nj.Ctime, nj.ID), nil)
		s.addQueued(b, nj.Queue, +1)
	}
	// Schedule.
	oldEv, on := events(old)
	newEv, nn := events(nj)
	for _, e := range oldEv[:on] {
		if !containsEvent(newEv[:nn], e) {
			del(scheduleKey(e.Due, e.Kind, e.ID))
		}
	}
	for _, e := range newEv[:nn] {
		if !containsEvent(oldEv[:on], e) {
			set(scheduleKey(e.Due, e.Kind, e.ID), nil)
		}
	}
	// Job count and the body's segment.
	switch {
	case old == nil && nj != nil:
		s.jobs++
		set(keyJobs, binary.AppendUvarint(nil, uint64(s.jobs)))
		s.addLive(b, nj, +1)
	case old != nil && nj == nil:
		s.jobs--
		set(keyJobs, binary.AppendUvarint(nil, uint64(s.jobs)))
		s.addLive(b, old, -1)
	case old != nil && nj != nil && old.BodyLSN != nj.BodyLSN:
		s.addLive(b, old, -1)
		s.addLive(b, nj, +1)
	}
	return errors.Join(errs...)
}

func containsEvent(evs []Event, e Event) bool {
	for _, x := range evs {
		if x == e {
			return true
		}
	}
	return false
}

func (s *Store) addQueued(b *pebble.Batch, queue string, delta int64) {
	n := s.queued[queue] + delta
	if n <= 0 {
		delete(s.queued, queue)
		_ = b.Delete(countKey(queue), nil)
		return
	}
	s.queued[queue] = n
	_ = b.Set(countKey(queue), binary.AppendUvarint(nil, uint64(n)), nil)
}

func (s *Store) addLive(b *pebble.Batch, j *Job, sign int64) {
	seg := s.log.SegmentOf(j.BodyLSN)
	l := s.segments[seg]
	l.bodies += sign
	l.bytes += sign * int64(j.StoredSize)
	if l.bodies <= 0 {
		delete(s.segments, seg)
		_ = b.Delete(segmentKey(uint64(seg)), nil)
		return
	}
	s.segments[seg] = l
	v := binary.AppendUvarint(nil, uint64(l.bodies))
	_ = b.Set(segmentKey(uint64(seg)), binary.AppendUvarint(v, uint64(l.bytes)), nil)
}

// commitOp validates, logs and applies one record, and returns the job as it
// is after the record (nil for records that are not about one job, and for
// deletes) once the record is written per the fsync policy.
func (s *Store) commitOp(o *op) (*Job, error) {
	s.mu.Lock()
	if err := s.usableLocked(); err != nil {
		s.mu.Unlock()
		return nil, err
	}
	old, nj, err := s.resolve(s.db, o)
	switch {
	case err != nil:
	case o.typ == recAdd && old != nil:
		err = fmt.Errorf("%w: %s", ErrExists, o.id)
	case o.typ != recAdd && o.id != "" && old == nil:
		err = fmt.Errorf("%w: %s", ErrNotFound, o.id)
	}
	if err != nil {
		s.mu.Unlock()
		return nil, err
	}
	s.scratch = encodeOp(s.scratch[:0], o)
	lsn, end, err := s.log.Enqueue(wal.Record{Type: o.typ, Payload: s.scratch})
	if err != nil {
		s.failLocked(err)
		s.mu.Unlock()
		return nil, err
	}
	b := s.db.NewBatch()
	err = s.write(b, o, old, nj, lsn, end)
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	b.Close()
	if err != nil {
		// The record is in the log but not in the index: only a reopen
		// (which replays it) makes them agree again.
		s.failLocked(fmt.Errorf("storage: apply lsn %d: %w", lsn, err))
		s.mu.Unlock()
		return nil, err
	}
	kick := int64(end-s.lastCkptEnd) > s.opts.CheckpointBytes
	s.mu.Unlock()
	if kick {
		select {
		case s.ckptKick <- struct{}{}:
		default:
		}
	}
	if err := s.log.Wait(end); err != nil {
		s.fail(err)
		return nil, err
	}
	if nj != nil && o.typ == recDeliver && nj.Retry == 0 {
		// At-most-once: the delivery must be durable before the job leaves,
		// so a crash can never deliver it twice.
		if err := s.log.WaitSynced(end); err != nil {
			s.fail(err)
			return nil, err
		}
	}
	return nj, nil
}

// ErrClosed is returned by operations on a closed store.
var ErrClosed = errors.New("storage: store closed")

// ErrFailed wraps the error that made the store unusable: an AOF write or
// fsync failed, or the index refused a batch. Close and reopen the store to
// recover what was durable.
var ErrFailed = errors.New("storage: store failed earlier; reopen it")

func (s *Store) usableLocked() error {
	if s.closed {
		return ErrClosed
	}
	if s.failed != nil {
		return fmt.Errorf("%w: %w", ErrFailed, s.failed)
	}
	return nil
}

func (s *Store) fail(err error) {
	s.mu.Lock()
	s.failLocked(err)
	s.mu.Unlock()
}

// failLocked makes the store unusable and fences the index so that no batch
// whose record may be missing from the log is ever persisted.
func (s *Store) failLocked(err error) {
	s.fence.fence(err)
	if s.failed == nil {
		s.failed = err
		s.opts.Logger.Error("storage: store failed; reopen to recover", "err", err)
	}
}

func (s *Store) get(r pebble.Reader, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out, nil
}

func (s *Store) getJob(r pebble.Reader, id string) (*Job, error) {
	v, closer, err := r.Get(jobKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	return decodeJob(v)
}

func (s *Store) scanPrefix(prefix []byte, fn func(k, v []byte) error) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: prefix, UpperBound: prefixEnd(prefix)})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			it.Close()
			return err
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// Checkpoint makes the index durable up to everything applied so far and
// removes the AOF segments that neither the index nor any live body needs.
// After it, a restart replays only what was applied after it.
func (s *Store) Checkpoint() error {
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	s.mu.Lock()
	if err := s.usableLocked(); err != nil {
		s.mu.Unlock()
		return err
	}
	applied := s.applied
	s.mu.Unlock()
	// Flush makes durable every batch applied before it was called; the
	// FlushBegin hook syncs the AOF first.
	if err := s.log.WaitSynced(applied); err != nil {
		s.fail(err)
		return err
	}
	if err := s.db.Flush(); err != nil {
		return fmt.Errorf("storage: flush index: %w", err)
	}
	s.mu.Lock()
	s.lastCkptEnd = applied
	s.mu.Unlock()
	return s.truncateLog(applied)
}

// truncateLog removes front segments that end at or before the durable
// checkpoint and hold no live body.
func (s *Store) truncateLog(checkpoint wal.LSN) error {
	segs := s.log.Segments()
	cut := wal.LSN(0)
	s.mu.Lock()
	for _, seg := range segs[:len(segs)-1] {
		end := seg.First + wal.LSN(seg.Size)
		if end > checkpoint || s.segments[seg.First].bodies > 0 {
			break
		}
		cut = end
	}
	s.mu.Unlock()
	if cut == 0 {
		return nil
	}
	return s.log.TruncateFront(cut)
}

func (s *Store) checkpointLoop() {
	defer close(s.ckptDone)
	var tick <-chan time.Time
	if s.opts.CheckpointInterval > 0 {
		t := time.NewTicker(s.opts.CheckpointInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-s.ckptStop:
			return
		case <-tick:
		case <-s.ckptKick:
		}
		if err := s.Checkpoint(); err != nil && !errors.Is(err, ErrClosed) {
			s.opts.Logger.Error("storage: checkpoint failed", "err", err)
		}
	}
}

// Close checkpoints (so the next Open replays nothing), then closes the index
// and the AOF. It runs every step and returns the first error. After a failure
// it skips the checkpoint: the next Open recovers from the log.
func (s *Store) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	failed := s.failed
	s.mu.Unlock()
	close(s.ckptStop)
	<-s.ckptDone
	var errs []error
	if failed == nil {
		errs = append(errs, s.Checkpoint())
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	errs = append(errs, s.closeFiles())
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func (s *Store) closeFiles() error {
	var errs []error
	if s.db != nil {
		errs = append(errs, s.db.Close())
	}
	if s.log != nil {
		errs = append(errs, s.log.Close())
	}
	if s.lock != nil {
		errs = append(errs, s.lock.Close())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// pebbleLogger routes Pebble's messages to slog.
type pebbleLogger struct{ l *slog.Logger }

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Errorf(format string, args ...any) {
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error("pebble: fatal: " + msg)
	panic("pebble: " + msg)
}
