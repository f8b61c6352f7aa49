package wal

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
)

const (
	segmentSuffix = ".wal"
	tmpSuffix     = durable.TmpSuffix
	brokenSuffix  = ".broken"
	// formatVersion is the segment format this build writes. Format 1
	// (flat len|crc|type frames after a 16-byte header) is still read.
	formatVersion = 2
	// segmentHeaderSize is a format-2 header: magic, first LSN, salt.
	segmentHeaderSize = 24
	// segmentHeaderSizeV1 is a format-1 header: magic, first LSN.
	segmentHeaderSizeV1 = 16
)

// segmentMagic is the first 7 bytes of every segment; the 8th is its format.
var segmentMagic = [7]byte{'d', 'q', 'w', 'a', 'l', 0, 0}

// segmentName is the file name of the segment whose first LSN is first.
func segmentName(first LSN) string { return fmt.Sprintf("%016x%s", uint64(first), segmentSuffix) }

// parseSegmentName is the inverse of segmentName; ok is false for any other
// file name (temporary and .broken files included).
func parseSegmentName(name string) (first LSN, ok bool) {
	hex, found := strings.CutSuffix(name, segmentSuffix)
	if !found || len(hex) != 16 {
		return 0, false
	}
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil || strings.ToLower(hex) != hex {
		return 0, false
	}
	return LSN(v), true
}

// segment is one file of the log, as known to the Log.
type segment struct {
	first   LSN   // LSN of the first frame
	size    int64 // bytes of frames (file size minus the header)
	version uint8 // 1 or 2 (formatVersion)
	salt    uint64
}

func (s segment) end() LSN { return s.first + LSN(s.size) }

// hdr is the size of the segment's header: frame bytes start there.
func (s segment) hdr() int64 {
	if s.version == 1 {
		return segmentHeaderSizeV1
	}
	return segmentHeaderSize
}

// fileOffset is the offset in the segment's file of the frame at lsn.
func (s segment) fileOffset(lsn LSN) int64 { return s.hdr() + int64(lsn-s.first) }

// frameHeader is the size of a frame header in this segment.
func (s segment) frameHeader() int {
	if s.version == 1 {
		return frameHeaderSizeV1
	}
	return frameHeaderSize
}

// decode decodes the frame at lsn from b, which starts there.
func (s segment) decode(b []byte, lsn LSN) (Record, int, frameError) {
	return decodeFrame(b, s.version, s.salt, lsn)
}

// segmentHeader is the format-2 header of a segment starting at first.
func segmentHeader(first LSN, salt uint64) []byte {
	h := make([]byte, segmentHeaderSize)
	copy(h, segmentMagic[:])
	h[7] = formatVersion
	binary.BigEndian.PutUint64(h[8:16], uint64(first))
	binary.BigEndian.PutUint64(h[16:24], salt)
	return h
}

// segmentHeaderV1 is a format-1 header (tests build old logs with it).
func segmentHeaderV1(first LSN) []byte {
	h := make([]byte, segmentHeaderSizeV1)
	copy(h, segmentMagic[:])
	h[7] = 1
	binary.BigEndian.PutUint64(h[8:16], uint64(first))
	return h
}

// newSalt returns a random segment salt.
func newSalt() uint64 {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux (Go >= 1.24)
	return binary.LittleEndian.Uint64(b[:])
}

// parseSegmentHeader checks a segment file's header against its name and
// returns the segment's format and salt. h holds at least the file's first
// segmentHeaderSize bytes, or all of it if shorter.
func parseSegmentHeader(h []byte, first LSN) (version uint8, salt uint64, err error) {
	if len(h) < segmentHeaderSizeV1 || !bytes.Equal(h[:7], segmentMagic[:]) {
		return 0, 0, fmt.Errorf("%w: bad segment header", ErrCorrupt)
	}
	version = h[7]
	switch {
	case version == 1:
	case version == formatVersion && len(h) >= segmentHeaderSize:
		salt = binary.BigEndian.Uint64(h[16:24])
	case version == formatVersion:
		return 0, 0, fmt.Errorf("%w: segment header cut short (%d bytes)", ErrCorrupt, len(h))
	default:
		return 0, 0, fmt.Errorf("%w: segment format %d, this build reads 1 and %d", ErrCorrupt, version, formatVersion)
	}
	if got := LSN(binary.BigEndian.Uint64(h[8:16])); got != first {
		return 0, 0, fmt.Errorf("%w: segment header says first lsn %d, name says %d", ErrCorrupt, got, first)
	}
	return version, salt, nil
}

