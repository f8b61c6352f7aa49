package wal

import (
	"encoding/binary"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestHeaderCRCIsTheSaltedChecksumWithoutAllocating: headerCRC is the
// Castagnoli CRC of the salt, the LSN (both little-endian) and the frame
// header after its checksum field, as format-2 segments were written with
// — and it allocates nothing (it used to allocate 16 bytes for every
// record written and every record read).
func TestHeaderCRCIsTheSaltedChecksumWithoutAllocating(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	hdr := make([]byte, frameHeaderSize)
	for range 1000 {
		salt, lsn := r.Uint64(), LSN(r.Uint64())
		for i := range hdr {
			hdr[i] = byte(r.Uint32())
		}
		var pre [16]byte
		binary.LittleEndian.PutUint64(pre[0:8], salt)
		binary.LittleEndian.PutUint64(pre[8:16], uint64(lsn))
		want := crc32.Update(crc32.Update(0, castagnoli, pre[:]), castagnoli, hdr[4:frameHeaderSize])
		if got := headerCRC(salt, lsn, hdr); got != want {
			t.Fatalf("headerCRC(%#x, %d, %x) = %#x, want %#x", salt, lsn, hdr, got, want)
		}
	}
	salt, lsn := r.Uint64(), LSN(r.Uint64())
	if n := testing.AllocsPerRun(100, func() { headerCRC(salt, lsn, hdr) }); n != 0 {
		t.Fatalf("headerCRC allocates %v times per call", n)
	}
}
