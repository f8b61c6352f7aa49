package wal

import (
	"bufio"
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sort"
	"sync"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
)

// readerCache keeps one read-only handle per segment. Reads share the read
// lock; dropping a segment takes the write lock, so a handle is never closed
// under a reader.
type readerCache struct {
	fs    vfs.FS
	dir   string
	mu    sync.RWMutex
	files map[LSN]vfs.File
}

// readAt reads len(p) bytes at file offset off of the segment starting at
// first.
func (c *readerCache) readAt(first LSN, p []byte, off int64) error {
	c.mu.RLock()
	f := c.files[first]
	if f == nil {
		c.mu.RUnlock()
		c.mu.Lock()
		if f = c.files[first]; f == nil {
			var err error
			f, err = c.fs.Open(c.fs.PathJoin(c.dir, segmentName(first)))
			if err != nil {
				c.mu.Unlock()
				return err
			}
			c.files[first] = f
		}
		c.mu.Unlock()
		c.mu.RLock()
		if f = c.files[first]; f == nil {
			c.mu.RUnlock()
			return ErrNotFound
		}
	}
	defer c.mu.RUnlock()
	_, err := f.ReadAt(p, off)
	return err
}

func (c *readerCache) drop(first LSN) error {
	c.mu.Lock()
	defer c.mu.Unlock()
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
	off := segmentHeaderSize + int64(lsn-seg.first)
	left := seg.size - int64(lsn-seg.first) // bytes of the segment from lsn on
	first := min(int64(frameHeaderSize+max(payloadHint, 0)), left)
	if first < frameHeaderSize {
		return Record{}, l.corruptAt(seg, lsn, errors.New("header runs past the segment"))
	}
	buf := make([]byte, first)
	if err := l.readers.readAt(seg.first, buf, off); err != nil {
		return Record{}, l.corruptAt(seg, lsn, err)
	}
	n := frameLen(buf)
	if n > MaxPayload || frameHeaderSize+n > left {
		return Record{}, l.corruptAt(seg, lsn, errors.New("length runs past the segment"))
	}
	if size := frameHeaderSize + n; size > first {
		buf = append(buf, make([]byte, size-first)...)
		if err := l.readers.readAt(seg.first, buf[first:], off+first); err != nil {
			return Record{}, l.corruptAt(seg, lsn, err)
		}
	} else {
		buf = buf[:size]
	}
	r, _, fe := decodeFrame(buf)
	if fe != frameOK {
		return Record{}, l.corruptAt(seg, lsn, errors.New("bad checksum or type"))
	}
	return r, nil
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
// order asked. Records close together in one segment — the jobs of a
// consumer's batch, added together, sit side by side in the log — are read
// with one pread, not one each. The payloads may share memory.
func (l *Log) ReadBatch(lsns []LSN, payloadHints []int) ([]Record, error) {
	order := make([]int, len(lsns))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(lsns[a], lsns[b]) })
	out := make([]Record, len(lsns))
	for g := 0; g < len(order); {
		first := lsns[order[g]]
		seg, err := l.locate(first)
		if err != nil {
			return nil, err
		}
		// The group: the records from g on that fit one read.
		expectedEnd := func(k int) int64 {
			return int64(lsns[order[k]]-first) + frameHeaderSize + int64(max(payloadHints[order[k]], 0))
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
		buf := make([]byte, min(span, left))
		if err := l.readers.readAt(seg.first, buf, segmentHeaderSize+int64(first-seg.first)); err != nil {
			return nil, l.corruptAt(seg, first, err)
		}
		for k := g; k < end; k++ {
			i := order[k]
			at := int64(lsns[i] - first)
			if rest := buf[at:]; len(rest) >= frameHeaderSize && frameHeaderSize+frameLen(rest) <= int64(len(rest)) {
				r, _, fe := decodeFrame(rest[:frameHeaderSize+frameLen(rest)])
				if fe != frameOK {
					return nil, l.corruptAt(seg, lsns[i], errors.New("bad checksum or type"))
				}
				out[i] = r
				continue
			}
			// Longer than its hint said and past the read: on its own.
			if out[i], err = l.ReadSized(lsns[i], payloadHints[i]); err != nil {
				return nil, err
			}
		}
		g = end
	}
	return out, nil
}

func (l *Log) corruptAt(seg segment, lsn LSN, cause error) error {
	return fmt.Errorf("%w: segment %s offset %d (lsn %d): %v",
		ErrCorrupt, segmentName(seg.first), segmentHeaderSize+int64(lsn-seg.first), lsn, cause)
}

