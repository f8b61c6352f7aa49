package wal

import (
	"errors"
	"fmt"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
)

// Log is an open AOF. See the package documentation for its guarantees.
type Log struct {
	opts Options
	dir  string

	// mu guards everything below it. Lock order: Log.mu is taken after
	// every lock of the log's callers (LOCKS.md), and only keptMu is taken
	// under it; the writer goroutine never holds it while doing I/O, and
	// the waits on cond release it.
	mu   sync.Mutex
	cond *sync.Cond // broadcast when written, synced, pending or err change
	// segs are the segments in log order; the last is the active one. A
	// segment queued for creation is added by the writer once it exists.
	segs []segment
	// pending holds frames appended but not yet handed to the writer, split
	// where the log rolls to a new segment.
	pending      []chunk
	pendingBytes int
	// tail is the end of the log including pending frames; activeEnd is
	// where the active segment will end once pending frames reach it.
	tail      LSN
	activeEnd LSN
	// activeFirst and activeSalt are the first LSN and the salt of the
	// segment pending frames go to (frames are bound to both).
	activeFirst LSN
	activeSalt  uint64
	// spans are the LSN ranges of every segment, including those queued
	// for creation, so SegmentOf can place any enqueued record and tell a
	// removed segment from a held one.
	spans      []span
	written    LSN // frames below are in the OS (write(2) returned)
	synced     LSN // frames below are durable (fsync returned)
	syncWanted LSN // Sync callers want at least this much durable
	// marked is the highest synced LSN a sync mark enqueued so far states.
	marked LSN
	// policy is the fsync policy in effect: Options.Sync, then SetSync's.
	policy SyncPolicy
	// lazyEnd: every record below it was written by a flush under a policy
	// that acknowledges on write (everysec, no), so Wait returns for it
	// once written, and after a failed fsync Unsynced keeps it for a
	// rewrite. Records a flush under SyncAlways wrote are acknowledged only
	// once fsynced.
	lazyEnd LSN
	err     error
	// syncFailed: the poisoning error was an fsync's (or a roll's), so the
	// written bytes after synced may not be on disk whatever the page cache
	// says.
	syncFailed bool
	closed     bool
	// poisoned is closed when err is first set by a failure (Poisoned).
	poisoned chan struct{}

	kick    chan struct{} // wakes the writer; capacity 1
	stop    chan struct{}
	done    chan struct{} // closed when the writer goroutine exits
	tickerD chan struct{} // closed when the everysec goroutine exits
	syncNow chan struct{} // asks the everysec goroutine to fsync now; capacity 1

	// free holds chunk buffers the writer has written, for reuse, so that a
	// busy log does not allocate and grow a buffer for every group.
	free [][]byte

	// The writer goroutine alone uses these.
	active vfs.File

	readers readerCache

	// keptMu guards kept: the bytes written since the last fsync that
	// covered them — the log's own copy of [kept.from, written) — so that a
	// failed fsync can be repaired by writing them again (Unsynced). The
	// writer copies into it without holding mu. Lock order: mu, then
	// keptMu.
	keptMu sync.Mutex
	kept   keptBytes
	// tail0 is what a read-only Open found at the end of the last segment.
	tail0 TailState

	// fsyncs counts the fsyncs of segments (metrics).
	fsyncs atomic.Int64
}

// span is the LSN range of one segment; end is 0 while the segment can
// still grow (the active one, or one queued for creation).
type span struct {
	first, end LSN
}

// chunk is a run of frames bound for one segment.
type chunk struct {
	first LSN // LSN of the first frame in data
	// newSegment means the log rolls before writing data: the previous
	// segment is fsynced and a segment starting at first, with salt, is
	// created.
	newSegment bool
	salt       uint64
	data       []byte
}

