package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
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
	// failedCh is closed when failed is set.
	failedCh chan struct{}
	closed   bool
	scratch  []byte
	kbuf     []byte       // index key scratch for putJob
	vbuf     []byte       // index value scratch for putJob
	buf      *writeBuffer // index writes not yet in Pebble, see write_buffer.go
	// flushBatch is the Pebble batch every buffer flush reuses.
	flushBatch *pebble.Batch
	// Derived counters, persisted in every batch that changes them.
	queued   map[string]int64        // queued jobs per queue
	paused   map[string]PauseState   // non-none pause states
	segments map[wal.LSN]segmentLive // live bodies per AOF segment
	jobs     int64
	// maxCtime is the highest ctime of any job added (see indexState),
	// persisted with the counters.
	maxCtime uint64
	// Counters changed since the last buffer flush, which writes them.
	dirtyQueues   map[string]struct{}
	dirtySegments map[wal.LSN]struct{}
	nodeID        string
	selfNodes     []string  // []string{nodeID}: the node list of a job of this node alone
	cache         *jobCache // recently written jobs, see cache.go

	// logRef is log for Pebble's flush hook, which may run on Pebble's
	// goroutines.
	logRef atomic.Pointer[wal.Log]

	ckptMu      sync.Mutex // one checkpoint at a time
	lastCkptEnd wal.LSN    // AOF end at the last checkpoint
	// durableApplied is the applied LSN of the index on disk: the last
	// checkpoint's (or what Open found). Segments ending at or before it
	// are never replayed again. Guarded by mu.
	durableApplied wal.LSN
	collected      CollectStats // guarded by mu
	ckptKick       chan struct{}
	ckptStop       chan struct{}
	ckptDone       chan struct{}
	recoveryInfo   RecoveryInfo
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
		opts:          opts,
		dir:           dir,
		lock:          lock,
		queued:        map[string]int64{},
		paused:        map[string]PauseState{},
		segments:      map[wal.LSN]segmentLive{},
		dirtyQueues:   map[string]struct{}{},
		dirtySegments: map[wal.LSN]struct{}{},
		ckptKick:      make(chan struct{}, 1),
		failedCh:      make(chan struct{}),
		cache:         newJobCache(opts.JobCacheSize),
		buf:           newWriteBuffer(),
		ckptStop:      make(chan struct{}),
		ckptDone:      make(chan struct{}),
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
	// The index opens first: its applied LSN tells the AOF which gaps are
	// segments the collector removed (below it) and which would be loss.
	s.fence = &fenceFS{FS: fs}
	popts := &pebble.Options{
		FS:           s.fence,
		DisableWAL:   true,
		MemTableSize: s.opts.MemTableSize,
		Logger:       pebbleLogger{l: s.opts.Logger, fence: s.fence},
		EventListener: &pebble.EventListener{
			// Pebble persists a memtable only after this returns: make every
			// record the memtable holds durable in the AOF first.
			FlushBegin: func(pebble.FlushInfo) {
				// Before the AOF is open the index holds nothing from it.
				if l := s.logRef.Load(); l != nil {
					if err := l.Sync(); err != nil {
						s.fence.fence(err)
					}
				}
			},
		},
	}
	// Every Add checks that its id is new, and ids are random: bloom filters
	// answer those misses without reading blocks.
	for i := range popts.Levels {
		popts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
	}
	// Pebble charges its memtables to the block cache (Cache.Reserve): a
	// cache of CacheSize alone is all memtable, two of them at 32 MiB each,
	// and caches no block at all (0 entries, a 0% hit rate: every iterator
	// a consumer opened read its index blocks from the file again). The
	// cache gets room for two memtables beside the blocks.
	popts.CacheSize = s.opts.CacheSize + 2*int64(s.opts.MemTableSize)
	// Job keys are random, so every file flushed to L0 spans the whole job
	// keyspace and every L0 → Lbase compaction rewrites all of Lbase's job
	// keys. Letting L0 gather 12 files instead of Pebble's 4 before that
	// compaction triples the data each rewrite absorbs: with a growing
	// backlog it cut the server's CPU per ADDJOB by about 10% and raised
	// ADDJOB throughput by as much, and left consumption unchanged (bench/README.md).
	// Point reads pay little for the deeper L0 (bloom filters); the stop
	// threshold keeps Pebble's ratio of 3.
	popts.L0CompactionThreshold = 12
	popts.L0StopWritesThreshold = 36
	gate := newCompactionGate()
	popts.Experimental.CompactionScheduler = gate
	s.db, err = pebble.Open(fs.PathJoin(s.dir, indexDir), popts)
	if err != nil {
		return fmt.Errorf("storage: open index: %w", err)
	}
	s.buf.pebble = s.db
	// Compactions were held so that pebble.Open did not wait for one (see
	// compactionGate). They must run from now on: the replay may flush
	// memtables, and with L0 at Pebble's stop-writes threshold and no
	// compaction allowed it would wait for ever.
	gate.Open()
	if err := s.loadMeta(); err != nil {
		return err
	}
	s.durableApplied = s.applied
	wopts := s.opts.walOptions()
	wopts.Checkpoint = s.applied
	if s.log, err = wal.Open(fs.PathJoin(s.dir, walDir), wopts); err != nil {
		return err
	}
	s.logRef.Store(s.log)
	if err := s.checkLiveSegments(); err != nil {
		return err
	}
	if err := s.replay(); err != nil {
		return err
	}
	s.lastCkptEnd = s.log.End()
	if s.nodeID == "" {
		// The node id names this store's jobs: make it durable now, whatever
		// the fsync policy, so a crash cannot give the store a new one.
		if _, err := s.commitOne(&op{typ: recNode, node: NewNodeID()}); err != nil {
			return err
		}
		if err := s.log.Sync(); err != nil {
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
	switch ver, _ := binary.Uvarint(v); {
	case v == nil || ver == 1:
		// A new index, or one of format 1, whose values this build still
		// reads: it is format 2 from the first value written, and an
		// older build must refuse it from now on.
		if err := s.db.Set(keyFormat, binary.AppendUvarint(nil, formatVersion), pebble.NoSync); err != nil {
			return err
		}
	case ver != formatVersion:
		return fmt.Errorf("storage: index format %d, this build reads 1 and %d", ver, formatVersion)
	}
	scanCtime := false
	if v, err = s.get(s.db, keyState); err != nil {
		return err
	} else if v != nil {
		st, err := decodeState(v)
		if err != nil {
			return err
		}
		s.applied, s.jobs, s.maxCtime = st.applied, st.jobs, st.maxCtime
		scanCtime = !st.hasMaxCtime
	}
	if v, err = s.get(s.db, keyNodeID); err != nil {
		return err
	} else if v != nil {
		s.setNodeID(string(v))
	}
	if scanCtime {
		// After the node id: job values refer to it.
		if err := s.scanMaxCtime(); err != nil {
			return err
		}
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

// scanMaxCtime finds the highest ctime among the index's jobs: once, for an
// index written before the highest ctime was kept (the next flush stores
// it). Jobs deleted before then are gone, so a clock stepped back below
// their ctimes can still sort new jobs before them; it cannot below any job
// still in the index, which is what ordering needs.
func (s *Store) scanMaxCtime() error {
	start := time.Now()
	n := 0
	err := s.scanPrefix([]byte{prefixJob}, func(k, v []byte) error {
		j, err := decodeJob(string(k[1:]), v, s.selfNodes)
		if err != nil {
			return err
		}
		s.maxCtime = max(s.maxCtime, j.Ctime)
		n++
		return nil
	})
	s.opts.Logger.Info("storage: read the highest job ctime from the index (once, for an index written by an older build)",
		"jobs", n, "took", time.Since(start))
	return err
}

// MaxCtime returns the highest ctime of any job added to the store, kept
// across restarts: a broker's CtimeClock observes it at start, so that a
// wall clock stepped back never sorts new jobs ahead of the backlog.
func (s *Store) MaxCtime() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.maxCtime
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
	// The replay applies the records as live commits do, through the write
	// buffer: reads find the jobs the tail wrote there, a job added and
	// acked within the tail never reaches Pebble, and what does arrives in
	// large sorted batches (eight times a live buffer: nobody waits on
	// them). No other goroutine uses the store yet.
	lastLog := time.Now()
	n := 0
	err := s.log.Replay(from, func(lsn wal.LSN, r wal.Record) error {
		o, err := decodeOp(r.Type, r.Payload)
		if err != nil {
			return fmt.Errorf("storage: aof record at lsn %d: %w", lsn, err)
		}
		// A logged add was refused if its id existed (or its id was fresh),
		// and the index has applied nothing at or after from: no lookup.
		o.fresh = o.typ == recAdd
		old, nj, err := s.resolve(nil, o)
		if err == nil {
			err = s.write(s.buf, o, old, nj, lsn)
		}
		if err != nil {
			return fmt.Errorf("storage: replay lsn %d: %w", lsn, err)
		}
		s.applied = lsn + wal.FrameSize(len(r.Payload))
		n++
		if len(s.buf.rangeDels) > 0 || s.buf.bytes >= 8*s.opts.WriteBufferSize {
			if err := s.flushBufferLocked(); err != nil {
				return err
			}
		}
		if time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			s.opts.Logger.Info("storage: replay progress", "lsn", lsn, "to", end, "records", n)
		}
		return nil
	})
	if err == nil {
		err = s.flushBufferLocked()
	}
	if s.flushBatch != nil {
		// Sized for the replay's larger flushes: let live ones start small.
		err = errors.Join(err, s.flushBatch.Close())
		s.flushBatch = nil
	}
	if err != nil {
		return err
	}
	s.recoveryInfo.Records = n
	s.opts.Logger.Info("storage: replay done", "records", n, "to", end)
	return nil
}

// RecoveryInfo tells what Open replayed.
func (s *Store) RecoveryInfo() RecoveryInfo { return s.recoveryInfo }

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

// Failed returns a channel closed when the store fails (see ErrFailed): an
// AOF write or fsync error. A server watches it to reopen the store once
// the disk works again; until then every operation returns ErrFailed.
func (s *Store) Failed() <-chan struct{} { return s.failedCh }

// Failing reports whether the store has failed, without taking its lock:
// hot paths (every GETJOB) ask it.
func (s *Store) Failing() bool {
	select {
	case <-s.failedCh:
		return true
	default:
		return false
	}
}

// Err returns the error that made the store fail, or nil.
func (s *Store) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failed
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
		close(s.failedCh)
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
	return decodeJob(id, v, s.selfNodes)
}

