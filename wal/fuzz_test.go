package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// seedFrames are valid frames for the fuzz corpora: empty, small, odd-sized
// and larger payloads, and every type edge.
func seedFrames() [][]byte {
	var out [][]byte
	for _, r := range []Record{
		{Type: 1},
		{Type: 1, Payload: []byte("x")},
		{Type: 2, Payload: []byte("hello, wal")},
		{Type: 255, Payload: bytes.Repeat([]byte{0}, 33)},
		{Type: 7, Payload: bytes.Repeat([]byte("diskque"), 20)},
	} {
		out = append(out, appendFrame(nil, r))
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
		for _, at := range []int{0, 3, 4, 8, len(fr) - 1} {           // length, crc, type, payload
			b := slices.Clone(fr)
			b[at] ^= 1 << (at % 8)
			f.Add(b)
		}
	}
	f.Add([]byte{})
	f.Add(make([]byte, 64))
	huge := make([]byte, frameHeaderSize)
	binary.LittleEndian.PutUint32(huge, 0xffffffff)
	huge[8] = 1
	f.Add(huge)
	binary.LittleEndian.PutUint32(huge, MaxPayload)
	f.Add(huge)

	f.Fuzz(func(t *testing.T, b []byte) {
		in := slices.Clone(b)
		r, n, err := DecodeFrame(b)
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
		if got := appendFrame(nil, r); !bytes.Equal(got, b[:n]) {
			t.Fatalf("re-encoded %x, consumed %x", got, b[:n])
		}
		if _, _, err := DecodeFrame(b[:n-1]); err == nil {
			t.Fatal("a strict prefix of a frame decoded")
		}
	})
}

// FuzzRepairTail runs the recovery of a last segment over arbitrary frame
// bytes: it keeps the longest prefix of whole valid frames and moves the rest
// to .broken, or refuses with ErrCorrupt naming the offset of a bad frame
// that a valid one follows.
func FuzzRepairTail(f *testing.F) {
	frames := seedFrames()
	log := bytes.Join(frames, nil)
	f.Add(log)
	f.Add([]byte{})
	f.Add(log[:len(log)-5])                                                  // torn tail
	f.Add(append(slices.Clone(log[:len(frames[0])+3]), make([]byte, 40)...)) // zeroed tail
	for _, at := range []int{len(frames[0]) + frameHeaderSize, len(log) - 2, 5} {
		b := slices.Clone(log)
		b[at] ^= 0x10 // in the middle (followed by valid frames), at the end, a crc
		f.Add(b)
	}
	logger := slog.New(slog.DiscardHandler)

	f.Fuzz(func(t *testing.T, frames []byte) {
		fs := vfs.NewMem()
		if err := fs.MkdirAll(crashDir, 0o755); err != nil {
			t.Fatal(err)
		}
		const first = LSN(4096)
		name := segmentName(first)
		path := fs.PathJoin(crashDir, name)
		orig := append(segmentHeader(first), frames...)
		writeFile(t, fs, path, orig)

		size, err := repairTail(fs, crashDir, segment{first: first, size: int64(len(frames))}, 0, logger)
		// The valid prefix, walked independently of repairTail.
		off := 0
		for off < len(frames) {
			_, n, err := DecodeFrame(frames[off:])
			if err != nil {
				break
			}
			off += n
		}
		if err != nil {
			at := fmt.Sprintf("segment %s offset %d", name, segmentHeaderSize+off)
			if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), at) {
				t.Fatalf("repairTail: %v; want ErrCorrupt naming %q", err, at)
			}
			if !validFrameFollows(frames, off) {
				t.Fatalf("repairTail refused, but no valid frame follows the bad one at %d", off)
			}
			if got := readFile(t, fs, path); !bytes.Equal(got, orig) {
				t.Fatal("repairTail changed a segment it refused")
			}
			return
		}
		if size != int64(off) {
			t.Fatalf("repairTail kept %d bytes, but the valid frames end at %d", size, off)
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
