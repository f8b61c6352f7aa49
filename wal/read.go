package wal

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
)

// readerCache keeps one read-only handle per segment. Reads share the read
// lock; dropping a segment takes the write lock, so a handle is never closed
// under a reader. A segment dropped (removed) is remembered, so that a
// reader that located it just before is told ErrNotFound rather than caching
// a handle on a removed file (which would keep its disk space, and a
// descriptor, for the life of the log).
type readerCache struct {
	fs      vfs.FS
	dir     string
	mu      sync.RWMutex
	files   map[LSN]vfs.File
	removed map[LSN]bool
	closed  bool
}

// readAt reads len(p) bytes at file offset off of the segment starting at
// first.
func (c *readerCache) readAt(first LSN, p []byte, off int64) error {
	c.mu.RLock()
	f := c.files[first]
	if f == nil {
		c.mu.RUnlock()
		if err := c.open(first); err != nil {
			return err
		}
		c.mu.RLock()
		if f = c.files[first]; f == nil {
			c.mu.RUnlock()
			return c.gone(first)
		}
	}
	defer c.mu.RUnlock()
	_, err := f.ReadAt(p, off)
	return err
}

// open caches a handle on the segment starting at first.
func (c *readerCache) open(first LSN) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.files[first] != nil {
		return nil
	}
	if c.closed || c.removed[first] {
		return c.goneLocked(first)
	}
	f, err := c.fs.Open(c.fs.PathJoin(c.dir, segmentName(first)))
	if isNotExist(err) {
		return fmt.Errorf("%w: segment %s was removed", ErrNotFound, segmentName(first))
	}
	if err != nil {
		return err
	}
	c.files[first] = f
	return nil
}

func (c *readerCache) gone(first LSN) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.goneLocked(first)
}

func (c *readerCache) goneLocked(first LSN) error {
	if c.closed {
		return ErrClosed
	}
	return fmt.Errorf("%w: segment %s was removed", ErrNotFound, segmentName(first))
}

// drop closes the handle on a segment about to be removed and refuses it
// from now on.
func (c *readerCache) drop(first LSN) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.removed[first] = true
	f := c.files[first]
	delete(c.files, first)
	if f != nil {
		return f.Close()
	}
	return nil
}

func (c *readerCache) closeAll() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	var first error
	for k, f := range c.files {
		if err := f.Close(); err != nil && first == nil {
			first = err
		}
		delete(c.files, k)
	}
	return first
}

// locate returns the segment holding lsn, waiting until lsn is written.
func (l *Log) locate(lsn LSN) (segment, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return segment{}, ErrClosed
	}
	if lsn >= l.tail {
		return segment{}, fmt.Errorf("%w: %d is past the end %d", ErrNotFound, lsn, l.tail)
	}
	for l.written <= lsn && l.err == nil {
		l.cond.Wait()
	}
	if l.written <= lsn {
		return segment{}, l.err
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].first > lsn }) - 1
	if i < 0 {
		return segment{}, fmt.Errorf("%w: %d is below the first segment %s", ErrNotFound, lsn, segmentName(l.segs[0].first))
	}
	if i+1 < len(l.segs) && lsn >= l.segs[i].end() {
		return segment{}, fmt.Errorf("%w: %d is in a removed segment (between %s and %s)",
			ErrNotFound, lsn, segmentName(l.segs[i].first), segmentName(l.segs[i+1].first))
	}
	return l.segs[i], nil
}

// Read returns the record at lsn, verifying its checksum. The payload is a new
// slice owned by the caller. A record enqueued but not yet written is waited
// for.
func (l *Log) Read(lsn LSN) (Record, error) { return l.ReadSized(lsn, 0) }

