package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/bloom"
	"github.com/cockroachdb/pebble/v2/vfs"
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
	// order and index order agree. Lock order: closeMu, ckptMu, mu, then
	// wal's and Pebble's locks (LOCKS.md). mu is never held for an
	// operation's durability (Pending.Wait), but it is held for I/O: Pebble
	// reads past the job cache and the buffer, a scan page's merge, a buffer
	// flush (Batch.Commit: a memtable insert; never a write stall, which the
	// store's back-pressure does before mu: backpressure.go), and Enqueue's
	// back-pressure (more than wal MaxPending waiting for the writer).
	mu      sync.Mutex
	applied wal.LSN // end of the last record applied to the index
	failed  error   // sticky: the index and the log may disagree; reopen
	// failedCh is closed when failed is set.
	failedCh chan struct{}
	closed   bool // set under mu by Close before it closes any file
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
	// upgradeFrom is the format of an older index Open marks format 4 after
	// the log is open (upgradeIndex), and legacyHolds the holds its g/
	// values counted without keys (format 3): deletion segment → creator
	// segment → count.
	upgradeFrom uint64
	legacyHolds map[wal.LSN]map[wal.LSN]int64
	nodeID      string
	// names is what index values refer to instead of spelling node ids
	// out: []string{nodeID} (the node list of a job of this node alone) and
	// the interned ids (nodenames.go). Read without mu (decodes of what
	// Pebble returned); replaced, never modified, under mu.
	names atomic.Pointer[nodeNames]
	// nodeNums numbers the interned ids (the inverse of names.ids).
	// Guarded by mu.
	nodeNums map[string]uint32
	// noResumeSet: the index is of format 5 or older and opened read-only,
	// so never upgraded: it has no resume set (resume.go).
	noResumeSet bool
	cache       *jobCache // recently written jobs, see cache.go
	// writes counts the operations applied to the index (Store.write,
	// live and replayed), so that a WriteMark can tell that no job changed
	// since a read. Guarded by mu.
	writes uint64
	// indexGets counts the Pebble point Gets of reads and commits
	// (Stats.IndexGets): atomic, since Job reads Pebble after mu.
	indexGets atomic.Int64

	// logRef is log for Pebble's flush hook, which may run on Pebble's
	// goroutines.
	logRef atomic.Pointer[wal.Log]

	// ckptMu: one checkpoint at a time. Held across the checkpoint's I/O
	// (the forward records' fsync, the index flush, segment removal);
	// taken after the pin and before mu.
	ckptMu      sync.Mutex
	lastCkptEnd wal.LSN // AOF end at the last checkpoint
	// durableApplied is the applied LSN of the index on disk: the last
	// checkpoint's (or what Open found). Segments ending at or before it
	// are never replayed again. Guarded by mu.
	durableApplied wal.LSN
	collected      CollectStats // guarded by mu
	ckptKick       chan struct{}
	// fwdJobs is forwardScan's map, kept between checkpoints so that it
	// does not grow anew each time. Guarded by ckptMu.
	fwdJobs      map[fwdKey]fwdSeen
	ckptStop     chan struct{}
	ckptDone     chan struct{}
	recoveryInfo RecoveryInfo
	verify       verifier // the background verification, see verify.go

	// closeMu orders the reads that reach Pebble or the AOF without mu
	// (a point read after the buffer, a body read, a scan of a segment)
	// against Close: they hold it shared for that access (pin), and Close
	// takes it exclusively before it closes Pebble and the log, so nothing
	// reaches a closed Pebble (which panics). Lock order: closeMu, then mu.
	// No pinned read takes the pin again (an RWMutex with Close waiting
	// would deadlock): internal helpers never pin.
	closeMu     sync.RWMutex
	filesClosed bool // guarded by closeMu: reads return ErrClosed
	closeOnce   sync.Once
	closeErr    error

	// pebbleLog rate-limits Pebble's error lines; failing is set by the
	// first failAsync (pebble_events.go).
	pebbleLog *rateLimitedLog
	failing   atomic.Bool
	// newIndex: Open found no index (or an empty one); rebuilding: the
	// index is being rebuilt from the whole AOF (rebuild.go);
	// rebuildCutShort: the index is a rebuild that did not finish.
	newIndex, rebuilding, rebuildCutShort bool
	// readOnly: Open found no room to write (ErrNoSpace). Pebble is open
	// read-only and the replayed tail lives in the write buffer only.
	readOnly bool
	gate     *compactionGate // the index's compaction scheduler
	// room is the index's write back-pressure (backpressure.go), which
	// writers wait for before they take mu.
	room *indexRoom

	// first is AddReplicaFirst's state (replica_first.go), under mu.
	first firstGuard
}