// Open opens the log in dir, creating dir and the first segment if needed,
// and recovers the last segment (see the package doc): a torn unsynced tail is
// cut off, damage in its durable part is refused with a DamageError. A
// refused Open changes nothing on disk.
func Open(dir string, opts Options) (*Log, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	fs := opts.FS
	if opts.ReadOnly {
		if _, err := fs.Stat(dir); err != nil {
			return nil, fmt.Errorf("wal: open %s read-only: %w", dir, err)
		}
	} else if err := durable.MkdirAll(fs, dir); err != nil {
		return nil, fmt.Errorf("wal: create %s: %w", dir, err)
	}
	segs, stale, err := listSegments(fs, dir)
	if err != nil {
		return nil, err
	}
	l := &Log{
		opts:     opts,
		dir:      dir,
		kick:     make(chan struct{}, 1),
		poisoned: make(chan struct{}),
		stop:     make(chan struct{}),
		done:     make(chan struct{}),
		tickerD:  make(chan struct{}),
		syncNow:  make(chan struct{}, 1),
	}
	l.cond = sync.NewCond(&l.mu)
	l.readers = readerCache{fs: fs, dir: dir, files: map[LSN]vfs.File{}, removed: map[LSN]bool{}}

	if segs, err = l.recover(segs, stale); err != nil {
		return nil, err
	}
	l.segs = segs
	for i, s := range segs {
		sp := span{first: s.first}
		if i < len(segs)-1 {
			sp.end = s.end()
		}
		l.spans = append(l.spans, sp)
	}
	last := segs[len(segs)-1]
	l.tail, l.activeEnd, l.activeFirst, l.activeSalt = last.end(), last.end(), last.first, last.salt
	l.written, l.synced, l.syncWanted = l.tail, l.tail, l.tail
	l.policy, l.lazyEnd = opts.Sync, l.tail
	// Everything below tail is durable (Open fsynced it), and the first
	// record appended says so with a mark.
	l.marked = last.first
	l.kept.from = l.tail

	if opts.ReadOnly {
		close(l.done)
		close(l.tickerD)
		l.closedWriter()
		return l, nil
	}
	go l.writeLoop()
	// The everysec loop runs whatever the policy: SetSync may switch to
	// everysec at any time, and under the others its ticks do nothing.
	go l.syncLoop()
	return l, nil
}

// TailState is what a read-only Open found at the end of the last segment
// and left as it is: a torn tail (which a read-write Open would cut), or
// damage in its durable part (which a read-write Open refuses; the whole
// segment is then shown).
type TailState struct {
	TornOffset, TornBytes int64
	Damage                *DamageError
}

// Tail returns what a read-only Open found at the end of the log.
func (l *Log) Tail() TailState { return l.tail0 }

// closedWriter makes a read-only log refuse writes.
func (l *Log) closedWriter() { l.err = ErrReadOnly }