// ReadSized is Read for a caller that knows about how long the payload is:
// with a hint at least that long, the record is read with one pread instead
// of two. A wrong hint costs a second read, never a wrong result.
func (l *Log) ReadSized(lsn LSN, payloadHint int) (Record, error) {
	seg, err := l.locate(lsn)
	if err != nil {
		return Record{}, err
	}
	hdr := int64(seg.frameHeader())
	off := seg.fileOffset(lsn)
	left := seg.size - int64(lsn-seg.first) // bytes of the segment from lsn on
	first := min(hdr+int64(max(payloadHint, 0)), left)
	if first < hdr {
		return Record{}, l.corruptAt(seg, lsn, errors.New("header runs past the segment"))
	}
	buf := make([]byte, first)
	if err := l.readers.readAt(seg.first, buf, off); err != nil {
		return Record{}, l.readError(seg, lsn, err)
	}
	n := seg.payloadLen(buf)
	if n > MaxPayload || hdr+n > left {
		return Record{}, l.corruptAt(seg, lsn, errors.New("length runs past the segment"))
	}
	if size := hdr + n; size > first {
		buf = append(buf, make([]byte, size-first)...)
		if err := l.readers.readAt(seg.first, buf[first:], off+first); err != nil {
			return Record{}, l.readError(seg, lsn, err)
		}
	} else {
		buf = buf[:size]
	}
	return l.decodeRecord(seg, buf, lsn)
}

// decodeRecord decodes the frame buf at lsn of seg as a record a reader may
// be given: not a bad frame, nor one of the log's own (errNoRecord).
func (l *Log) decodeRecord(seg segment, buf []byte, lsn LSN) (Record, error) {
	r, _, fe := seg.decode(buf, lsn)
	if fe != frameOK {
		return Record{}, l.corruptAt(seg, lsn, errors.New("bad checksum or type"))
	}
	if seg.version != 1 && r.Type == MarkType {
		return Record{}, l.corruptAt(seg, lsn, errNoRecord)
	}
	return r, nil
}

// errNoRecord: the LSN a reader asked for holds a frame of the log's own —
// a sync mark, or a filler that a repair put over damaged records.
var errNoRecord = errors.New("no record here: a sync mark, or a span a repair cut out")

// readError says why reading lsn failed: ErrNotFound and ErrClosed as they
// are (the segment was removed, the log closed), anything else as damage.
func (l *Log) readError(seg segment, lsn LSN, err error) error {
	if errors.Is(err, ErrNotFound) || errors.Is(err, ErrClosed) {
		return err
	}
	return l.corruptAt(seg, lsn, err)
}

// Batched reads (ReadBatch) read records that lie this close together in
// one segment with one read: at most readBatchSpan bytes per read, and
// never more than readBatchGap bytes between one record's expected end and
// the next record.
const (
	readBatchSpan = 256 << 10
	readBatchGap  = 4 << 10
)

// ReadBatch is ReadSized for many records: it returns the records at lsns
// (each a record boundary; payloadHints[i] is the hint for lsns[i]), in the
// order asked, or the first error (see ReadEach). The payloads may share
// memory, which is the caller's: the log never reuses what a read returns
// (storage's bodies alias it).
func (l *Log) ReadBatch(lsns []LSN, payloadHints []int) ([]Record, error) {
	out, errs := l.ReadEach(lsns, payloadHints)
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ReadEach is ReadBatch with an outcome per record: errs[i] is nil when
// out[i] is the record at lsns[i]. Records close together in one segment —
// the jobs of a consumer's batch, added together, sit side by side in the
// log — are read with one pread, not one each; a damaged record spoils only
// itself.
func (l *Log) ReadEach(lsns []LSN, payloadHints []int) (out []Record, errs []error) {
	order := make([]int, len(lsns))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(lsns[a], lsns[b]) })
	out, errs = make([]Record, len(lsns)), make([]error, len(lsns))
	for g := 0; g < len(order); {
		first := lsns[order[g]]
		seg, err := l.locate(first)
		if err != nil {
			errs[order[g]] = err
			g++
			continue
		}
		hdr := int64(seg.frameHeader())
		// The group: the records from g on that fit one read.
		expectedEnd := func(k int) int64 {
			return int64(lsns[order[k]]-first) + hdr + int64(max(payloadHints[order[k]], 0))
		}
		end := g + 1
		span := expectedEnd(g)
		for end < len(order) {
			next := lsns[order[end]]
			if next >= seg.end() || int64(next-first) > span+readBatchGap || expectedEnd(end) > readBatchSpan {
				break
			}
			span = max(span, expectedEnd(end))
			end++
		}
		left := seg.size - int64(first-seg.first)
		buf := make([]byte, max(min(span, left), 0))
		if err := l.readers.readAt(seg.first, buf, seg.fileOffset(first)); err != nil {
			// One by one, so that each record gets its own outcome.
			for k := g; k < end; k++ {
				i := order[k]
				out[i], errs[i] = l.ReadSized(lsns[i], payloadHints[i])
			}
			g = end
			continue
		}
		for k := g; k < end; k++ {
			i := order[k]
			at := int64(lsns[i] - first)
			if rest := buf[at:]; int64(len(rest)) >= hdr && hdr+seg.payloadLen(rest) <= int64(len(rest)) {
				out[i], errs[i] = l.decodeRecord(seg, rest[:hdr+seg.payloadLen(rest)], lsns[i])
				continue
			}
			// Longer than its hint said and past the read: on its own.
			out[i], errs[i] = l.ReadSized(lsns[i], payloadHints[i])
		}
		g = end
	}
	return out, errs
}

