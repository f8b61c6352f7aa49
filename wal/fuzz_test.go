package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"log/slog"
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// fuzzSalt and fuzzFirst place the fuzzers' frames: a fixed salt, so that
// the corpora can hold valid frames, in a segment starting at fuzzFirst.
const (
	fuzzSalt  = 0x5eed5a1f0ddba11
	fuzzFirst = LSN(4096)
)

// seedFrames are valid frames for the fuzz corpora, laid end to end from
// fuzzFirst: empty, small, odd-sized and larger payloads, a sync mark, and
// every type edge.
func seedFrames() [][]byte {
	var out [][]byte
	lsn := fuzzFirst
	for _, r := range []Record{
		{Type: 1},
		{Type: 1, Payload: []byte("x")},
		{Type: 2, Payload: []byte("hello, wal")},
		{Type: 254, Payload: bytes.Repeat([]byte{0}, 33)},
		{Type: 7, Payload: bytes.Repeat([]byte("diskque"), 20)},
	} {
		fr := appendFrame(nil, r, fuzzSalt, lsn)
		out = append(out, fr)
		lsn += LSN(len(fr))
		mark := appendMark(nil, lsn, fuzzSalt, lsn)
		out = append(out, mark)
		lsn += LSN(len(mark))
	}
	return out
}

// FuzzDecodeFrame checks DecodeFrame on arbitrary bytes: it never panics, it
// fails only with ErrCorrupt, and whatever it accepts re-encodes to exactly
// the bytes it consumed.
func FuzzDecodeFrame(f *testing.F) {
	frames := seedFrames()
	for i, fr := range frames {
		f.Add(fr)
		f.Add(append(slices.Clone(fr), frames[(i+1)%len(frames)]...)) // followed by another
		f.Add(append(slices.Clone(fr), 0, 0, 0))                      // followed by zeros
		f.Add(fr[:len(fr)-1])                                         // torn payload
		f.Add(fr[:frameHeaderSize-1])                                 // torn header
		for _, at := range []int{0, 4, 8, 9, len(fr) - 1} {           // crc, length, type, payload crc, payload
			b := slices.Clone(fr)
			b[at] ^= 1 << (at % 8)
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	huge := make([]byte, frameHeaderSize)
	binary.LittleEndian.PutUint32(huge[4:], 0xffffffff)
	huge[8] = 1
	f.Add(huge)

	f.Fuzz(func(t *testing.T, b []byte) {
		in := slices.Clone(b)
		r, n, err := DecodeFrame(b, fuzzSalt, fuzzFirst)
		if !bytes.Equal(b, in) {
			t.Fatal("DecodeFrame modified its input")
		}
		if err != nil {
			if !errors.Is(err, ErrCorrupt) || n != 0 {
				t.Fatalf("DecodeFrame failed with %v, n=%d; want ErrCorrupt, n=0", err, n)
			}
			return
		}
		if n < frameHeaderSize || n > len(b) || len(r.Payload) != n-frameHeaderSize {
			t.Fatalf("consumed %d of %d bytes for a %d-byte payload", n, len(b), len(r.Payload))
		}
		if r.Type == 0 {
			t.Fatal("decoded a record of reserved type 0")
		}
		if got := appendFrame(nil, r, fuzzSalt, fuzzFirst); !bytes.Equal(got, b[:n]) {
			t.Fatalf("re-encoded %x, consumed %x", got, b[:n])
		}
		if _, _, err := DecodeFrame(b[:n-1], fuzzSalt, fuzzFirst); err == nil {
			t.Fatal("a strict prefix of a frame decoded")
		}
		if _, _, err := DecodeFrame(b[:n], fuzzSalt, fuzzFirst+1); err == nil {
			t.Fatal("a frame decoded at another lsn")
		}
		if _, _, err := DecodeFrame(b[:n], fuzzSalt+1, fuzzFirst); err == nil {
			t.Fatal("a frame decoded with another salt")
		}
	})
}

// FuzzPlanTail runs the recovery of a last segment over arbitrary frame
// bytes. It keeps the longest prefix of whole valid frames and moves the rest
// to .broken — unless a valid sync mark after the damage says the damaged
// part was durable: then it refuses with a DamageError naming the offset and
// changes nothing.
func FuzzPlanTail(f *testing.F) {
	frames := seedFrames()
	log := bytes.Join(frames, nil)
	f.Add(log)
	f.Add([]byte{})
	f.Add(log[:len(log)-5])                                                  // torn tail
	f.Add(append(slices.Clone(log[:len(frames[0])+3]), make([]byte, 40)...)) // zeroed tail
	for _, at := range []int{len(frames[0]) + 4, len(frames[0]) + frameHeaderSize, len(log) - 2, 5} {
		b := slices.Clone(log)
		b[at] ^= 0x10 // a length in the middle (followed by valid frames and marks), a payload, the end, a crc
		f.Add(b)
	}
	logger := slog.New(slog.DiscardHandler)

	f.Fuzz(func(t *testing.T, frames []byte) {
		fs := vfs.NewMem()
		if err := fs.MkdirAll(crashDir, 0o755); err != nil {
			t.Fatal(err)
		}
		name := segmentName(fuzzFirst)
		path := fs.PathJoin(crashDir, name)
		orig := append(segmentHeader(fuzzFirst, fuzzSalt), frames...)
		writeFile(t, fs, path, orig)
		seg := segment{first: fuzzFirst, size: int64(len(frames)), version: formatVersion, salt: fuzzSalt}

		plan, err := planTail(fs, crashDir, seg, 0)
		// The valid prefix, walked independently of planTail.
		off := 0
		for off < len(frames) {
			_, n, err := DecodeFrame(frames[off:], fuzzSalt, fuzzFirst+LSN(off))
			if err != nil {
				break
			}
			off += n
		}
		damage := fuzzFirst + LSN(off)
		if err != nil {
			var de *DamageError
			if !errors.As(err, &de) || !errors.Is(err, ErrCorrupt) || de.Offset != segmentHeaderSize+int64(off) {
				t.Fatalf("planTail: %v; want a DamageError at offset %d", err, segmentHeaderSize+off)
			}
			if !markAfter(frames, off, damage) {
				t.Fatal("planTail refused, but no valid sync mark after the damage states it durable")
			}
			if got := readFile(t, fs, path); !bytes.Equal(got, orig) {
				t.Fatal("planTail changed a segment it refused")
			}
			return
		}
		if plan.keep != int64(off) {
			t.Fatalf("planTail keeps %d bytes, but the valid frames end at %d", plan.keep, off)
		}
		if err := plan.apply(fs, crashDir, seg, logger); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, fs, path); !bytes.Equal(got, orig[:segmentHeaderSize+off]) {
			t.Fatalf("segment holds %d bytes, want %d", len(got), segmentHeaderSize+off)
		}
		broken := path + brokenSuffix
		if off == len(frames) {
			if _, err := fs.Stat(broken); err == nil {
				t.Fatal(".broken written for an intact segment")
			}
		} else if got := readFile(t, fs, broken); !bytes.Equal(got, orig) {
			t.Fatal(".broken does not hold the original segment")
		}
	})
}

// markAfter reports whether a valid sync mark starts somewhere after off in
// frames and states an LSN past damage.
func markAfter(frames []byte, off int, damage LSN) bool {
	for o := off + 1; o < len(frames); o++ {
		r, _, err := DecodeFrame(frames[o:], fuzzSalt, fuzzFirst+LSN(o))
		if err != nil {
			continue
		}
		if s, ok := markSynced(r); ok && s > damage {
			return true
		}
	}
	return false
}