// recover checks the segments found in the directory and makes the last one
// ready for appending: it rewrites what a failed fsync left in memory
// (Options.Rewrite), cuts a torn tail, opens the active segment — a new one
// when the directory is empty or the last segment is of an older format —
// and fsyncs it. Every check that can refuse comes before the first change.
func (l *Log) recover(segs []segment, stale []string) ([]segment, error) {
	opts, fs, dir := l.opts, l.opts.FS, l.dir
	if len(segs) == 0 {
		if opts.Checkpoint > 0 {
			return nil, fmt.Errorf("%w: %s holds no segment, but the log's owner has applied it up to lsn %d",
				ErrCorrupt, dir, opts.Checkpoint)
		}
		if opts.ReadOnly {
			return []segment{{first: 0, version: formatVersion}}, nil
		}
		if err := removeStale(fs, dir, stale); err != nil {
			return nil, err
		}
		salt := newSalt()
		f, err := createSegment(fs, dir, 0, salt)
		if err != nil {
			return nil, err
		}
		l.active = f
		return []segment{{first: 0, version: formatVersion, salt: salt}}, nil
	}
	gapsTo := opts.Checkpoint
	if opts.AllowGaps {
		gapsTo = ^LSN(0)
	}
	if err := checkContiguous(segs, gapsTo); err != nil {
		return nil, err
	}
	last := &segs[len(segs)-1]
	var plan tailPlan
	var err error
	var rewrite []byte // the last segment as a failed fsync's kept bytes make it
	if opts.Rewrite != nil && !opts.ReadOnly {
		if rewrite, err = rewritten(fs, dir, *last, opts.Rewrite); err != nil {
			return nil, err
		}
	}
	if rewrite != nil {
		// Decided on the rewritten bytes, before they are written.
		last.size = int64(len(rewrite)) - last.hdr()
		plan, err = planWhole(*last, rewrite, opts.Checkpoint)
	} else {
		plan, err = planTail(fs, dir, *last, opts.Checkpoint)
	}
	var de *DamageError
	if opts.ReadOnly && errors.As(err, &de) {
		// Read-only: report it, and show the whole segment to whoever
		// checks it.
		l.tail0 = TailState{Damage: de}
		return segs, nil
	}
	if err != nil {
		return nil, err
	}
	if opts.ReadOnly {
		last.size = plan.keep
		if plan.torn() {
			l.tail0 = TailState{TornOffset: last.fileOffset(last.first + LSN(plan.keep)), TornBytes: plan.size - plan.keep}
			opts.Logger.Warn("wal: torn tail (read-only: left as it is)", "segment", segmentName(last.first),
				"offset", l.tail0.TornOffset, "torn_bytes", l.tail0.TornBytes)
		}
		return segs, nil
	}
	if err := removeStale(fs, dir, stale); err != nil {
		return nil, err
	}
	if rewrite != nil {
		name := segmentName(last.first)
		if err := writeFileAtomic(fs, dir, name, rewrite[:last.hdr()+plan.keep]); err != nil {
			return nil, fmt.Errorf("wal: rewrite segment %s after a failed fsync: %w", name, err)
		}
		opts.Logger.Info("wal: wrote again what was written after the last successful fsync",
			"segment", name, "from_lsn", opts.Rewrite.Synced, "bytes", len(opts.Rewrite.Data))
		plan = tailPlan{size: plan.keep, keep: plan.keep}
	}
	if err := plan.apply(fs, dir, *last, opts.Logger); err != nil {
		return nil, err
	}
	last.size = plan.keep
	name := segmentName(last.first)
	f, err := openForAppend(fs, dir, name)
	if err != nil {
		return nil, err
	}
	// What the last segment holds may be only in the page cache (the
	// process crashed, the machine did not). It is about to be treated as
	// durable — the index may checkpoint past it — so make it so.
	if err := f.Sync(); err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: fsync segment %s: %w", name, err)
	}
	if last.version == formatVersion {
		l.active = f
		return segs, nil
	}
	// An older format's segment is sealed as it is; new frames go to a
	// segment of this build's format.
	if err := f.Close(); err != nil {
		return nil, fmt.Errorf("wal: close segment %s: %w", name, err)
	}
	next := segment{first: last.end(), version: formatVersion, salt: newSalt()}
	if l.active, err = createSegment(fs, dir, next.first, next.salt); err != nil {
		return nil, err
	}
	return append(segs, next), nil
}

// checkContiguous verifies that every segment but the last ends where the next
// begins, except for gaps that end at or before checkpoint (segments the
// owner removed on purpose, see RemoveSegments). Any other gap means a lost
// or truncated segment in the middle of the log.
func checkContiguous(segs []segment, checkpoint LSN) error {
	for i := 0; i+1 < len(segs); i++ {
		s, next := segs[i], segs[i+1]
		if s.size < 0 {
			return fmt.Errorf("%w: segment %s is shorter than its header", ErrCorrupt, segmentName(s.first))
		}
		if s.end() < next.first && next.first <= checkpoint {
			continue
		}
		if s.end() != next.first {
			return fmt.Errorf("%w: segment %s ends at lsn %d but %s begins at %d",
				ErrCorrupt, segmentName(s.first), s.end(), segmentName(next.first), next.first)
		}
	}
	return nil
}