// Replay calls fn for every record from LSN from (a record boundary) to the
// end of the log as it is when Replay starts, in order. The record's payload
// is valid only during the call. It stops at the first error fn returns, and
// returns ErrCorrupt naming the segment and offset for a damaged record.
func (l *Log) Replay(from LSN, fn func(lsn LSN, r Record) error) error {
	l.mu.Lock()
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

func (l *Log) replaySegment(seg segment, start, stop LSN, fn func(LSN, Record) error) error {
	if start >= stop {
		return nil
	}
	f, err := l.opts.FS.Open(l.opts.FS.PathJoin(l.dir, segmentName(seg.first)))
	if err != nil {
		return fmt.Errorf("wal: open segment %s: %w", segmentName(seg.first), err)
	}
	defer f.Close()
	off := segmentHeaderSize + int64(start-seg.first)
	br := bufio.NewReaderSize(io.NewSectionReader(f, off, int64(stop-start)), 1<<20)
	var hdr [frameHeaderSize]byte
	var buf []byte
	for lsn := start; lsn < stop; {
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return l.corruptAt(seg, lsn, fmt.Errorf("short header: %v", err))
		}
		n := frameLen(hdr[:])
		if n > MaxPayload || lsn+LSN(frameHeaderSize+n) > stop {
			return l.corruptAt(seg, lsn, errors.New("length runs past the segment"))
		}
		if cap(buf) < int(frameHeaderSize+n) {
			buf = make([]byte, frameHeaderSize+n)
		}
		buf = buf[:frameHeaderSize+n]
		copy(buf, hdr[:])
		if _, err := io.ReadFull(br, buf[frameHeaderSize:]); err != nil {
			return l.corruptAt(seg, lsn, fmt.Errorf("short payload: %v", err))
		}
		r, size, fe := decodeFrame(buf)
		if fe != frameOK {
			return l.corruptAt(seg, lsn, errors.New("bad checksum or type"))
		}
		if err := fn(lsn, r); err != nil {
			return err
		}
		lsn += LSN(size)
	}
	return nil
}

// Verify reads every record of every segment held and checks its checksum.
// Gaps left by RemoveSegments are not damage.
func (l *Log) Verify() error {
	l.mu.Lock()
	segs := append([]segment(nil), l.segs...)
	end := l.written
	l.mu.Unlock()
	for _, seg := range segs {
		if err := l.replaySegment(seg, seg.first, min(seg.end(), end), func(LSN, Record) error { return nil }); err != nil {
			return err
		}
	}
	return nil
}

// ScanSegment calls fn for every record of the sealed segment whose first
// LSN is first, in order; the payload is valid only during the call. It is
// how a collector finds the records a segment holds without a replay of the
// whole log. The active segment cannot be scanned: it is still growing.
func (l *Log) ScanSegment(first LSN, fn func(lsn LSN, r Record) error) error {
	l.mu.Lock()
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].first >= first })
	if i == len(l.segs) || l.segs[i].first != first {
		l.mu.Unlock()
		return fmt.Errorf("%w: no segment %s", ErrNotFound, segmentName(first))
	}
	if i == len(l.segs)-1 {
		l.mu.Unlock()
		return fmt.Errorf("wal: segment %s is the active segment", segmentName(first))
	}
	seg := l.segs[i]
	l.mu.Unlock()
	return l.replaySegment(seg, seg.first, seg.end(), fn)
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
	// starts also holds segments queued for creation, after the active one,
	// which is never removed: filter it, don't rebuild it.
	l.starts = slices.DeleteFunc(slices.Clone(l.starts), func(first LSN) bool {
		return remove[first] && first != keep[len(keep)-1].first
	})
	l.mu.Unlock()
	return l.removeFiles(drop)
}

func (l *Log) removeFiles(drop []segment) error {
	fs := l.opts.FS
	for _, s := range drop {
		if err := l.readers.drop(s.first); err != nil {
			return fmt.Errorf("wal: close segment %s: %w", segmentName(s.first), err)
		}
		if err := fs.Remove(fs.PathJoin(l.dir, segmentName(s.first))); err != nil {
			return fmt.Errorf("wal: remove segment %s: %w", segmentName(s.first), err)
		}
	}
	if err := durable.SyncDir(fs, l.dir); err != nil {
		return fmt.Errorf("wal: sync %s: %w", l.dir, err)
	}
	return nil
}

// TruncateFront removes every whole segment that ends at or before lsn: the
// front of the log, by RemoveSegments. The active segment is never removed.
// Segments are removed oldest first, so a crash midway leaves a contiguous
// log.
func (l *Log) TruncateFront(lsn LSN) error {
	var firsts []LSN
	for _, seg := range l.Segments() {
		if seg.First+LSN(seg.Size) > lsn {
			break
		}
		firsts = append(firsts, seg.First)
	}
	return l.RemoveSegments(firsts)
}