// listSegments returns the directory's segments in log order, their format
// and salt read from their headers, and the stale temporary files a crash
// during segment creation or repair left (Open removes them once it has
// decided to open the log: a refused Open changes nothing).
func listSegments(fs vfs.FS, dir string) (segs []segment, stale []string, err error) {
	names, err := fs.List(dir)
	if err != nil {
		return nil, nil, fmt.Errorf("wal: list %s: %w", dir, err)
	}
	for _, name := range names {
		if strings.HasSuffix(name, tmpSuffix) {
			stale = append(stale, name)
			continue
		}
		first, ok := parseSegmentName(name)
		if !ok {
			continue
		}
		seg, err := statSegment(fs, dir, first)
		if err != nil {
			return nil, nil, err
		}
		segs = append(segs, seg)
	}
	slices.SortFunc(segs, func(a, b segment) int { return cmpLSN(a.first, b.first) })
	return segs, stale, nil
}

// statSegment reads the header and size of the segment starting at first.
func statSegment(fs vfs.FS, dir string, first LSN) (segment, error) {
	name := segmentName(first)
	f, err := fs.Open(fs.PathJoin(dir, name))
	if err != nil {
		return segment{}, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return segment{}, fmt.Errorf("wal: stat segment %s: %w", name, err)
	}
	h := make([]byte, min(st.Size(), segmentHeaderSize))
	if _, err := f.ReadAt(h, 0); err != nil && !errors.Is(err, io.EOF) {
		return segment{}, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	version, salt, err := parseSegmentHeader(h, first)
	if err != nil {
		return segment{}, fmt.Errorf("%w (segment %s)", err, name)
	}
	seg := segment{first: first, version: version, salt: salt}
	seg.size = st.Size() - seg.hdr()
	return seg, nil
}

// removeStale removes the stale temporary files listSegments found.
func removeStale(fs vfs.FS, dir string, stale []string) error {
	for _, name := range stale {
		if err := fs.Remove(fs.PathJoin(dir, name)); err != nil && !isNotExist(err) {
			return fmt.Errorf("wal: remove stale %s: %w", name, err)
		}
	}
	return nil
}

func cmpLSN(a, b LSN) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// writeFileAtomic makes dir/name hold exactly data, crash-safely
// (durable.WriteFile).
func writeFileAtomic(fs vfs.FS, dir, name string, data []byte) error {
	return durable.WriteFile(fs, fs.PathJoin(dir, name), data, 0)
}

// createSegment makes a new, empty segment crash-safely and opens it for
// appending.
func createSegment(fs vfs.FS, dir string, first LSN, salt uint64) (vfs.File, error) {
	name := segmentName(first)
	if err := writeFileAtomic(fs, dir, name, segmentHeader(first, salt)); err != nil {
		return nil, fmt.Errorf("wal: create segment %s: %w", name, err)
	}
	return openForAppend(fs, dir, name)
}

// openForAppend opens an existing segment with its write offset at the end.
func openForAppend(fs vfs.FS, dir, name string) (vfs.File, error) {
	path := fs.PathJoin(dir, name)
	f, err := fs.OpenReadWrite(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return nil, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("wal: stat segment %s: %w", name, err)
	}
	return &appendFile{File: f, off: st.Size()}, nil
}

// appendFile turns positional writes into appends: OpenReadWrite does not
// promise that Write starts at the end of an existing file.
type appendFile struct {
	vfs.File
	off int64
}

func (a *appendFile) Write(p []byte) (int, error) {
	n, err := a.File.WriteAt(p, a.off)
	a.off += int64(n)
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return n, err
}

// isNotExist reports whether err says a file does not exist.
func isNotExist(err error) bool { return errors.Is(err, os.ErrNotExist) }

// payloadLen reads the payload length from a frame header of this segment.
func (s segment) payloadLen(hdr []byte) int64 {
	if s.version == 1 {
		return int64(le32(hdr[0:4]))
	}
	return frameLen(hdr)
}