// getBuffered returns the job with id as the write buffer holds it: found
// is false when the buffer does not know the job (read Pebble then); a nil
// job with found set means deleted. mu must be held.
func (s *Store) getBuffered(id string) (j *Job, found bool, err error) {
	e, ok := s.buf.lookup(appendJobKey(s.kbuf[:0], id))
	if !ok {
		return nil, false, nil
	}
	if e.del {
		return nil, true, nil
	}
	j, err = e.decode(id, s.selfNodes)
	return j, true, err
}

// scanPrefix calls fn for every key with prefix, in order, in the index as
// it stands (the write buffer over Pebble), holding mu.
func (s *Store) scanPrefix(prefix []byte, fn func(k, v []byte) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var ferr error
	err := s.scanMerged(prefix, prefixEnd(prefix), false, func(k, v []byte) bool {
		ferr = fn(k, v)
		return ferr == nil
	})
	return errors.Join(ferr, err)
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
	// Pebble gets the write buffer first, so that its flush holds
	// everything applied so far.
	if err := s.flushBufferLocked(); err != nil {
		s.failLocked(err)
		s.mu.Unlock()
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	// The live-body counts as of applied: the flushed index will reference
	// at least these bodies. Operations applied during the flush may make a
	// segment look dead now, but the flushed index may predate them.
	applied := s.applied
	live := maps.Clone(s.segments)
	s.mu.Unlock()
	// Flush makes durable every batch applied before it was called; the
	// FlushBegin hook syncs the AOF first.
	if err := s.log.WaitSynced(applied); err != nil {
		s.fail(err)
		return err
	}
	flushed, err := s.db.AsyncFlush()
	if err != nil {
		return fmt.Errorf("storage: flush index: %w", err)
	}
	select {
	case <-flushed:
	case <-s.failedCh:
		// The AOF failed under the flush: the index is fenced and the
		// flush will never complete.
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.usableLocked()
	}
	s.mu.Lock()
	s.lastCkptEnd = applied
	s.durableApplied = applied
	s.mu.Unlock()
	return s.removeDeadSegments(applied, live)
}

// removeDeadSegments removes every sealed segment that ends at or before the
// durable checkpoint and held no live body at it, wherever it is in the log:
// nothing will replay it (the index has applied it) and nothing will read it
// (no job's body is there). A long-delayed job at the front of the log
// therefore does not pin the churn behind it.
func (s *Store) removeDeadSegments(checkpoint wal.LSN, live map[wal.LSN]segmentLive) error {
	segs := s.log.Segments()
	var dead []wal.LSN
	var bytes int64
	for _, seg := range segs[:len(segs)-1] {
		if seg.First+wal.LSN(seg.Size) <= checkpoint && live[seg.First].bodies == 0 {
			dead = append(dead, seg.First)
			bytes += seg.Size
		}
	}
	if len(dead) == 0 {
		return nil
	}
	if err := s.log.RemoveSegments(dead); err != nil {
		return err
	}
	s.mu.Lock()
	s.collected.SegmentsRemoved += int64(len(dead))
	s.collected.BytesReclaimed += bytes
	s.mu.Unlock()
	return nil
}

// checkLiveSegments verifies at Open that every segment the index says
// holds live bodies is in the AOF: a missing one is lost data, not a gap
// the collector left.
func (s *Store) checkLiveSegments() error {
	held := map[wal.LSN]bool{}
	for _, seg := range s.log.Segments() {
		held[seg.First] = true
	}
	for first, l := range s.segments {
		if !held[first] {
			return fmt.Errorf("storage: aof segment %016x.wal is missing but holds %d live job bodies", uint64(first), l.bodies)
		}
	}
	return nil
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
	if s.flushBatch != nil {
		errs = append(errs, s.flushBatch.Close())
		s.flushBatch = nil
	}
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

// pebbleLogger routes Pebble's messages to slog. Once the index is fenced
// Pebble retries its failing flushes in a loop; those errors go to Debug.
type pebbleLogger struct {
	l     *slog.Logger
	fence *fenceFS
}

func (p pebbleLogger) Infof(format string, args ...any) {
	p.l.Debug("pebble: " + fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Errorf(format string, args ...any) {
	if p.fence != nil && p.fence.check() != nil {
		p.l.Debug("pebble (index fenced): " + fmt.Sprintf(format, args...))
		return
	}
	p.l.Error("pebble: " + fmt.Sprintf(format, args...))
}
func (p pebbleLogger) Fatalf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	p.l.Error("pebble: fatal: " + msg)
	panic("pebble: " + msg)
}

// setNodeID records the store's node id.
func (s *Store) setNodeID(id string) {
	s.nodeID = id
	s.selfNodes = []string{id}
}
