package wal

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Recovery of the last segment. Only what was written after the last
// completed fsync can be torn by a crash — in any pattern: unsynced pages
// reach the disk in any order, so a hole may have whole records after it —
// and everything before it is durable, so damage there is corruption. The
// log knows where its durable part ends from two sources:
//
//   - Options.Checkpoint: its owner made the log durable that far;
//   - sync marks: after every fsync the next records written are preceded by
//     a mark stating the LSN the fsync made durable.
//
// planTail reads the segment from the checkpoint on and stops at the first
// frame that does not decode. If there is one, it searches on for the next
// valid frame (every offset, the header checksum first: frames are bound to
// their segment's salt and their LSN, so no job body can pose as one) and
// goes on, to learn what follows the damage and which marks. Damage below
// the highest durable LSN that any of them states is refused (DamageError);
// damage above it is a torn tail, cut off with a warning. So damage in the
// last group commit before a crash — durable, but not yet stated by a mark
// — is taken for a torn tail: the unsynced window recovery cannot see into
// is one group commit.

// DamageError is ErrCorrupt for damage in the durable part of a segment: the
// log refuses to open (nothing was changed), and says where the damage is
// and what follows it.
type DamageError struct {
	Segment string // file name
	Offset  int64  // file offset of the first damaged byte
	LSN     LSN
	// DurableTo is the LSN up to which the segment is known durable (the
	// checkpoint, or the highest sync mark found).
	DurableTo LSN
	// After the damage: the valid records found, their bytes, and the file
	// offset where the next valid frame starts (-1: none) and where the
	// last one ends.
	RecordsAfter int
	BytesAfter   int64
	ResumeOffset int64
	EndOffset    int64
	// Cause says what is wrong with the frame at Offset.
	Cause string
}

func (e *DamageError) Error() string {
	after := "no valid record follows it"
	if e.RecordsAfter > 0 {
		after = fmt.Sprintf("%d valid records (%d bytes) follow it, from offset %d to %d",
			e.RecordsAfter, e.BytesAfter, e.ResumeOffset, e.EndOffset)
	}
	return fmt.Sprintf("%v: segment %s offset %d (lsn %d) is damaged (%s), inside the part known durable (up to lsn %d): "+
		"this is corruption, not a torn write; %s; nothing was changed",
		ErrCorrupt, e.Segment, e.Offset, e.LSN, e.Cause, e.DurableTo, after)
}

func (e *DamageError) Unwrap() error { return ErrCorrupt }

// tailPlan is what recovery found in the last segment and will do.
type tailPlan struct {
	// size is the segment's bytes of frames; keep is how many of them stay.
	size, keep int64
	// records is how many valid records the torn part held after the tear
	// (dropped with it).
	tornRecords int
	// whole is the segment file, read only when the tail needs repair.
	whole []byte
}

func (p tailPlan) torn() bool { return p.keep < p.size }