// RecoveryInfo describes what Open did.
type RecoveryInfo struct {
	// From and To bound the AOF records replayed into the index.
	From, To wal.LSN
	Records  int
	Duration time.Duration
	// Rebuilt: the index was rebuilt from the whole AOF (rebuild.go).
	Rebuilt bool
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
	// Decide before Pebble writes anything: on a full disk a read-write
	// Pebble fails at Open (its MANIFEST), which ends the process.
	// (A new store opens writable whatever the space: there is nothing
	// to read yet, and creating it takes little.)
	free, room := roomToWrite(fs, dir, opts)
	if !room {
		if desc, err := pebble.Peek(fs.PathJoin(dir, indexDir), fs); err != nil || !desc.Exists {
			room = true
		}
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
		pebbleLog:     &rateLimitedLog{l: opts.Logger, every: pebbleLogEvery},
		readOnly:      !room,
		room:          newIndexRoom(int64(opts.MemTableSize), l0StopWrites, opts.Logger),
		nodeNums:      map[string]uint32{},
	}
	s.names.Store(&nodeNames{})
	if err := s.open(); err != nil {
		s.closeFiles()
		if s.readOnly {
			err = fmt.Errorf("%w (%d bytes free, %d needed): %w", ErrNoSpace, free, opts.ReadOnlyBelow, err)
		}
		return nil, err
	}
	if err := s.initFirstGuard(); err != nil { // replica_first.go
		s.closeFiles()
		return nil, err
	}
	if s.readOnly {
		// A store that cannot write is a failed one that still reads:
		// every write refuses, GETJOB hands out durable jobs without
		// recording them, and a server reopens it once there is room.
		s.failed = fmt.Errorf("%w: %d bytes free, %d needed to write", ErrNoSpace, free, opts.ReadOnlyBelow)
		close(s.failedCh)
		s.opts.Logger.Warn("storage: the disk is nearly full: the store is open read-only; it serves reads and refuses writes until it is reopened with room to write",
			"free_bytes", free, "needed_bytes", opts.ReadOnlyBelow, "dir", dir)
	}
	go s.checkpointLoop()
	s.startVerify()
	return s, nil
}

// ErrNoSpace is wrapped (in ErrFailed) by every write to a store that Open
// found without room to write (see Options.ReadOnlyBelow): it serves reads
// only. Reopen it once RoomToWrite reports room.
var ErrNoSpace = errors.New("storage: not enough free disk space to write; the store is read-only")

// roomToWrite measures the free space of the filesystem holding dir against
// opts.ReadOnlyBelow; room when it cannot tell.
func roomToWrite(fs vfs.FS, dir string, opts Options) (free uint64, room bool) {
	if opts.ReadOnlyBelow < 0 {
		return 0, true
	}
	u, err := fs.GetDiskUsage(dir)
	if err != nil {
		return 0, true
	}
	return u.AvailBytes, u.AvailBytes >= uint64(opts.ReadOnlyBelow)
}

// RoomToWrite reports whether a store opened on dir with opts would be
// writable: whether the disk has Options.ReadOnlyBelow free bytes. A server
// whose store is read-only (ErrNoSpace) asks it to know when to reopen.
func RoomToWrite(dir string, opts Options) bool {
	opts.EnsureDefaults()
	_, room := roomToWrite(opts.FS, dir, opts)
	return room
}

// ReadOnly reports whether the store was opened read-only for want of disk
// space (see ErrNoSpace).
func (s *Store) ReadOnly() bool { return s.readOnly }