// Enqueue queues records for writing, in order, and returns the LSN of the
// first and the end of the last. The records follow each other, but a sync
// mark may sit before the first (and only there). It performs no I/O (it
// blocks only while more than MaxPending bytes wait for the writer), so a
// caller may hold its own lock to fix the order of records. Wait(end) then
// waits for the records per the sync policy.
func (l *Log) Enqueue(recs ...Record) (first, end LSN, err error) {
	size := int64(0)
	for _, r := range recs {
		if len(r.Payload) > MaxPayload {
			return 0, 0, errTooLarge
		}
		if r.Type == 0 || r.Type == MarkType {
			return 0, 0, fmt.Errorf("wal: record type %d is reserved", r.Type)
		}
		size += frameSize(len(r.Payload))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for l.err == nil && !l.closed && l.pendingBytes > 0 && l.pendingBytes+int(size) > l.opts.MaxPending {
		l.cond.Wait()
	}
	if err := l.errLocked(); err != nil {
		return 0, 0, err
	}
	if len(recs) > 0 && l.synced > l.marked && !l.rollsLocked(frameSize(markPayloadSize)+frameSize(len(recs[0].Payload))) {
		// The durable prefix grew since the last mark: say so in the log,
		// so recovery can tell damage there from a torn tail. (Not when the
		// records roll the log: the roll fsyncs the segment the mark would
		// end, and a mark belongs before records in its own segment.)
		l.appendLocked(func(dst []byte, salt uint64, lsn LSN) []byte {
			return appendMark(dst, l.synced, salt, lsn)
		}, frameSize(markPayloadSize))
		l.marked = l.synced
	}
	first = l.tail
	for _, r := range recs {
		l.appendLocked(func(dst []byte, salt uint64, lsn LSN) []byte {
			return appendFrame(dst, r, salt, lsn)
		}, frameSize(len(r.Payload)))
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return first, l.tail, nil
}

// appendLocked appends one frame of size fs, encoded by enc at the tail,
// rolling to a new segment first if the active one would grow past
// SegmentSize.
func (l *Log) appendLocked(enc func(dst []byte, salt uint64, lsn LSN) []byte, fs int64) {
	roll := l.rollsLocked(fs)
	if roll {
		l.spans[len(l.spans)-1].end = l.tail
		l.activeFirst, l.activeEnd, l.activeSalt = l.tail, l.tail, newSalt()
		l.spans = append(l.spans, span{first: l.tail})
	}
	if roll || len(l.pending) == 0 {
		l.pending = append(l.pending, chunk{first: l.tail, newSegment: roll, salt: l.activeSalt, data: l.takeBuffer()})
	}
	c := &l.pending[len(l.pending)-1]
	c.data = enc(c.data, l.activeSalt, l.tail)
	l.tail += LSN(fs)
	l.activeEnd += LSN(fs)
	l.pendingBytes += int(fs)
}

// rollsLocked reports whether fs more bytes make the log roll to a new
// segment: the active one holds something and would grow past SegmentSize.
func (l *Log) rollsLocked(fs int64) bool {
	activeSize := int64(l.activeEnd - l.activeFirst)
	return activeSize > 0 && activeSize+fs > l.opts.SegmentSize
}

func (l *Log) errLocked() error {
	if l.err != nil {
		return l.err
	}
	if l.closed {
		return ErrClosed
	}
	return nil
}

// Wait blocks until every record below end is written, and, if the writer
// wrote it under SyncAlways, also fsynced.
func (l *Log) Wait(end LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	for {
		if l.synced >= end || l.lazyEnd >= end {
			return nil
		}
		if l.err != nil {
			return l.err
		}
		l.cond.Wait()
	}
}

// SetSync switches the fsync policy of the running log. Records the writer
// takes after the switch follow the new policy. A switch to SyncAlways, and
// one away from SyncEverySec, first fsyncs everything appended so far: once
// SetSync returns, under always every record whose Wait returned is durable,
// and the fsync everysec still owed is not lost. The policy is set even if
// that fsync fails (its error is returned: the log is poisoned then, see
// Err). On a read-only or closed log SetSync only records the policy.
func (l *Log) SetSync(p SyncPolicy) error {
	if p > SyncNever {
		return fmt.Errorf("wal: unknown sync policy %d", p)
	}
	l.mu.Lock()
	old := l.policy
	l.policy = p
	idle := l.opts.ReadOnly || l.closed
	l.cond.Broadcast()
	l.mu.Unlock()
	if idle || old == p || p != SyncAlways && old != SyncEverySec {
		return nil
	}
	return l.Sync()
}

// SyncPolicy returns the fsync policy in effect.
func (l *Log) SyncPolicy() SyncPolicy {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.policy
}

// Append writes records and waits for them per the sync policy. It returns the
// LSN of the first record and the end of the last.
func (l *Log) Append(recs ...Record) (first, end LSN, err error) {
	first, end, err = l.Enqueue(recs...)
	if err != nil {
		return 0, 0, err
	}
	return first, end, l.Wait(end)
}

// WaitSynced makes every record below end durable, whatever the policy, and
// waits for it. Concurrent callers share fsyncs.
func (l *Log) WaitSynced(end LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if end > l.tail {
		end = l.tail
	}
	if l.synced >= end {
		return nil
	}
	if end > l.syncWanted {
		l.syncWanted = end
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	for l.synced < end && l.err == nil {
		l.cond.Wait()
	}
	if l.synced >= end {
		return nil
	}
	return l.err
}

// Sync makes every record appended so far durable.
func (l *Log) Sync() error {
	l.mu.Lock()
	end := l.tail
	l.mu.Unlock()
	return l.WaitSynced(end)
}

// End returns the LSN the next record will get (or its sync mark).
func (l *Log) End() LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tail
}

// Written returns the end of what the log has handed to the operating system
// (write(2) returned), what a filesystem's free space already reflects, and
// the end of the log (End), read together: end minus written is queued and
// not yet written.
func (l *Log) Written() (written, end LSN) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.written, l.tail
}

// Durable returns the end of the durable prefix of the log.
func (l *Log) Durable() LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.synced
}