func (l *Log) corruptAt(seg segment, lsn LSN, cause error) error {
	return fmt.Errorf("%w: segment %s offset %d (lsn %d): %v",
		ErrCorrupt, segmentName(seg.first), seg.fileOffset(lsn), lsn, cause)
}

// Replay calls fn for every record from LSN from (a record boundary, or a
// sync mark's) to the end of the log as it is when Replay starts, in order,
// with the LSN that follows it. Sync marks are skipped. The record's payload
// is valid only during the call. It stops at the first error fn returns, and
// returns ErrCorrupt naming the segment and offset for a damaged record.
func (l *Log) Replay(from LSN, fn func(lsn, end LSN, r Record) error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	segs := append([]segment(nil), l.segs...)
	end := l.written
	l.mu.Unlock()
	if from < segs[0].first {
		return fmt.Errorf("%w: replay from %d, but the log starts at %d", ErrNotFound, from, segs[0].first)
	}
	if from > end {
		return fmt.Errorf("%w: replay from %d, but the log ends at %d", ErrNotFound, from, end)
	}
	next := from // every record from here on must be present
	for _, seg := range segs {
		if seg.end() <= from || seg.first >= end {
			continue
		}
		if seg.first > next {
			return fmt.Errorf("%w: replay from %d, but lsns %d to %d are in removed segments",
				ErrNotFound, from, next, seg.first)
		}
		next = seg.end()
		start := max(from, seg.first)
		stop := min(seg.end(), end)
		if err := l.replaySegment(seg, start, stop, fn); err != nil {
			return err
		}
	}
	return nil
}

// VerifySegmentPaced is VerifySegment reading at most bytesPerSec (0: no
// bound), so a background check of a large log does not take the disk from
// the server; it stops with ctx's error when ctx is done.
func (l *Log) VerifySegmentPaced(ctx context.Context, first LSN, bytesPerSec int64) error {
	seg, end, _, err := l.segmentAt(first)
	if err != nil {
		return err
	}
	p := &pacer{ctx: ctx, rate: bytesPerSec, start: time.Now()}
	return l.replaySegmentPaced(seg, seg.first, end, p, func(LSN, LSN, Record) error { return nil })
}

// pacer holds reads to a rate, sleeping between them.
type pacer struct {
	ctx   context.Context
	rate  int64 // bytes per second; 0: no bound
	start time.Time
	read  int64
}

// wait accounts n bytes read and sleeps until the rate allows the next.
func (p *pacer) wait(n int) error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	p.read += int64(n)
	if p.rate <= 0 {
		return nil
	}
	due := time.Duration(float64(p.read) / float64(p.rate) * float64(time.Second))
	if d := due - time.Since(p.start); d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
		case <-p.ctx.Done():
			return p.ctx.Err()
		}
	}
	return nil
}

