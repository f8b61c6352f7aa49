package wal

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
)

// LSN is a record's address: the byte offset of its frame in the logical log.
type LSN uint64

// RecordType tags a record's payload. The log does not interpret it; 0 is
// reserved so that zeroed bytes never decode as a record, and MarkType is the
// log's own.
type RecordType uint8

// MarkType is the type of the log's sync marks (see the package doc). Append
// refuses it; Replay, ScanSegment and Verify skip marks, so callers never see
// one.
const MarkType RecordType = 0xff

// Record is one entry of the log.
type Record struct {
	Type    RecordType
	Payload []byte
}

const (
	// frameHeaderSize is the header of a frame in a format-2 segment:
	// header crc(4) + length(4) + type(1) + payload crc(4).
	frameHeaderSize = 13
	// frameHeaderSizeV1 is the header of a frame in a format-1 segment:
	// length(4) + crc32c(4) + type(1).
	frameHeaderSizeV1 = 9
	// markPayloadSize is a sync mark's payload: the synced LSN.
	markPayloadSize = 8
	// MaxPayload is the largest payload one record may carry.
	MaxPayload = 1 << 30
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors returned by the log.
var (
	// ErrCorrupt is returned when a record fails its checksum or framing
	// somewhere other than the torn tail of the last segment. It is wrapped
	// with the segment and offset.
	ErrCorrupt = errors.New("wal: corrupt record")
	// ErrPoisoned is returned by every call after a write or fsync failed.
	ErrPoisoned = errors.New("wal: log failed earlier")
	// ErrClosed is returned by calls on a closed log.
	ErrClosed = errors.New("wal: log closed")
	// ErrNotFound is returned by Read and Replay for an LSN the log no longer
	// (or does not yet) hold, including one whose segment was removed while
	// the caller held the LSN.
	ErrNotFound = errors.New("wal: no record at lsn")
	// ErrReadOnly is returned by writes to a log opened with ReadOnly.
	ErrReadOnly = errors.New("wal: log opened read-only")
	// errTooLarge is returned for a payload over MaxPayload.
	errTooLarge = errors.New("wal: record payload too large")
)

// frameSize is the bytes a record with this payload occupies in a format-2
// segment.
func frameSize(payloadLen int) int64 { return frameHeaderSize + int64(payloadLen) }

// FrameSize is the LSN distance from a record with this payload length to the
// next record, in the segments this build writes. Replay gives each record's
// end, which also holds for segments of an older format.
func FrameSize(payloadLen int) LSN { return LSN(frameSize(payloadLen)) }

// frameLen reads the payload length from a format-2 frame header.
func frameLen(hdr []byte) int64 { return int64(binary.LittleEndian.Uint32(hdr[4:8])) }

// headerCRC is the checksum of a format-2 frame header: it covers the
// segment's salt and the frame's LSN, neither of which is stored in the
// frame, so a frame is valid only in its own segment and at its own place —
// bytes of a job body that happen to look like a frame, or a frame of
// another log, never are.
//
// It is the Castagnoli CRC of salt, lsn (both little-endian) and hdr[4:13],
// 25 bytes, computed here eight bytes a step with slicing-by-8 tables, not
// through crc32.Update: a slice of a local array handed to it escapes (its
// hardware path is called through a function value), which made every
// record written and read allocate, and for 9 bytes its call and dispatch
// cost more than the table steps. The checksums are the same as ever.
func headerCRC(salt uint64, lsn LSN, hdr []byte) uint32 {
	_ = hdr[frameHeaderSize-1]
	crc := ^uint32(0) // crc32.Update's pre- and post-inversion, by hand
	crc = crc8(crc, salt)
	crc = crc8(crc, uint64(lsn))
	crc = crc8(crc, binary.LittleEndian.Uint64(hdr[4:12]))
	crc = castagnoli8[0][byte(crc)^hdr[12]] ^ crc>>8
	return ^crc
}

// crc8 advances a (pre-inverted) Castagnoli CRC over v's eight bytes,
// little-endian.
func crc8(crc uint32, v uint64) uint32 {
	lo := crc ^ uint32(v)
	hi := uint32(v >> 32)
	t := &castagnoli8
	return t[7][byte(lo)] ^ t[6][byte(lo>>8)] ^ t[5][byte(lo>>16)] ^ t[4][lo>>24] ^
		t[3][byte(hi)] ^ t[2][byte(hi>>8)] ^ t[1][byte(hi>>16)] ^ t[0][hi>>24]
}

// castagnoli8 are the slicing-by-8 tables of the Castagnoli polynomial:
// castagnoli8[0] is the byte-at-a-time table, and castagnoli8[k][b] the CRC
// of byte b followed by k zero bytes.
var castagnoli8 = func() (t [8][256]uint32) {
	t[0] = *castagnoli
	for k := 1; k < 8; k++ {
		for b := range 256 {
			prev := t[k-1][b]
			t[k][b] = t[0][byte(prev)] ^ prev>>8
		}
	}
	return t
}()

// appendFrame appends r's format-2 frame, to lie at lsn in a segment with
// salt, to dst.
func appendFrame(dst []byte, r Record, salt uint64, lsn LSN) []byte {
	n := len(dst)
	dst = append(dst, make([]byte, frameHeaderSize)...)
	hdr := dst[n:]
	binary.LittleEndian.PutUint32(hdr[4:8], uint32(len(r.Payload)))
	hdr[8] = byte(r.Type)
	binary.LittleEndian.PutUint32(hdr[9:13], crc32.Checksum(r.Payload, castagnoli))
	binary.LittleEndian.PutUint32(hdr[0:4], headerCRC(salt, lsn, hdr))
	return append(dst, r.Payload...)
}

// appendMark appends a sync mark saying that every byte of the log below
// synced is durable.
func appendMark(dst []byte, synced LSN, salt uint64, lsn LSN) []byte {
	var p [markPayloadSize]byte
	binary.BigEndian.PutUint64(p[:], uint64(synced))
	return appendFrame(dst, Record{Type: MarkType, Payload: p[:]}, salt, lsn)
}

// markSynced returns the LSN a sync mark's payload states; ok is false for a
// malformed mark.
func markSynced(r Record) (LSN, bool) {
	if r.Type != MarkType || len(r.Payload) != markPayloadSize {
		return 0, false
	}
	return LSN(binary.BigEndian.Uint64(r.Payload)), true
}

// frameError says why bytes do not decode as a frame.
type frameError int

const (
	frameOK frameError = iota
	// frameShort: fewer bytes than the header, or than the header's length.
	frameShort
	// frameBad: a full frame (or header) whose type or checksum is wrong.
	frameBad
)

// decodeFrame decodes the frame at the start of b, which lies at lsn in a
// segment of format version with salt (ignored by format 1).
func decodeFrame(b []byte, version uint8, salt uint64, lsn LSN) (Record, int, frameError) {
	if version == 1 {
		return decodeFrameV1(b)
	}
	if len(b) < frameHeaderSize {
		return Record{}, 0, frameShort
	}
	if headerCRC(salt, lsn, b) != binary.LittleEndian.Uint32(b[0:4]) || b[8] == 0 {
		return Record{}, 0, frameBad
	}
	n := binary.LittleEndian.Uint32(b[4:8])
	if n > MaxPayload {
		return Record{}, 0, frameBad
	}
	if uint64(n) > uint64(len(b)-frameHeaderSize) {
		return Record{}, 0, frameShort
	}
	end := frameHeaderSize + int(n)
	if crc32.Checksum(b[frameHeaderSize:end], castagnoli) != binary.LittleEndian.Uint32(b[9:13]) {
		return Record{}, 0, frameBad
	}
	return Record{Type: RecordType(b[8]), Payload: b[frameHeaderSize:end]}, end, frameOK
}

// headerOK reports whether b starts with a format-2 frame header that checks
// out for lsn: the cheap half of a frame check, which the search for the next
// frame after damage (nextFrame) tries at every offset.
func headerOK(b []byte, salt uint64, lsn LSN) bool {
	return len(b) >= frameHeaderSize && b[8] != 0 &&
		binary.LittleEndian.Uint32(b[4:8]) <= MaxPayload &&
		headerCRC(salt, lsn, b) == binary.LittleEndian.Uint32(b[0:4])
}

// appendFrameV1 appends r's format-1 frame to dst. The log no longer writes
// format 1; tests use it to build old logs.
func appendFrameV1(dst []byte, r Record) []byte {
	var hdr [frameHeaderSizeV1]byte
	binary.LittleEndian.PutUint32(hdr[0:4], uint32(len(r.Payload)))
	hdr[8] = byte(r.Type)
	crc := crc32.Update(0, castagnoli, hdr[0:4])
	crc = crc32.Update(crc, castagnoli, hdr[8:9])
	crc = crc32.Update(crc, castagnoli, r.Payload)
	binary.LittleEndian.PutUint32(hdr[4:8], crc)
	dst = append(dst, hdr[:]...)
	return append(dst, r.Payload...)
}

func decodeFrameV1(b []byte) (Record, int, frameError) {
	if len(b) < frameHeaderSizeV1 {
		return Record{}, 0, frameShort
	}
	n := binary.LittleEndian.Uint32(b[0:4])
	if uint64(n) > uint64(len(b)-frameHeaderSizeV1) {
		if n > MaxPayload {
			return Record{}, 0, frameBad
		}
		return Record{}, 0, frameShort
	}
	end := frameHeaderSizeV1 + int(n)
	crc := crc32.Update(0, castagnoli, b[0:4])
	crc = crc32.Update(crc, castagnoli, b[8:end])
	if b[8] == 0 || crc != binary.LittleEndian.Uint32(b[4:8]) {
		return Record{}, 0, frameBad
	}
	return Record{Type: RecordType(b[8]), Payload: b[frameHeaderSizeV1:end]}, end, frameOK
}

// DecodeFrame decodes the format-2 frame at the start of b, which lies at
// lsn in a segment with salt. It returns the record (its payload aliases b),
// the frame's size, and an error wrapping ErrCorrupt when b does not start
// with a whole, valid frame.
func DecodeFrame(b []byte, salt uint64, lsn LSN) (Record, int, error) {
	r, n, fe := decodeFrame(b, formatVersion, salt, lsn)
	switch fe {
	case frameShort:
		return Record{}, 0, fmt.Errorf("%w: short frame (%d bytes)", ErrCorrupt, len(b))
	case frameBad:
		return Record{}, 0, fmt.Errorf("%w: bad checksum or type", ErrCorrupt)
	}
	return r, n, nil
}
