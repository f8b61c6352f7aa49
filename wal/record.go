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
// reserved so that zeroed bytes never decode as a record.
type RecordType uint8

// Record is one entry of the log.
type Record struct {
	Type    RecordType
	Payload []byte
}

const (
	// frameHeaderSize is length(4) + crc32c(4) + type(1).
	frameHeaderSize = 9
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
	// (or does not yet) hold.
	ErrNotFound = errors.New("wal: no record at lsn")
	// errTooLarge is returned for a payload over MaxPayload.
	errTooLarge = errors.New("wal: record payload too large")
)

// frameSize is the bytes a record with this payload occupies in the log.
func frameSize(payloadLen int) int64 { return frameHeaderSize + int64(payloadLen) }

// FrameSize is the LSN distance from a record with this payload length to the
// next record.
func FrameSize(payloadLen int) LSN { return LSN(frameSize(payloadLen)) }

// frameLen reads the payload length from the start of a frame header.
func frameLen(hdr []byte) int64 { return int64(binary.LittleEndian.Uint32(hdr[0:4])) }

// appendFrame appends r's frame to dst.
func appendFrame(dst []byte, r Record) []byte {
	var hdr [frameHeaderSize]byte
	binary.LittleEndian.PutUint32(hdr[0:4], uint32(len(r.Payload)))
	hdr[8] = byte(r.Type)
	crc := crc32.Update(0, castagnoli, hdr[0:4])
	crc = crc32.Update(crc, castagnoli, hdr[8:9])
	crc = crc32.Update(crc, castagnoli, r.Payload)
	binary.LittleEndian.PutUint32(hdr[4:8], crc)
	dst = append(dst, hdr[:]...)
	return append(dst, r.Payload...)
}

// frameError says why bytes do not decode as a frame.
type frameError int

const (
	frameOK frameError = iota
	// frameShort: fewer bytes than the header, or than the header's length.
	frameShort
	// frameBad: a full frame whose type or checksum is wrong.
	frameBad
)

// DecodeFrame decodes the frame at the start of b. It returns the record (its
// payload aliases b), the frame's size, and an error wrapping ErrCorrupt when
// b does not start with a whole, valid frame.
func DecodeFrame(b []byte) (Record, int, error) {
	r, n, fe := decodeFrame(b)
	switch fe {
	case frameShort:
		return Record{}, 0, fmt.Errorf("%w: short frame (%d bytes)", ErrCorrupt, len(b))
	case frameBad:
		return Record{}, 0, fmt.Errorf("%w: bad checksum or type", ErrCorrupt)
	}
	return r, n, nil
}

func decodeFrame(b []byte) (Record, int, frameError) {
	if len(b) < frameHeaderSize {
		return Record{}, 0, frameShort
	}
	n := binary.LittleEndian.Uint32(b[0:4])
	if uint64(n) > uint64(len(b)-frameHeaderSize) {
		if n > MaxPayload {
			return Record{}, 0, frameBad
		}
		return Record{}, 0, frameShort
	}
	end := frameHeaderSize + int(n)
	crc := crc32.Update(0, castagnoli, b[0:4])
	crc = crc32.Update(crc, castagnoli, b[8:end])
	if b[8] == 0 || crc != binary.LittleEndian.Uint32(b[4:8]) {
		return Record{}, 0, frameBad
	}
	return Record{Type: RecordType(b[8]), Payload: b[frameHeaderSize:end]}, end, frameOK
}