// planTail reads the last segment from the checkpoint (or its start) and
// decides: keep it whole, cut a torn tail, or refuse (DamageError, or
// ErrCorrupt when its end was lost below the checkpoint). It changes nothing.
func planTail(fs vfs.FS, dir string, seg segment, checkpoint LSN) (tailPlan, error) {
	name := segmentName(seg.first)
	if checkpoint > seg.end() {
		return tailPlan{}, fmt.Errorf("%w: segment %s ends at lsn %d, but the log's owner has applied it up to lsn %d: "+
			"the end of the log is missing (nothing was changed)", ErrCorrupt, name, seg.end(), checkpoint)
	}
	f, err := fs.Open(fs.PathJoin(dir, name))
	if err != nil {
		return tailPlan{}, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	defer f.Close()
	trusted := int64(0)
	if checkpoint > seg.first {
		trusted = int64(checkpoint - seg.first)
	}
	// The common case: only the part after the checkpoint is read.
	tail := make([]byte, seg.size-trusted)
	if _, err := f.ReadAt(tail, seg.hdr()+trusted); err != nil && !errors.Is(err, io.EOF) {
		return tailPlan{}, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	if seg.version == 1 {
		return planTailV1(f, seg, trusted, tail)
	}
	if sc := scanFrames(tail, seg, seg.first+LSN(trusted)); !sc.damaged {
		return tailPlan{size: seg.size, keep: seg.size}, nil
	}
	var whole tailPlan
	if err := readWhole(f, seg, &whole); err != nil {
		return tailPlan{}, err
	}
	return planWhole(seg, whole.whole, checkpoint)
}

// planWhole is planTail's decision for a segment that has damage after its
// checkpoint, given the whole file. The segment is read from its start, so
// that damage that began before the checkpoint is reported where it begins
// (and a checkpoint that falls inside a filler frame of a repair is no
// damage at all).
func planWhole(seg segment, whole []byte, checkpoint LSN) (tailPlan, error) {
	plan := tailPlan{size: int64(len(whole)) - seg.hdr(), whole: whole}
	sc := scanFrames(whole[seg.hdr():], seg, seg.first)
	if !sc.damaged {
		plan.keep = plan.size
		return plan, nil
	}
	durableTo := max(checkpoint, sc.marked)
	damageLSN := seg.first + LSN(sc.valid)
	if damageLSN < durableTo {
		return tailPlan{}, &DamageError{
			Segment: segmentName(seg.first), Offset: seg.fileOffset(damageLSN), LSN: damageLSN, DurableTo: durableTo,
			RecordsAfter: sc.recordsAfter, BytesAfter: sc.bytesAfter, Cause: sc.cause,
			ResumeOffset: offsetOrNone(seg, 0, sc.resume), EndOffset: seg.hdr() + sc.lastEnd,
		}
	}
	plan.keep = sc.valid
	plan.tornRecords = sc.recordsAfter
	return plan, nil
}

func offsetOrNone(seg segment, trusted, off int64) int64 {
	if off < 0 {
		return -1
	}
	return seg.hdr() + trusted + off
}

func readWhole(f vfs.File, seg segment, plan *tailPlan) error {
	plan.whole = make([]byte, seg.hdr()+seg.size)
	if _, err := f.ReadAt(plan.whole, 0); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("wal: read segment %s: %w", segmentName(seg.first), err)
	}
	return nil
}

// apply cuts the torn tail, keeping the original as NAME.broken.
func (p tailPlan) apply(fs vfs.FS, dir string, seg segment, logger *slog.Logger) error {
	if !p.torn() {
		return nil
	}
	name := segmentName(seg.first)
	path := fs.PathJoin(dir, name)
	logger.Warn("wal: truncating a torn tail: it was written after the last fsync and did not all reach the disk",
		"segment", name, "offset", seg.hdr()+p.keep, "dropped_bytes", p.size-p.keep,
		"dropped_records_after_the_tear", p.tornRecords, "kept_as", name+brokenSuffix)
	broken := fs.PathJoin(dir, name+brokenSuffix)
	if _, err := fs.Stat(broken); err == nil {
		if err := fs.Remove(broken); err != nil {
			return fmt.Errorf("wal: remove old %s: %w", broken, err)
		}
	}
	if err := fs.Link(path, broken); err != nil {
		// Write a copy: a vfs.File may scribble on the slice it is given,
		// and whole is written again below.
		if err := writeFileAtomic(fs, dir, name+brokenSuffix, bytes.Clone(p.whole)); err != nil {
			return fmt.Errorf("wal: keep %s: %w", broken, err)
		}
	}
	if err := writeFileAtomic(fs, dir, name, p.whole[:seg.hdr()+p.keep]); err != nil {
		return fmt.Errorf("wal: truncate %s: %w", name, err)
	}
	return nil
}

// frameScan is what scanFrames found in a run of format-2 frames.
type frameScan struct {
	// valid is the length of the run of whole valid frames at the start.
	valid int64
	// damaged: a frame at valid does not decode; cause says how.
	damaged bool
	cause   string
	// marked is the highest LSN a valid sync mark states, anywhere.
	marked LSN
	// After the damage: the offset of the first valid frame (-1: none),
	// the records found (marks not counted), their bytes, and the end of
	// the last valid frame.
	resume       int64
	recordsAfter int
	bytesAfter   int64
	lastEnd      int64
	// spans are the damaged byte ranges [start, end): from each frame that
	// does not decode to the next valid frame (or the end of b).
	spans [][2]int64
	// records counts the valid records (not marks) in b.
	records int
}

// scanFrames walks b, the frames of seg from LSN at on, and past the first
// damage searches for valid frames to the end.
func scanFrames(b []byte, seg segment, at LSN) frameScan {
	sc := frameScan{resume: -1}
	off := int64(0)
	walk := func(counting bool) {
		for off < int64(len(b)) {
			r, n, fe := seg.decode(b[off:], at+LSN(off))
			if fe != frameOK {
				if !sc.damaged {
					sc.cause = "bad checksum or type"
					if fe == frameShort {
						sc.cause = "cut short"
					}
				}
				return
			}
			if r.Type == MarkType {
				if s, ok := markSynced(r); ok {
					sc.marked = max(sc.marked, s)
				}
			} else {
				sc.records++
				if counting {
					sc.recordsAfter++
					sc.bytesAfter += int64(n)
				}
			}
			off += int64(n)
			if counting {
				sc.lastEnd = off
			}
		}
	}
	walk(false)
	sc.valid = off
	if off == int64(len(b)) {
		return sc
	}
	sc.damaged = true
	for {
		next := nextFrame(b, off+1, seg, at)
		if next < 0 {
			sc.spans = append(sc.spans, [2]int64{off, int64(len(b))})
			return sc
		}
		sc.spans = append(sc.spans, [2]int64{off, next})
		if sc.resume < 0 {
			sc.resume = next
		}
		off = next
		walk(true)
		if off == int64(len(b)) {
			return sc
		}
	}
}

// nextFrame returns the first offset at or after from where a whole valid
// frame of seg starts in b (whose first byte is at LSN at), or -1.
func nextFrame(b []byte, from int64, seg segment, at LSN) int64 {
	for o := from; o+frameHeaderSize <= int64(len(b)); o++ {
		if !headerOK(b[o:], seg.salt, at+LSN(o)) {
			continue
		}
		if _, _, fe := seg.decode(b[o:], at+LSN(o)); fe == frameOK {
			return o
		}
	}
	return -1
}

// planTailV1 is recovery for a last segment of format 1, which has no sync
// marks and cannot resynchronise: the checkpoint bounds the durable part,
// and a bad frame followed by a valid one is damage unless it holds a whole
// zeroed sector (how unsynced pages written back out of order look).
func planTailV1(f vfs.File, seg segment, trusted int64, tail []byte) (tailPlan, error) {
	plan := tailPlan{size: seg.size}
	if validFramesV1(tail) == len(tail) {
		plan.keep = seg.size
		return plan, nil
	}
	if err := readWhole(f, seg, &plan); err != nil {
		return tailPlan{}, err
	}
	name := segmentName(seg.first)
	frames := plan.whole[segmentHeaderSizeV1:]
	off := validFramesV1(frames)
	if int64(off) < trusted {
		return tailPlan{}, fmt.Errorf("%w: segment %s offset %d (lsn %d): bad record below the checkpoint (lsn %d); nothing was changed",
			ErrCorrupt, name, segmentHeaderSizeV1+off, uint64(seg.first)+uint64(off), uint64(seg.first)+uint64(trusted))
	}
	if _, _, fe := decodeFrameV1(frames[off:]); fe == frameBad && validFrameFollowsV1(frames, off) && !tornSector(plan.whole, segmentHeaderSizeV1+off) {
		return tailPlan{}, fmt.Errorf("%w: segment %s offset %d (lsn %d): bad record followed by valid ones; nothing was changed",
			ErrCorrupt, name, segmentHeaderSizeV1+off, uint64(seg.first)+uint64(off))
	}
	plan.keep = int64(off)
	return plan, nil
}

// sectorSize is the unit a disk writes atomically; unsynced pages can reach
// the disk in any order, so a crash can leave whole zeroed sectors inside
// the unsynced tail.
const sectorSize = 512

// validFramesV1 returns the length of the run of whole, valid format-1
// frames at the start of frames.
func validFramesV1(frames []byte) int {
	off := 0
	for off < len(frames) {
		_, n, fe := decodeFrameV1(frames[off:])
		if fe != frameOK {
			break
		}
		off += n
	}
	return off
}

// tornSector reports whether the format-1 frame starting at file offset
// start (its claimed extent, or to the end of the file) contains a whole,
// aligned, all-zero sector: the mark of a write torn by a crash, not of a bit
// flip (as etcd's WAL decides).
func tornSector(file []byte, start int) bool {
	end := len(file)
	if start+frameHeaderSizeV1 <= len(file) {
		n := int(le32(file[start:]))
		if n <= MaxPayload && start+frameHeaderSizeV1+n < end {
			end = start + frameHeaderSizeV1 + n
		}
	}
	for sec := (start + sectorSize - 1) / sectorSize * sectorSize; sec+sectorSize <= end; sec += sectorSize {
		if allZero(file[sec : sec+sectorSize]) {
			return true
		}
	}
	return false
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

// validFrameFollowsV1 reports whether the bad format-1 frame at off claims a
// length that ends inside frames at the start of a valid frame: the mark of a
// damaged record in the middle of the log rather than a torn write at its end.
func validFrameFollowsV1(frames []byte, off int) bool {
	if len(frames)-off < frameHeaderSizeV1 {
		return false
	}
	n := int(le32(frames[off:]))
	next := off + frameHeaderSizeV1 + n
	if n > MaxPayload || next >= len(frames) {
		return false
	}
	_, _, fe := decodeFrameV1(frames[next:])
	return fe == frameOK
}

// rewritten returns the last segment's file as it is to be after a failed
// fsync: cut back to u.Synced with u.Data after it (see Log.Unsynced); nil
// if u concerns a segment since sealed and only cut it.
func rewritten(fs vfs.FS, dir string, last segment, u *Unsynced) ([]byte, error) {
	name := segmentName(last.first)
	switch {
	case u.Segment != last.first:
		if u.Segment < last.first && len(u.Data) == 0 {
			return nil, nil // only a cut, in a segment since sealed: nothing to do
		}
		return nil, fmt.Errorf("%w: it began at lsn %d, the last segment is %s", errNoUnsyncedSegment, u.Segment, name)
	case u.Synced < last.first:
		return nil, fmt.Errorf("wal: rewrite after a failed fsync: durable end %d is before segment %s", u.Synced, name)
	case u.Synced > last.end():
		return nil, fmt.Errorf("%w: segment %s ends at lsn %d, before the lsn %d a completed fsync made durable",
			ErrCorrupt, name, last.end(), u.Synced)
	}
	f, err := fs.Open(fs.PathJoin(dir, name))
	if err != nil {
		return nil, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	keep := make([]byte, last.fileOffset(u.Synced))
	_, err = f.ReadAt(keep, 0)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	return append(keep, u.Data...), nil
}