// Fsyncs returns how many times the log has fsynced a segment since Open.
func (l *Log) Fsyncs() int64 { return l.fsyncs.Load() }

// First returns the LSN of the oldest record still held.
func (l *Log) First() LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.segs[0].first
}

// SegmentInfo describes one segment file, for accounting and inspection.
type SegmentInfo struct {
	First LSN
	Size  int64 // bytes of frames written so far
	Name  string
	// Version is the segment's format (1 or 2).
	Version int
}

// Segments lists the segments in log order.
func (l *Log) Segments() []SegmentInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]SegmentInfo, len(l.segs))
	for i, s := range l.segs {
		out[i] = SegmentInfo{First: s.first, Size: s.size, Name: segmentName(s.first), Version: int(s.version)}
	}
	return out
}

// SegmentOf returns the first LSN of the segment holding (or, for a record
// still pending, bound to hold) lsn; false if lsn is below the first
// segment still held or in a segment removed from the middle of the log.
func (l *Log) SegmentOf(lsn LSN) (LSN, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := sort.Search(len(l.spans), func(i int) bool { return l.spans[i].first > lsn }) - 1
	if i < 0 {
		return 0, false
	}
	if sp := l.spans[i]; sp.end != 0 && lsn >= sp.end {
		return 0, false // in the gap a removed segment left
	}
	return l.spans[i].first, true
}