func (s *Store) open() error {
	fs := s.opts.FS
	start := time.Now()
	var err error
	// The index opens first: its applied LSN tells the AOF which gaps are
	// segments the collector removed (below it) and which would be loss.
	s.fence = newFenceFS(fs)
	popts := &pebble.Options{
		FS:            s.fence,
		DisableWAL:    true,
		MemTableSize:  s.opts.MemTableSize,
		Logger:        pebbleLogger{s: s},
		EventListener: s.eventListener(), // pebble_events.go
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
	// keys: the fewer of them, the fewer times a backlog is rewritten.
	// Pebble compacts L0 once its sublevels reach half this threshold (its
	// score is 2 × depth / threshold). 12 (6 sublevels, against Pebble's 4)
	// cut the CPU per ADDJOB of a growing backlog by about 10%; 24 (12
	// sublevels, a third of the store's stop at l0StopWrites, 36) cut it by
	// another 28% (2M ADDJOBs: 11.9 → 8.5 µs, 364 → 133 MB written by
	// compactions), and it lets a fill of a few hundred thousand jobs
	// wait in L0 until its consumer's tombstones join it, so that one
	// compaction drops both instead of first rewriting the backlog into L6
	// (200k and 400k queued, consumed: 12–69 MB → 0–9 MB written, −13% CPU
	// per job; bench/README.md, "issue 16: L0 compaction threshold").
	// Point reads pay little for the deeper L0 (bloom filters); a fill's
	// scans of queue keys merge up to 12 sublevels.
	popts.L0CompactionThreshold = 24
	// No tombstone-density compactions. A consumed backlog leaves a point
	// tombstone per job key (random keys), so every table a consumer's
	// flush writes is tombstone-dense, and Pebble compacts each such L0
	// table at once with the tables of the level below it overlaps — with
	// random keys, all of them: the backlog is rewritten once per flush of
	// the consume (400k queued jobs: 5 such compactions while it ran). Left
	// in L0, the tombstones go with the next L0 compaction, which drops
	// them with the keys they delete. What they slow until then is scans of
	// job keys (JSCAN, rare): the queue and schedule keys a consumer deletes
	// go as range deletions (write_buffer.go), and a point read steps over
	// a tombstone as over a key.
	popts.Experimental.TombstoneDenseCompactionThreshold = -1
	// Pebble's write stalls are out of reach: a commit waits for a flush
	// or a compaction before it takes the store's locks, never inside
	// Pebble under them (backpressure.go). Its memtable threshold of 2 and
	// the L0 threshold of 36 are the store's.
	popts.MemTableStopWritesThreshold = pebbleMemTableStopWrites
	popts.L0StopWritesThreshold = pebbleL0StopWrites
	// Read-only, Pebble writes nothing: no MANIFEST, no OPTIONS file.
	popts.ReadOnly = s.readOnly
	if err := s.openIndex(popts); err != nil { // rebuild.go
		return err
	}
	s.durableApplied = s.applied
	wopts := s.opts.walOptions()
	wopts.Checkpoint = s.applied
	// A rebuild replays the whole AOF, across the segments removed from
	// it (rebuild.go).
	wopts.AllowGaps = s.rebuilding
	// Read-only, the log is not repaired either (a torn tail is left as it
	// is and the log ends before it): a repair rewrites the segment, which
	// needs the room the disk does not have.
	wopts.ReadOnly = s.readOnly
	if s.log, err = wal.Open(fs.PathJoin(s.dir, walDir), wopts); err != nil {
		return err
	}
	s.logRef.Store(s.log)
	if err := s.checkLiveSegments(); err != nil {
		return err
	}
	if err := s.upgradeIndex(); err != nil { // accounting.go
		return err
	}
	if s.rebuilding {
		err = s.replayAll()
	} else {
		err = s.replay()
	}
	if err != nil {
		return err
	}
	s.lastCkptEnd = s.log.End()
	if s.nodeID == "" && s.readOnly {
		return errors.New("storage: the store has no node id yet")
	}
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
	ver, _ := binary.Uvarint(v)
	switch {
	case s.readOnly:
		// An index that never flushed (nil: the replay rebuilds it all in
		// memory), or of an older format: all read, nothing removed (so its
		// holds' keys are not needed); the mark waits for a writable open,
		// and so does the resume set of an index older than format 6.
		s.noResumeSet = v != nil && ver < 6
	case v == nil:
		// A new index: of this format from the first value written.
		if err := s.db.Set(keyFormat, binary.AppendUvarint(nil, formatVersion), pebble.NoSync); err != nil {
			return err
		}
	case ver >= 1 && ver < formatVersion:
		// An older index, whose values this build still reads: marked in
		// one batch with the keys of its holds, once the log is open.
		s.upgradeFrom = ver
	case ver != formatVersion:
		return fmt.Errorf("storage: index format %d, this build reads 1 to %d", ver, formatVersion)
	}
	s.newIndex = v == nil
	if v, err = s.get(s.db, keyRebuild); err != nil {
		return err
	} else if v != nil {
		s.rebuildCutShort = true
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
	if err := s.loadNodeNames(); err != nil { // nodenames.go
		return err
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
		live, err := decodeSegmentLive(v)
		if err != nil || len(k) != 9 {
			return fmt.Errorf("storage: malformed segment accounting key %x: %v", k, err)
		}
		seg := wal.LSN(binary.BigEndian.Uint64(k[1:]))
		if s.upgradeFrom != 0 && live.holds != nil {
			if s.legacyHolds == nil {
				s.legacyHolds = map[wal.LSN]map[wal.LSN]int64{}
			}
			s.legacyHolds[seg], live.holds = live.holds, nil
		}
		if !live.empty() {
			s.segments[seg] = live
		}
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
		j, err := decodeJob(string(k[1:]), v, s.names.Load())
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
	err := s.log.Replay(from, func(lsn, next wal.LSN, r wal.Record) error {
		o, err := decodeOp(r.Type, r.Payload)
		if err != nil {
			return fmt.Errorf("storage: aof record at lsn %d: %w", lsn, err)
		}
		// A logged add was refused if its id existed (or its id was fresh),
		// and the index has applied nothing at or after from: no lookup.
		o.fresh, o.replay = o.typ == recAdd, true
		old, nj, err := s.resolve(nil, o)
		if err == nil {
			err = s.write(s.buf, o, old, nj, lsn)
		}
		if err != nil {
			return fmt.Errorf("storage: replay lsn %d: %w", lsn, err)
		}
		s.applied = next
		n++
		// Read-only, the tail stays in the buffer (Pebble takes no write).
		if !s.readOnly && (len(s.buf.rangeDels) > 0 || s.buf.bytes >= 8*s.opts.WriteBufferSize) {
			s.waitForIndexRoomToClose() // nobody else holds mu yet
			if err := s.flushBufferLocked(); err != nil {
				return err
			}
		}
		// An index that failed under the replay (an I/O error, fenced)
		// would stall it once its memtables are full: stop.
		if s.fence.fenced() {
			return fmt.Errorf("%w: the index failed during the replay", ErrIndexFailed)
		}
		if time.Since(lastLog) > 2*time.Second {
			lastLog = time.Now()
			s.opts.Logger.Info("storage: replay progress", "lsn", lsn, "to", end, "records", n)
		}
		return nil
	})
	if err == nil && !s.readOnly {
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

// Unsynced returns, after Close, what the store's AOF wrote since its last
// successful fsync if an fsync failed (nil otherwise): pass it to the next
// Open as Options.Rewrite. After a failed fsync the operating system may
// have dropped those pages yet still serve them from its cache, so reopening
// without it could build the index on records that are on no disk.
func (s *Store) Unsynced() *wal.Unsynced {
	if s.log == nil {
		return nil
	}
	return s.log.Unsynced()
}

// RecoveryInfo tells what Open replayed.
func (s *Store) RecoveryInfo() RecoveryInfo { return s.recoveryInfo }

// ErrClosed is returned by operations on a closed store.
var ErrClosed = errors.New("storage: store closed")

// ErrFailed wraps the error that made the store unusable: an AOF write or
// fsync failed, or the index refused a batch. Close and reopen the store to
// recover what was durable.
var ErrFailed = errors.New("storage: store failed earlier; reopen it")

// fenceIndex stops the index from persisting anything more: file
// creation blocks (fence.go) and no compaction starts (compactionGate.hold).
// It takes no lock of the store's: Pebble's callbacks call it.
func (s *Store) fenceIndex(err error) {
	s.fence.fence(err)
	if s.gate != nil {
		s.gate.hold()
	}
}

// pin holds off Close while a read uses Pebble or the log outside mu; it
// returns ErrClosed once Close has begun closing them. Release with unpin.
func (s *Store) pin() error {
	s.closeMu.RLock()
	if s.filesClosed {
		s.closeMu.RUnlock()
		return ErrClosed
	}
	return nil
}

func (s *Store) unpin() { s.closeMu.RUnlock() }

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
	s.fenceIndex(err)
	if s.failed == nil {
		s.failed = err
		close(s.failedCh)
		if errors.Is(err, ErrIndexCorrupt) {
			s.opts.Logger.Error("storage: the index is corrupt: the store refuses writes until the index is rebuilt from the aof (reads go on, but not of the damaged keys)", "err", err)
		} else {
			s.opts.Logger.Error("storage: the store failed: it refuses writes until it is reopened (reads go on)", "err", err)
		}
	}
}

func (s *Store) get(r pebble.Reader, key []byte) ([]byte, error) {
	v, closer, err := r.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, s.indexErr(err)
	}
	out := append([]byte(nil), v...)
	closer.Close()
	return out, nil
}

func (s *Store) getJob(r pebble.Reader, id string) (*Job, error) {
	s.indexGets.Add(1)
	v, closer, err := r.Get(jobKey(id))
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, s.indexErr(err)
	}
	defer closer.Close()
	return decodeJob(id, v, s.names.Load())
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
	j, err = e.decode(id, s.names.Load())
	return j, true, err
}

// scanPrefix calls fn for every key with prefix, in order, in the index as
// it stands (the write buffer over Pebble), holding mu.
func (s *Store) scanPrefix(prefix []byte, fn func(k, v []byte) error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return ErrClosed
	}
	var ferr error
	err := s.scanMerged(prefix, prefixEnd(prefix), false, func(k, v []byte) bool {
		ferr = fn(k, v)
		return ferr == nil
	})
	return errors.Join(ferr, s.indexErr(err))
}

// Checkpoint makes the index durable up to everything applied so far and
// removes the AOF segments that neither the index nor any live body needs.
// After it, a restart replays only what was applied after it.
func (s *Store) Checkpoint() error {
	if err := s.pin(); err != nil {
		return err
	}
	defer s.unpin()
	s.ckptMu.Lock()
	defer s.ckptMu.Unlock()
	s.waitForIndexRoomToClose()
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
	live := s.cloneSegments()
	s.mu.Unlock()
	// The segments this checkpoint removes, and what a replay from the
	// first segment would miss without them, written forward now, so that
	// the index flushed below holds it (a clean restart replays nothing).
	// Those records add no body to a sealed segment: the set stays dead.
	dead := s.deadSegments(applied, live)
	if len(dead) > 0 {
		if err := s.forward(dead); err != nil {
			return err
		}
		s.waitForIndexRoomToClose()
		s.mu.Lock()
		if err := s.flushBufferLocked(); err != nil {
			s.failLocked(err)
			s.mu.Unlock()
			return fmt.Errorf("%w: %w", ErrFailed, err)
		}
		applied = s.applied
		s.mu.Unlock()
	}
	// Flush makes durable every batch applied before it was called; the
	// FlushBegin hook syncs the AOF first.
	if err := s.log.WaitSynced(applied); err != nil {
		s.fail(err)
		return err
	}
	if err := s.flushIndex(); err != nil {
		return err
	}
	s.mu.Lock()
	s.lastCkptEnd = applied
	s.durableApplied = applied
	s.mu.Unlock()
	return s.removeSegments(dead)
}

// flushIndex flushes Pebble's memtables and waits for the flush, or for
// the store to fail: a flush that failed fences the index (fence.go), and
// its retries never end. Pebble's AsyncFlush does not stall (its
// thresholds are out of reach: backpressure.go). Hold no lock of the
// store's but the pin and ckptMu.
func (s *Store) flushIndex() error {
	flushed, err := s.db.AsyncFlush()
	if err != nil {
		return fmt.Errorf("storage: flush index: %w", err)
	}
	select {
	case <-flushed:
		return nil
	case <-s.failedCh:
		// The AOF or the index failed under the flush: the index is
		// fenced and the flush will never complete.
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.usableLocked()
	}
}

// segmentsRemoved is the count of segments checkpoints removed since Open.
func (s *Store) segmentsRemoved() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.collected.SegmentsRemoved
}

