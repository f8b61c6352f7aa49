package wal

import (
	"errors"
	"fmt"
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

	// mu guards everything below it. Lock order: Log.mu is a leaf; the writer
	// goroutine never holds it while doing I/O.
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
	// activeFirst is the first LSN of the segment pending frames go to.
	activeFirst LSN
	// starts are the first LSNs of every segment, including those queued for
	// creation, so SegmentOf can place any enqueued record.
	starts     []LSN
	written    LSN // frames below are in the OS (write(2) returned)
	synced     LSN // frames below are durable (fsync returned)
	syncWanted LSN // Sync callers want at least this much durable
	err        error
	closed     bool

	kick    chan struct{} // wakes the writer; capacity 1
	stop    chan struct{}
	done    chan struct{} // closed when the writer goroutine exits
	tickerD chan struct{} // closed when the everysec goroutine exits

	// free holds chunk buffers the writer has written, for reuse, so that a
	// busy log does not allocate and grow a buffer for every group.
	free [][]byte

	// The writer goroutine alone uses these.
	active vfs.File

	readers readerCache

	// fsyncs counts the fsyncs of segments (metrics).
	fsyncs atomic.Int64
}

// chunk is a run of frames bound for one segment.
type chunk struct {
	first LSN // LSN of the first frame in data
	// newSegment means the log rolls before writing data: the previous
	// segment is fsynced and a segment starting at first is created.
	newSegment bool
	data       []byte
}