// writeLoop is the single writer: it takes every pending chunk, writes them,
// fsyncs if the policy or a Sync caller asks, and publishes the new positions.
func (l *Log) writeLoop() {
	defer close(l.done)
	for {
		select {
		case <-l.kick:
		case <-l.stop:
			l.flushPending()
			return
		}
		// Kicked by the first record of a burst: let the goroutines
		// already runnable (clients whose commands arrived with it) queue
		// theirs first, so that one write takes them all — as Disque's
		// event loop writes its AOF once per pass over its ready clients.
		// With nothing else runnable this returns at once.
		runtime.Gosched()
		l.flushPending()
	}
}

// flushPending writes what is pending and syncs as needed. Errors poison the
// log.
func (l *Log) flushPending() {
	l.mu.Lock()
	chunks := l.pending
	l.pending = nil
	if l.err != nil {
		// After a failed write or fsync nothing more is written: the file's
		// state is unknown, and later frames would land at the wrong offsets.
		for _, c := range chunks {
			l.pendingBytes -= len(c.data)
		}
		l.cond.Broadcast()
		l.mu.Unlock()
		return
	}
	size := 0
	for _, c := range chunks {
		size += len(c.data)
	}
	// Past MaxUnsynced written bytes the writer fsyncs whatever the policy:
	// it keeps them in memory until then (see Unsynced).
	l.keptMu.Lock()
	keptN := l.kept.n
	l.keptMu.Unlock()
	policy := l.policy
	wantSync := policy == SyncAlways || l.syncWanted > l.synced ||
		keptN+size > l.opts.MaxUnsynced
	if policy == SyncEverySec && keptN+size > l.opts.MaxUnsynced/2 {
		// The background fsync, early: the writer goes on meanwhile.
		select {
		case l.syncNow <- struct{}{}:
		default:
		}
	}
	activeFirst := l.segs[len(l.segs)-1].first
	l.mu.Unlock()

	var err error
	syncErr := false
	var newSegs []segment
	// ends records where each segment written to now ends: one flush may
	// finish the old segment and start new ones.
	var ends []segment
	written := LSN(0)
	// done is how many chunks were written whole; rolled is the last one
	// that began a segment (the ones before it are durable: the roll
	// fsynced their segment).
	done, rolled := 0, 0
	for i, c := range chunks {
		if c.newSegment {
			var synced bool
			synced, err = l.roll(c.first, c.salt)
			if synced {
				rolled = i
			}
			if err != nil {
				syncErr = !synced
				break
			}
			newSegs = append(newSegs, segment{first: c.first, version: formatVersion, salt: c.salt})
			activeFirst = c.first
		}
		if _, err = l.active.Write(c.data); err != nil {
			err = fmt.Errorf("wal: write segment: %w", err)
			break
		}
		written = c.first + LSN(len(c.data))
		ends = append(ends, segment{first: activeFirst, size: int64(written - activeFirst)})
		done++
	}
	synced := false
	if err == nil && (wantSync || len(newSegs) > 0 && policy == SyncAlways) {
		l.fsyncs.Add(1)
		if err = l.active.Sync(); err != nil {
			err = fmt.Errorf("wal: fsync segment: %w", err)
			syncErr = true
		} else {
			synced = true
		}
	}

	// What was written and is not known durable is kept, copied outside
	// mu so that appends go on meanwhile: the chunks written whole since
	// the last roll (which fsynced the ones before and reset what was kept).
	keep := chunks[min(rolled, done):done]
	if !synced {
		l.keepChunks(keep)
	}

	l.mu.Lock()
	defer l.mu.Unlock()
	// Account new segments and bytes even on error, so the list matches disk.
	l.segs = append(l.segs, newSegs...)
	for _, e := range ends {
		for i := len(l.segs) - 1; i >= 0; i-- {
			if l.segs[i].first == e.first {
				l.segs[i].size = e.size
				break
			}
		}
	}
	if written > l.written {
		l.written = written
	}
	if policy != SyncAlways && written > l.lazyEnd {
		l.lazyEnd = written // acknowledged once written
	}
	switch {
	case synced && l.err == nil:
		l.synced = l.written
		l.keptMu.Lock()
		l.kept.reset(l.written)
		l.keptMu.Unlock()
	case synced:
		// This fsync succeeded, but another one (the everysec handle's)
		// failed meanwhile: the file cannot be trusted past the durable end
		// it left, and what this flush wrote is kept like the rest.
		l.keepChunks(keep)
	}
	for _, c := range chunks {
		l.pendingBytes -= len(c.data)
		l.giveBuffer(c.data)
	}
	if err != nil && l.err == nil {
		l.poisonLocked(err, syncErr)
	}
	l.cond.Broadcast()
}