// repairTail reads the last segment to its end and returns the size of its
// valid frames. A torn tail is cut off (the original kept as NAME.broken); a
// bad frame followed by a valid one is damage, and an error. The first
// trusted bytes of frames are known durable (Options.Checkpoint) and are not
// read again unless the tail after them needs repair: a restart reads only
// what the last checkpoint did not cover, not the whole 64 MiB segment.
func repairTail(fs vfs.FS, dir string, seg segment, trusted int64, logger *slog.Logger) (int64, error) {
	name := segmentName(seg.first)
	path := fs.PathJoin(dir, name)
	f, err := fs.Open(path)
	if err != nil {
		return 0, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return 0, fmt.Errorf("wal: stat segment %s: %w", name, err)
	}
	if size := st.Size() - segmentHeaderSize; trusted > 0 && trusted <= size {
		// The common case: check the header and the untrusted tail only.
		buf := make([]byte, segmentHeaderSize+size-trusted)
		_, err := f.ReadAt(buf[:segmentHeaderSize], 0)
		if err == nil {
			_, err = f.ReadAt(buf[segmentHeaderSize:], segmentHeaderSize+trusted)
		}
		if err != nil && !errors.Is(err, io.EOF) {
			f.Close()
			return 0, fmt.Errorf("wal: read segment %s: %w", name, err)
		}
		if err := checkSegmentHeader(buf, seg.first); err != nil {
			f.Close()
			return 0, fmt.Errorf("%w (segment %s)", err, name)
		}
		if validFrames(buf[segmentHeaderSize:]) == len(buf)-segmentHeaderSize {
			f.Close()
			return size, nil
		}
	}
	b := make([]byte, st.Size())
	_, err = f.ReadAt(b, 0)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return 0, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	if err := checkSegmentHeader(b, seg.first); err != nil {
		return 0, fmt.Errorf("%w (segment %s)", err, name)
	}
	frames := b[segmentHeaderSize:]
	off := validFrames(frames)
	if off == len(frames) {
		return int64(off), nil
	}
	if _, _, fe := decodeFrame(frames[off:]); fe == frameBad && validFrameFollows(frames, off) && !tornSector(b, segmentHeaderSize+off) {
		return 0, fmt.Errorf("%w: segment %s offset %d (lsn %d): bad record followed by valid ones",
			ErrCorrupt, name, segmentHeaderSize+off, uint64(seg.first)+uint64(off))
	}
	logger.Warn("wal: truncating torn tail", "segment", name,
		"offset", segmentHeaderSize+off, "dropped_bytes", len(frames)-off, "kept_as", name+brokenSuffix)
	broken := fs.PathJoin(dir, name+brokenSuffix)
	if _, err := fs.Stat(broken); err == nil {
		if err := fs.Remove(broken); err != nil {
			return 0, fmt.Errorf("wal: remove old %s: %w", broken, err)
		}
	}
	if err := fs.Link(path, broken); err != nil {
		// Write a copy: a vfs.File may scribble on the slice it is given,
		// and b is written again below.
		if err := writeFileAtomic(fs, dir, name+brokenSuffix, bytes.Clone(b)); err != nil {
			return 0, fmt.Errorf("wal: keep %s: %w", broken, err)
		}
	}
	if err := writeFileAtomic(fs, dir, name, b[:segmentHeaderSize+off]); err != nil {
		return 0, fmt.Errorf("wal: truncate %s: %w", name, err)
	}
	return int64(off), nil
}

// sectorSize is the unit a disk writes atomically; unsynced pages can reach
// the disk in any order, so a crash can leave whole zeroed sectors inside
// the unsynced tail.
const sectorSize = 512

// validFrames returns the length of the run of whole, valid frames at the
// start of frames.
func validFrames(frames []byte) int {
	off := 0
	for off < len(frames) {
		_, n, fe := decodeFrame(frames[off:])
		if fe != frameOK {
			break
		}
		off += n
	}
	return off
}

// tornSector reports whether the frame starting at file offset start (its
// claimed extent, or to the end of the file) contains a whole, aligned,
// all-zero sector: the mark of a write torn by a crash, not of a bit flip
// (as etcd's WAL decides). A record with a zeroed sector followed by valid
// records is a torn unsynced tail, and is cut like any torn tail.
func tornSector(file []byte, start int) bool {
	end := len(file)
	if start+frameHeaderSize <= len(file) {
		n := int(frameLen(file[start:]))
		if n <= MaxPayload && start+frameHeaderSize+n < end {
			end = start + frameHeaderSize + n
		}
	}
	for sec := (start + sectorSize - 1) / sectorSize * sectorSize; sec+sectorSize <= end; sec += sectorSize {
		if allZero(file[sec : sec+sectorSize]) {
			return true
		}
	}
	return false
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// validFrameFollows reports whether the bad frame at off claims a length that
// ends inside frames at the start of a valid frame: the mark of a damaged
// record in the middle of the log rather than a torn write at its end.
func validFrameFollows(frames []byte, off int) bool {
	if len(frames)-off < frameHeaderSize {
		return false
	}
	n := int(frameLen(frames[off:]))
	next := off + frameHeaderSize + n
	if n > MaxPayload || next >= len(frames) {
		return false
	}
	_, _, fe := decodeFrame(frames[next:])
	return fe == frameOK
}