// removeSegments removes the dead segments a checkpoint found, once it is
// durable (and what forward wrote for them with it).
func (s *Store) removeSegments(dead []wal.LSN) error {
	if len(dead) == 0 {
		return nil
	}
	var bytes int64
	for _, seg := range s.log.Segments() {
		if slices.Contains(dead, seg.First) {
			bytes += seg.Size
		}
	}
	if err := s.log.RemoveSegments(dead); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.releaseHolds(dead); err != nil {
		s.failLocked(err)
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	s.collected.SegmentsRemoved += int64(len(dead))
	s.collected.BytesReclaimed += bytes
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
	var gone []wal.LSN
	for first, l := range s.segments {
		switch {
		case held[first]:
		case l.bodies > 0 || l.anchors > 0:
			return fmt.Errorf("storage: aof segment %016x.wal is missing but holds %d live job bodies and %d job states",
				uint64(first), l.bodies, l.anchors)
		default:
			// Only deletions that waited for older segments, removed with
			// it by a checkpoint that the index on disk predates.
			gone = append(gone, first)
		}
		for c := range l.holds {
			if !held[c] {
				gone = append(gone, c)
			}
		}
	}
	return s.releaseHolds(gone)
}

func (s *Store) checkpointLoop() {
	defer close(s.ckptDone)
	var tick <-chan time.Time
	if s.opts.CheckpointInterval > 0 {
		t := time.NewTicker(s.opts.CheckpointInterval)
		defer t.Stop()
		tick = t.C
	}
	poisoned := s.log.Poisoned()
	for {
		select {
		case <-s.ckptStop:
			return
		case <-tick:
		case <-s.ckptKick:
		case <-poisoned:
			// The AOF failed on its own (under everysec its fsync runs
			// in the background): fail the store now, not at the next
			// write, so that writes are refused and a server reopens it.
			s.fail(fmt.Errorf("%w: %w", ErrFailed, s.log.Err()))
			poisoned = nil
			continue
		}
		// A failed store said so once: a failed checkpoint a minute is noise.
		if err := s.Checkpoint(); err != nil && !errors.Is(err, ErrClosed) && !errors.Is(err, ErrFailed) {
			s.opts.Logger.Error("storage: checkpoint failed", "err", err)
		}
	}
}

// Close checkpoints (so the next Open replays nothing), then closes the index
// and the AOF. It runs every step and returns the first error. After a failure
// it skips the checkpoint: the next Open recovers from the log. Reads and
// operations running meanwhile finish first or return ErrClosed, as does
// everything after it; Close may be called more than once, concurrently too.
func (s *Store) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.close() })
	return s.closeErr
}