// keepChunks adds the chunks' bytes to what is kept until an fsync covers
// them (see Unsynced), with mu held or not (lock order: mu, then keptMu).
func (l *Log) keepChunks(cs []chunk) {
	l.keptMu.Lock()
	defer l.keptMu.Unlock()
	for _, c := range cs {
		l.kept.add(c.data)
	}
}

// roll fsyncs and closes the active segment and creates the next one. synced
// reports whether the old segment's fsync succeeded.
func (l *Log) roll(first LSN, salt uint64) (synced bool, err error) {
	l.fsyncs.Add(1)
	if err := l.active.Sync(); err != nil {
		return false, fmt.Errorf("wal: fsync segment before roll: %w", err)
	}
	err = l.active.Close()
	l.active = nil // closed even if Close failed; Log.Close must not close it again
	// Everything before first is in segments that are now all fsynced.
	l.mu.Lock()
	if l.err == nil { // after a failed fsync, no later one is trusted
		l.synced = max(l.synced, first)
		l.keptMu.Lock()
		l.kept.reset(first)
		l.keptMu.Unlock()
	}
	l.mu.Unlock()
	if err != nil {
		return true, fmt.Errorf("wal: close segment: %w", err)
	}
	f, err := createSegment(l.opts.FS, l.dir, first, salt)
	if err != nil {
		return true, err
	}
	l.active = f
	return true, nil
}

// syncLoop drives SyncEverySec (and idles under the other policies).
func (l *Log) syncLoop() {
	defer close(l.tickerD)
	t := time.NewTicker(l.opts.SyncInterval)
	defer t.Stop()
	var h syncHandle
	defer h.close()
	for {
		select {
		case <-t.C:
			l.syncInBackground(&h)
		case <-l.syncNow:
			l.syncInBackground(&h)
		case <-l.stop:
			return
		}
	}
}

// syncHandle is the everysec loop's own read-only handle on the active
// segment. fsync through it makes the segment's written data durable without
// stopping the writer: appends go on while the disk syncs.
type syncHandle struct {
	first LSN
	f     vfs.File
}

func (h *syncHandle) close() {
	if h.f != nil {
		h.f.Close()
		h.f = nil
	}
}