// Open opens the log in dir, creating dir and the first segment if needed,
// and repairs a torn tail of the last segment (see the package doc).
func Open(dir string, opts Options) (*Log, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	fs := opts.FS
	if err := durable.MkdirAll(fs, dir); err != nil {
		return nil, fmt.Errorf("wal: create %s: %w", dir, err)
	}
	segs, err := listSegments(fs, dir)
	if err != nil {
		return nil, err
	}
	l := &Log{
		opts:    opts,
		dir:     dir,
		kick:    make(chan struct{}, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		tickerD: make(chan struct{}),
	}
	l.cond = sync.NewCond(&l.mu)
	l.readers = readerCache{fs: fs, dir: dir, files: map[LSN]vfs.File{}}

	if len(segs) == 0 {
		f, err := createSegment(fs, dir, 0)
		if err != nil {
			return nil, err
		}
		l.active = f
		segs = []segment{{first: 0}}
	} else {
		if err := checkContiguous(segs, opts.Checkpoint); err != nil {
			return nil, err
		}
		last := &segs[len(segs)-1]
		size, err := repairTail(fs, dir, *last, int64(opts.Checkpoint)-int64(last.first), opts.Logger)
		if err != nil {
			return nil, err
		}
		last.size = size
		f, err := openForAppend(fs, dir, segmentName(last.first))
		if err != nil {
			return nil, err
		}
		// What the last segment holds may be only in the page cache (the
		// process crashed, the machine did not). It is about to be treated
		// as durable — the index may checkpoint past it — so make it so.
		if err := f.Sync(); err != nil {
			f.Close()
			return nil, fmt.Errorf("wal: fsync segment %s: %w", segmentName(last.first), err)
		}
		l.active = f
	}
	l.segs = segs
	for _, s := range segs {
		l.starts = append(l.starts, s.first)
	}
	last := segs[len(segs)-1]
	l.tail, l.activeEnd, l.activeFirst = last.end(), last.end(), last.first
	l.written, l.synced, l.syncWanted = l.tail, l.tail, l.tail

	go l.writeLoop()
	if opts.Sync == SyncEverySec {
		go l.syncLoop()
	} else {
		close(l.tickerD)
	}
	return l, nil
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
// first and the end of the last; the records are contiguous. It performs no
// I/O (it blocks only while more than MaxPending bytes wait for the writer),
// so a caller may hold its own lock to fix the order of records. Wait(end)
// then waits for the records per the sync policy.
func (l *Log) Enqueue(recs ...Record) (first, end LSN, err error) {
	size := int64(0)
	for _, r := range recs {
		if len(r.Payload) > MaxPayload {
			return 0, 0, errTooLarge
		}
		if r.Type == 0 {
			return 0, 0, errors.New("wal: record type 0 is reserved")
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
	first = l.tail
	for _, r := range recs {
		fs := frameSize(len(r.Payload))
		activeSize := int64(l.activeEnd - l.activeFirst)
		roll := activeSize > 0 && activeSize+fs > l.opts.SegmentSize
		if roll || len(l.pending) == 0 {
			l.pending = append(l.pending, chunk{first: l.tail, newSegment: roll, data: l.takeBuffer()})
			if roll {
				l.activeFirst = l.tail
				l.activeEnd = l.tail
				l.starts = append(l.starts, l.tail)
			}
		}
		c := &l.pending[len(l.pending)-1]
		c.data = appendFrame(c.data, r)
		l.tail += LSN(fs)
		l.activeEnd += LSN(fs)
		l.pendingBytes += int(fs)
	}
	select {
	case l.kick <- struct{}{}:
	default:
	}
	return first, l.tail, nil
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

// Wait blocks until every record below end is written, and under SyncAlways
// also fsynced.
func (l *Log) Wait(end LSN) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	target := &l.written
	if l.opts.Sync == SyncAlways {
		target = &l.synced
	}
	for *target < end && l.err == nil {
		l.cond.Wait()
	}
	if *target >= end {
		return nil
	}
	return l.err
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

// End returns the LSN the next record will get.
func (l *Log) End() LSN {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tail
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
}

// Segments lists the segments in log order.
func (l *Log) Segments() []SegmentInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]SegmentInfo, len(l.segs))
	for i, s := range l.segs {
		out[i] = SegmentInfo{First: s.first, Size: s.size, Name: segmentName(s.first)}
	}
	return out
}

// SegmentOf returns the first LSN of the segment holding (or, for a record
// still pending, bound to hold) lsn; false if lsn is below the first
// segment still held.
func (l *Log) SegmentOf(lsn LSN) (LSN, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := sort.Search(len(l.starts), func(i int) bool { return l.starts[i] > lsn }) - 1
	if i < 0 {
		return 0, false
	}
	return l.starts[i], true
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
	wantSync := l.opts.Sync == SyncAlways || l.syncWanted > l.synced
	activeFirst := l.segs[len(l.segs)-1].first
	l.mu.Unlock()

	var err error
	var newSegs []segment
	// ends records where each segment written to now ends: one flush may
	// finish the old segment and start new ones.
	var ends []segment
	written := LSN(0)
	for _, c := range chunks {
		if c.newSegment {
			if err = l.roll(c.first); err != nil {
				break
			}
			newSegs = append(newSegs, segment{first: c.first})
			activeFirst = c.first
		}
		if _, err = l.active.Write(c.data); err != nil {
			err = fmt.Errorf("wal: write segment: %w", err)
			break
		}
		written = c.first + LSN(len(c.data))
		ends = append(ends, segment{first: activeFirst, size: int64(written - activeFirst)})
	}
	if err == nil && (wantSync || len(newSegs) > 0 && l.opts.Sync == SyncAlways) {
		l.fsyncs.Add(1)
		if err = l.active.Sync(); err != nil {
			err = fmt.Errorf("wal: fsync segment: %w", err)
		}
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
	for _, c := range chunks {
		l.pendingBytes -= len(c.data)
		l.giveBuffer(c.data)
	}
	if err != nil {
		if l.err == nil {
			l.err = fmt.Errorf("%w: %w", ErrPoisoned, err)
			l.opts.Logger.Error("wal: log poisoned", "err", err)
		}
	} else {
		if written > l.written {
			l.written = written
		}
		if wantSync {
			l.synced = l.written
		}
	}
	l.cond.Broadcast()
}

// roll fsyncs and closes the active segment and creates the next one.
func (l *Log) roll(first LSN) error {
	l.fsyncs.Add(1)
	if err := l.active.Sync(); err != nil {
		return fmt.Errorf("wal: fsync segment before roll: %w", err)
	}
	err := l.active.Close()
	l.active = nil // closed even if Close failed; Log.Close must not close it again
	if err != nil {
		return fmt.Errorf("wal: close segment: %w", err)
	}
	// Everything before first is in segments that are now all fsynced.
	l.mu.Lock()
	if first > l.synced {
		l.synced = first
	}
	l.mu.Unlock()
	f, err := createSegment(l.opts.FS, l.dir, first)
	if err != nil {
		return err
	}
	l.active = f
	return nil
}

// syncLoop drives SyncEverySec.
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
	skip := target <= l.synced || l.err != nil || l.closed
	l.mu.Unlock()
	if skip {
		return
	}
	if h.f == nil || h.first != first {
		h.close()
		f, err := l.opts.FS.Open(l.opts.FS.PathJoin(l.dir, segmentName(first)))
		if err != nil {
			l.poison(fmt.Errorf("wal: open segment %s to fsync: %w", segmentName(first), err))
			return
		}
		h.f, h.first = f, first
	}
	l.fsyncs.Add(1)
	if err := h.f.Sync(); err != nil {
		l.poison(fmt.Errorf("wal: fsync segment: %w", err))
		return
	}
	l.mu.Lock()
	if target > l.synced {
		l.synced = target
	}
	l.cond.Broadcast()
	l.mu.Unlock()
}

// poison makes every later call fail with err (see ErrPoisoned).
func (l *Log) poison(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err == nil {
		l.err = fmt.Errorf("%w: %w", ErrPoisoned, err)
		l.opts.Logger.Error("wal: log poisoned", "err", err)
	}
	l.cond.Broadcast()
}

// Close writes and fsyncs everything appended, then closes the files. It is
// safe to call more than once.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return nil
	}
	l.syncWanted = l.tail
	l.closed = true
	l.cond.Broadcast()
	l.mu.Unlock()
	close(l.stop)
	<-l.done
	<-l.tickerD
	var errs []error
	l.mu.Lock()
	errs = append(errs, l.err)
	l.mu.Unlock()
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