// maxCloseCheckpoints bounds the checkpoints a close runs (see close).
const maxCloseCheckpoints = 4

func (s *Store) close() error {
	s.mu.Lock()
	failed := s.failed
	s.mu.Unlock()
	close(s.ckptStop)
	<-s.ckptDone
	s.stopVerify()
	var errs []error
	if failed == nil {
		// A checkpoint that removed segments leaves the release of the
		// holds on them (and their accounting) in the write buffer, for
		// the next checkpoint to flush. At close there is no next one: the
		// index would close with deletion keys waiting for segments the
		// log no longer has — Open releases them again, but Check of the
		// stopped directory counts them as pending. Another checkpoint
		// flushes the release, and may find the deletions' own segments
		// dead now; a few rounds, then Open finishes what is left.
		var err error
		for range maxCloseCheckpoints {
			removed := s.segmentsRemoved()
			if err = s.Checkpoint(); err != nil || s.segmentsRemoved() == removed {
				break
			}
		}
		errs = append(errs, err)
	}
	// Operations (which check closed under mu) refuse from here on; then
	// the reads that reach Pebble or the log without mu drain.
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	// A fenced index's blocked flush or compaction may hold a read here
	// (CompactOrderIndex waits for its compaction): let them fail first.
	s.fence.release()
	s.closeMu.Lock()
	s.filesClosed = true
	s.closeMu.Unlock()
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
		errs = append(errs, s.closeIndex())
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

// closeIndex closes Pebble. Its Close waits for its flush and compactions,
// which a fenced index holds blocked (fence.go) until the fence is
// released; so may the measuring goroutine's Metrics (a MANIFEST write):
// the fence goes first.
func (s *Store) closeIndex() error {
	s.fence.release()
	s.room.stopMeasuring()
	return s.db.Close()
}

// setNodeID records the store's node id.
func (s *Store) setNodeID(id string) {
	s.nodeID = id
	cur := s.names.Load()
	s.names.Store(&nodeNames{self: []string{id}, ids: cur.ids})
}