// syncInBackground fsyncs what is written of the active segment. Everything
// before the active segment was fsynced when the log rolled past it.
func (l *Log) syncInBackground(h *syncHandle) {
	l.mu.Lock()
	target := l.written
	first := l.segs[len(l.segs)-1].first // the segment holding written's end
	skip := target <= l.synced || l.err != nil || l.closed || l.policy != SyncEverySec
	l.mu.Unlock()
	if h.f != nil && h.first != first {
		h.close() // a sealed segment's: it may be removed, and must not be held open
	}
	if skip {
		return
	}
	if h.f == nil || h.first != first {
		h.close()
		f, err := l.opts.FS.Open(l.opts.FS.PathJoin(l.dir, segmentName(first)))
		if err != nil {
			l.poison(fmt.Errorf("wal: open segment %s to fsync: %w", segmentName(first), err), true)
			return
		}
		h.f, h.first = f, first
	}
	l.fsyncs.Add(1)
	if err := h.f.Sync(); err != nil {
		l.poison(fmt.Errorf("wal: fsync segment: %w", err), true)
		return
	}
	l.mu.Lock()
	if target > l.synced && l.err == nil { // after a failed fsync, no later one is trusted
		l.synced = target
		l.keptMu.Lock()
		l.kept.dropTo(target) // bytes written while the fsync ran stay kept
		l.keptMu.Unlock()
		l.markIdleLocked()
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// markIdleLocked appends a sync mark for what the last fsync made durable,
// if no record follows to carry one: otherwise damage to the last records
// before an idle spell, fsynced but stated durable by no mark, would be
// taken for a torn tail at the next Open. The mark need not be durable to
// be right. Not when it would roll the log.
func (l *Log) markIdleLocked() {
	if l.synced <= l.marked || l.err != nil || l.closed || l.rollsLocked(frameSize(markPayloadSize)) {
		return
	}
	l.appendLocked(func(dst []byte, salt uint64, lsn LSN) []byte {
		return appendMark(dst, l.synced, salt, lsn)
	}, frameSize(markPayloadSize))
	l.marked = l.synced
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// poison makes every later call fail with err (see ErrPoisoned).
func (l *Log) poison(err error, syncErr bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.poisonLocked(err, syncErr)
	}
	l.cond.Broadcast()
}

func (l *Log) poisonLocked(err error, syncErr bool) {
	l.err = fmt.Errorf("%w: %w", ErrPoisoned, err)
	l.syncFailed = syncErr
	close(l.poisoned)
	l.opts.Logger.Error("wal: log poisoned", "err", err)
}

// Poisoned returns a channel closed when a write or fsync fails (see
// ErrPoisoned): an owner that does not write for a while (under everysec
// the fsync runs on its own) still learns of it at once. Err says why.
func (l *Log) Poisoned() <-chan struct{} { return l.poisoned }

// Err returns the error that poisoned the log, or nil.
func (l *Log) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.opts.ReadOnly {
		return nil
	}
	return l.err
}

// Close writes and fsyncs everything appended, then closes the files. It is
// safe to call more than once.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	ro := l.opts.ReadOnly
	l.mu.Unlock()
	if !ro {
		// Everything is made durable, then a mark says so (and is made
		// durable too): damage to the last records is then corruption,
		// not a torn tail, at the next Open.
		_ = l.Sync()
		l.mu.Lock()
		l.markIdleLocked()
		l.mu.Unlock()
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.syncWanted = l.tail
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	var errs []error
	if !ro {
		close(l.stop)
		<-l.done
		<-l.tickerD
		l.mu.Lock()
		errs = append(errs, l.err)
		l.mu.Unlock()
	}
	if l.active != nil { // nil if a roll failed after closing it
		errs = append(errs, l.active.Close())
	}
	errs = append(errs, l.readers.closeAll())
	for _, e := range errs {
		if e != nil {
			return e
		}
	}
	return nil
}

// maxFreeBuffers bounds the recycled chunk buffers; buffers larger than
// maxFreeBufferSize (a burst) are left to the garbage collector.
const (
	maxFreeBuffers    = 4
	maxFreeBufferSize = 4 << 20
)

// takeBuffer returns an empty buffer for a new chunk. Called with l.mu held.
func (l *Log) takeBuffer() []byte {
	if n := len(l.free); n > 0 {
		b := l.free[n-1]
		l.free = l.free[:n-1]
		return b
	}
	return make([]byte, 0, 64<<10)
}

// giveBuffer returns a written chunk's buffer for reuse. Called with l.mu
// held, after the write: nothing refers to its contents any more.
func (l *Log) giveBuffer(b []byte) {
	if len(l.free) < maxFreeBuffers && cap(b) <= maxFreeBufferSize {
		l.free = append(l.free, b[:0])
	}
}

var errNoUnsyncedSegment = errors.New("wal: the segment a failed fsync left unsynced data in is gone")