// pacedReader reads through a pacer.
type pacedReader struct {
	r io.Reader
	p *pacer
}

func (r pacedReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if perr := r.p.wait(n); perr != nil && err == nil {
		err = perr
	}
	return n, err
}

// ReplayAll calls fn for every record of every segment the log holds, in
// order, across the gaps removed segments left: the whole log as it is, for
// the rebuild of an index derived from it. Like Replay otherwise.
func (l *Log) ReplayAll(fn func(lsn, end LSN, r Record) error) error {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return ErrClosed
	}
	segs := append([]segment(nil), l.segs...)
	end := l.written
	l.mu.Unlock()
	for _, seg := range segs {
		if err := l.replaySegment(seg, seg.first, min(seg.end(), end), fn); err != nil {
			return err
		}
	}
	return nil
}

// replaySegment reads the frames of seg in [start, stop) in order and calls
// fn for each record (not for sync marks).
func (l *Log) replaySegment(seg segment, start, stop LSN, fn func(lsn, end LSN, r Record) error) error {
	return l.replaySegmentPaced(seg, start, stop, nil, fn)
}

func (l *Log) replaySegmentPaced(seg segment, start, stop LSN, p *pacer, fn func(lsn, end LSN, r Record) error) error {
	if start >= stop {
		return nil
	}
	f, err := l.opts.FS.Open(l.opts.FS.PathJoin(l.dir, segmentName(seg.first)))
	if isNotExist(err) {
		return fmt.Errorf("%w: segment %s was removed", ErrNotFound, segmentName(seg.first))
	}
	if err != nil {
		return fmt.Errorf("wal: open segment %s: %w", segmentName(seg.first), err)
	}
	defer f.Close()
	var src io.Reader = io.NewSectionReader(f, seg.fileOffset(start), int64(stop-start))
	if p != nil {
		src = pacedReader{r: src, p: p}
	}
	br := bufio.NewReaderSize(src, 1<<20)
	hdrSize := int64(seg.frameHeader())
	hdr := make([]byte, hdrSize)
	var buf []byte
	for lsn := start; lsn < stop; {
		if p != nil && p.ctx.Err() != nil {
			return p.ctx.Err()
		}
		if _, err := io.ReadFull(br, hdr); err != nil {
			if p != nil && p.ctx.Err() != nil {
				return p.ctx.Err()
			}
			return l.corruptAt(seg, lsn, fmt.Errorf("short header: %v", err))
		}
		n := seg.payloadLen(hdr)
		if n > MaxPayload || lsn+LSN(hdrSize+n) > stop {
			return l.corruptAt(seg, lsn, errors.New("length runs past the segment"))
		}
		if cap(buf) < int(hdrSize+n) {
			buf = make([]byte, hdrSize+n)
		}
		buf = buf[:hdrSize+n]
		copy(buf, hdr)
		if _, err := io.ReadFull(br, buf[hdrSize:]); err != nil {
			if p != nil && p.ctx.Err() != nil {
				return p.ctx.Err()
			}
			return l.corruptAt(seg, lsn, fmt.Errorf("short payload: %v", err))
		}
		r, size, fe := seg.decode(buf, lsn)
		if fe != frameOK {
			return l.corruptAt(seg, lsn, errors.New("bad checksum or type"))
		}
		end := lsn + LSN(size)
		if r.Type != MarkType || seg.version == 1 {
			if err := fn(lsn, end, r); err != nil {
				return err
			}
		}
		lsn = end
	}
	return nil
}

// Verify reads every record of every segment held and checks its checksum.
// Gaps left by RemoveSegments are not damage.
func (l *Log) Verify() error {
	for _, seg := range l.Segments() {
		if err := l.VerifySegment(seg.First); err != nil && !errors.Is(err, ErrNotFound) {
			return err
		}
	}
	return nil
}

