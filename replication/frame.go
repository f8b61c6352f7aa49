package replication

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/klauspost/compress/s2"
)

// A frame is one bus message on a TCP link (doc.go "Frames"):
//
//	0       4       8      9       10
//	+-------+-------+------+-------+----------------------+
//	| len   | crc   | type | flags | body (len bytes)     |
//	+-------+-------+------+-------+----------------------+
//
// len is the body's length on the wire (big-endian uint32), crc the CRC-32C
// (Castagnoli) of len, type, flags and body, so a corrupted length is caught
// too, once the body is read. flags bit 0 says the body is s2-compressed
// (block format); the other bits are zero. type 0 is never sent.
const (
	frameHeaderLen = 10
	// frameCompressed: the body is an s2 block holding the payload.
	frameCompressed byte = 1 << 0
	frameKnownFlags      = frameCompressed
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// errMalformedFrame is wrapped by every decoding error: a peer sent bytes
// that are not a frame. The link is closed.
var errMalformedFrame = errors.New("replication: malformed bus frame")

// frameCRC is the checksum of a frame whose header is hdr (crc field
// ignored) and whose body is body.
func frameCRC(hdr []byte, body []byte) uint32 {
	c := crc32.Update(0, crcTable, hdr[0:4])
	c = crc32.Update(c, crcTable, hdr[8:10])
	return crc32.Update(c, crcTable, body)
}

// frameWriter encodes messages as frames onto a buffered writer,
// compressing payloads longer than compressAbove when that makes them
// smaller. Not safe for concurrent use: one per link, owned by its writer.
type frameWriter struct {
	w             *bufio.Writer
	compressAbove int // 0 or less: never compress
	scratch       []byte
}

// writeFrame encodes one message; it returns the frame's length on the
// wire. The caller bounds len(payload) (Send checks MaxFrame).
func (fw *frameWriter) writeFrame(typ MsgType, payload []byte) (int, error) {
	body, flags := payload, byte(0)
	if fw.compressAbove > 0 && len(payload) > fw.compressAbove {
		need := s2.MaxEncodedLen(len(payload))
		if need > 0 {
			if cap(fw.scratch) < need {
				fw.scratch = make([]byte, need)
			}
			enc := s2.Encode(fw.scratch[:need], payload)
			if len(enc) < len(payload) {
				body, flags = enc, frameCompressed
			}
		}
	}
	var hdr [frameHeaderLen]byte
	binary.BigEndian.PutUint32(hdr[0:4], uint32(len(body)))
	hdr[8] = byte(typ)
	hdr[9] = flags
	binary.BigEndian.PutUint32(hdr[4:8], frameCRC(hdr[:], body))
	if _, err := fw.w.Write(hdr[:]); err != nil {
		return 0, err
	}
	if _, err := fw.w.Write(body); err != nil {
		return 0, err
	}
	// A compression buffer kept after one huge payload would pin its
	// memory for the life of the link.
	if cap(fw.scratch) > 1<<20 {
		fw.scratch = nil
	}
	return frameHeaderLen + len(body), nil
}

// frameReader decodes frames from a link. maxFrame bounds both the body on
// the wire and the decompressed payload, so a peer can make it allocate at
// most maxFrame bytes per frame (plus a scratch buffer of the same bound
// for compressed bodies). Not safe for concurrent use.
type frameReader struct {
	r        io.Reader
	maxFrame int
	scratch  []byte // compressed bodies are read here
}

// readFrame returns the next message, its length on the wire, and an error
// wrapping errMalformedFrame if the bytes are not a valid frame, or the
// reader's error (io.EOF at a clean end between frames). The payload is
// freshly allocated: the caller may keep it.
func (fr *frameReader) readFrame() (Message, int, error) {
	var hdr [frameHeaderLen]byte
	if _, err := io.ReadFull(fr.r, hdr[:]); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) {
			return Message{}, 0, fmt.Errorf("%w: torn header", errMalformedFrame)
		}
		return Message{}, 0, err
	}
	n := binary.BigEndian.Uint32(hdr[0:4])
	typ, flags := MsgType(hdr[8]), hdr[9]
	switch {
	case uint64(n) > uint64(fr.maxFrame):
		return Message{}, 0, fmt.Errorf("%w: body of %d bytes exceeds the frame limit %d", errMalformedFrame, n, fr.maxFrame)
	case typ == 0:
		return Message{}, 0, fmt.Errorf("%w: message type 0", errMalformedFrame)
	case flags&^frameKnownFlags != 0:
		return Message{}, 0, fmt.Errorf("%w: unknown flags %#x", errMalformedFrame, flags)
	}
	var body []byte
	if flags&frameCompressed != 0 {
		if cap(fr.scratch) < int(n) {
			fr.scratch = make([]byte, n)
		}
		body = fr.scratch[:n]
	} else {
		body = make([]byte, n)
	}
	if _, err := io.ReadFull(fr.r, body); err != nil {
		if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
			return Message{}, 0, fmt.Errorf("%w: torn body", errMalformedFrame)
		}
		return Message{}, 0, err
	}
	if got, want := frameCRC(hdr[:], body), binary.BigEndian.Uint32(hdr[4:8]); got != want {
		return Message{}, 0, fmt.Errorf("%w: checksum %#08x, header says %#08x", errMalformedFrame, got, want)
	}
	wire := frameHeaderLen + int(n)
	if flags&frameCompressed == 0 {
		return Message{Type: typ, Payload: body}, wire, nil
	}
	size, err := s2.DecodedLen(body)
	if err != nil {
		return Message{}, 0, fmt.Errorf("%w: compressed body: %v", errMalformedFrame, err)
	}
	if size > fr.maxFrame {
		return Message{}, 0, fmt.Errorf("%w: decompresses to %d bytes, over the frame limit %d", errMalformedFrame, size, fr.maxFrame)
	}
	payload, err := s2.Decode(make([]byte, size), body)
	if err != nil {
		return Message{}, 0, fmt.Errorf("%w: compressed body: %v", errMalformedFrame, err)
	}
	// Keep no large scratch buffer between frames: an idle link costs
	// little.
	if cap(fr.scratch) > 1<<20 {
		fr.scratch = nil
	}
	return Message{Type: typ, Payload: payload}, wire, nil
}
