package wal

import (
	"errors"
	"fmt"
	"io"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// Offline checks and repair, for `diskque-server check`: a whole segment
// read and every damaged span in it found (Verify stops at the first), and
// damaged spans of format-2 segments replaced by filler frames so that every
// record after them keeps its LSN and stays readable.

// Damage is one damaged span of a segment: from a frame that does not decode
// to the next valid frame (or the segment's end).
type Damage struct {
	Offset int64 // file offset of the first damaged byte
	LSN    LSN
	Len    int64 // bytes up to the next valid frame or the end
	// ToEnd: no valid frame follows the damage.
	ToEnd bool
}

// SegmentReport is what CheckSegment found in one segment.
type SegmentReport struct {
	SegmentInfo
	// Records counts the valid records (sync marks not counted).
	Records int
	// Damage lists the damaged spans, in order.
	Damage []Damage
	// Repairable: every span can be replaced by a filler frame (format 2,
	// and each span at least a frame header long).
	Repairable bool
}

// CheckSegment reads the whole segment starting at first and reports every
// valid record and damaged span in it. A format-1 segment cannot be searched
// past damage: its one span runs to the end.
func (l *Log) CheckSegment(first LSN) (SegmentReport, error) {
	seg, _, _, err := l.segmentAt(first)
	if err != nil {
		return SegmentReport{}, err
	}
	return checkSegment(l.opts.FS, l.dir, seg)
}

func checkSegment(fs vfs.FS, dir string, seg segment) (SegmentReport, error) {
	rep := SegmentReport{SegmentInfo: SegmentInfo{First: seg.first, Size: seg.size, Name: segmentName(seg.first),
		Version: int(seg.version)}}
	f, err := fs.Open(fs.PathJoin(dir, rep.Name))
	if err != nil {
		return rep, fmt.Errorf("wal: open segment %s: %w", rep.Name, err)
	}
	defer f.Close()
	b := make([]byte, seg.size)
	if _, err := f.ReadAt(b, seg.hdr()); err != nil && !errors.Is(err, io.EOF) {
		return rep, fmt.Errorf("wal: read segment %s: %w", rep.Name, err)
	}
	span := func(start, end int64) Damage {
		return Damage{Offset: seg.hdr() + start, LSN: seg.first + LSN(start), Len: end - start, ToEnd: end == int64(len(b))}
	}
	if seg.version == 1 {
		off := 0
		for off < len(b) {
			_, n, fe := decodeFrameV1(b[off:])
			if fe != frameOK {
				rep.Damage = append(rep.Damage, span(int64(off), int64(len(b))))
				break
			}
			rep.Records++
			off += n
		}
		return rep, nil
	}
	sc := scanFrames(b, seg, seg.first)
	rep.Records = sc.records
	rep.Repairable = true
	for _, sp := range sc.spans {
		d := span(sp[0], sp[1])
		rep.Damage = append(rep.Damage, d)
		if d.Len < frameHeaderSize {
			rep.Repairable = false
		}
	}
	return rep, nil
}

// RepairSegment replaces every damaged span of the format-2 segment starting
// at first in the log directory dir (no log may have it open) with filler
// frames of the same length — frames of the log's own type that no reader
// returns — so that the records after the damage keep their LSNs and read
// as before. The records in the spans are lost. A span is split so that a
// filler starts at each of bounds that falls inside it: the LSN its owner
// replays from (storage's checkpoint) must be a frame boundary. The
// original is kept as NAME.broken. It returns what it found.
func RepairSegment(fs vfs.FS, dir string, first LSN, bounds ...LSN) (SegmentReport, error) {
	seg, err := statSegment(fs, dir, first)
	if err != nil {
		return SegmentReport{}, err
	}
	rep, err := checkSegment(fs, dir, seg)
	if err != nil || len(rep.Damage) == 0 {
		return rep, err
	}
	if !rep.Repairable {
		return rep, fmt.Errorf("wal: segment %s cannot be repaired in place (format %d, or a damaged span shorter than a frame header)",
			rep.Name, rep.Version)
	}
	name := segmentName(first)
	path := fs.PathJoin(dir, name)
	f, err := fs.Open(path)
	if err != nil {
		return rep, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	whole := make([]byte, seg.hdr()+seg.size)
	_, err = f.ReadAt(whole, 0)
	f.Close()
	if err != nil && !errors.Is(err, io.EOF) {
		return rep, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	var fillers [][2]LSN // [start, end)
	for _, d := range rep.Damage {
		at := d.LSN
		for _, b := range bounds {
			if b > at && b < d.LSN+LSN(d.Len) {
				fillers = append(fillers, [2]LSN{at, b})
				at = b
			}
		}
		fillers = append(fillers, [2]LSN{at, d.LSN + LSN(d.Len)})
	}
	for _, f := range fillers {
		if f[1]-f[0] < frameHeaderSize {
			return rep, fmt.Errorf("wal: segment %s cannot be repaired in place: a filler from lsn %d would be %d bytes, under a frame header",
				rep.Name, f[0], f[1]-f[0])
		}
	}
	if err := writeFileAtomic(fs, dir, name+brokenSuffix, append([]byte(nil), whole...)); err != nil {
		return rep, fmt.Errorf("wal: keep %s: %w", name+brokenSuffix, err)
	}
	for _, f := range fillers {
		filler := appendFrame(nil, Record{Type: MarkType, Payload: make([]byte, f[1]-f[0]-frameHeaderSize)}, seg.salt, f[0])
		copy(whole[seg.fileOffset(f[0]):], filler)
	}
	if err := writeFileAtomic(fs, dir, name, whole); err != nil {
		return rep, fmt.Errorf("wal: repair %s: %w", path, err)
	}
	return rep, nil
}

// Segment files of a log directory, for offline tools.

// ListSegments returns the segments in dir, in log order, without opening
// the log or changing anything.
func ListSegments(fs vfs.FS, dir string) ([]SegmentInfo, error) {
	segs, _, err := listSegments(fs, dir)
	if err != nil {
		return nil, err
	}
	out := make([]SegmentInfo, len(segs))
	for i, s := range segs {
		out[i] = SegmentInfo{First: s.first, Size: s.size, Name: segmentName(s.first), Version: int(s.version)}
	}
	return out, nil
}