// segmentAt returns the segment starting at first, the end of what is
// written of it, and whether it is the active one; ErrNotFound if the log
// holds no such segment (any more), ErrClosed after Close.
func (l *Log) segmentAt(first LSN) (seg segment, end LSN, active bool, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return segment{}, 0, false, ErrClosed
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].first >= first })
	if i == len(l.segs) || l.segs[i].first != first {
		return segment{}, 0, false, fmt.Errorf("%w: no segment %s", ErrNotFound, segmentName(first))
	}
	seg = l.segs[i]
	return seg, min(seg.end(), l.written), i == len(l.segs)-1, nil
}

// VerifySegment reads every frame of the segment starting at first (as much
// of the active one as is written) and checks its checksums; ErrNotFound if
// the log holds no such segment (any more).
func (l *Log) VerifySegment(first LSN) error {
	seg, end, _, err := l.segmentAt(first)
	if err != nil {
		return err
	}
	return l.replaySegment(seg, seg.first, end, func(LSN, LSN, Record) error { return nil })
}

// ScanSegment calls fn for every record of the sealed segment whose first
// LSN is first, in order; the payload is valid only during the call. It is
// how a collector finds the records a segment holds without a replay of the
// whole log. The active segment cannot be scanned: it is still growing.
func (l *Log) ScanSegment(first LSN, fn func(lsn LSN, r Record) error) error {
	seg, _, active, err := l.segmentAt(first)
	if err != nil {
		return err
	}
	if active {
		return fmt.Errorf("wal: segment %s is the active segment", segmentName(first))
	}
	return l.replaySegment(seg, seg.first, seg.end(), func(lsn, _ LSN, r Record) error { return fn(lsn, r) })
}

// RemoveSegments removes the listed sealed segments, wherever they are in
// the log, leaving gaps. The caller guarantees that nothing in them is needed
// any more: no record in them will be read, and every one of them ends at or
// before the Checkpoint it will pass to the next Open (storage removes only
// segments with no live body that end before its durable checkpoint). The
// active segment is never removed; firsts that name no segment are ignored.
func (l *Log) RemoveSegments(firsts []LSN) error {
	l.mu.Lock()
	if err := l.errLocked(); err != nil {
		l.mu.Unlock()
		return err
	}
	remove := make(map[LSN]bool, len(firsts))
	for _, first := range firsts {
		remove[first] = true
	}
	var drop []segment
	keep := l.segs[:0:0]
	for i, seg := range l.segs {
		if i < len(l.segs)-1 && remove[seg.first] {
			drop = append(drop, seg)
			continue
		}
		keep = append(keep, seg)
	}
	if len(drop) == 0 {
		l.mu.Unlock()
		return nil
	}
	l.segs = keep
	// spans also holds segments queued for creation, after the active one,
	// which are never removed: drop only the spans of the segments dropped.
	dropped := make(map[LSN]bool, len(drop))
	for _, seg := range drop {
		dropped[seg.first] = true
	}
	l.spans = slices.DeleteFunc(slices.Clone(l.spans), func(sp span) bool { return dropped[sp.first] })
	l.mu.Unlock()
	return l.removeFiles(drop)
}

// removeFiles removes the segments in order, each removal durable before
// the next: an owner may need the older ones gone first (storage keeps a
// deletion only while its job's older records are in the log), and a
// crash could otherwise keep any subset of the unlinks.
func (l *Log) removeFiles(drop []segment) error {
	fs := l.opts.FS
	for _, s := range drop {
		if err := l.readers.drop(s.first); err != nil {
			return fmt.Errorf("wal: close segment %s: %w", segmentName(s.first), err)
		}
		if err := fs.Remove(fs.PathJoin(l.dir, segmentName(s.first))); err != nil {
			return fmt.Errorf("wal: remove segment %s: %w", segmentName(s.first), err)
		}
		if err := durable.SyncDir(fs, l.dir); err != nil {
			return fmt.Errorf("wal: sync %s: %w", l.dir, err)
		}
	}
	return nil
}
