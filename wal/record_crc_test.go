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

// headerCRCBytewise is headerCRC as it was before the slicing-by-8 tables:
// the salt and the LSN a byte at a time, the header through crc32.Update.
func headerCRCBytewise(salt uint64, lsn LSN, hdr []byte) uint32 {
	crc := ^uint32(0)
	for _, v := range [2]uint64{salt, uint64(lsn)} {
		for range 8 {
			crc = castagnoli[byte(crc)^byte(v)] ^ crc>>8
			v >>= 8
		}
	}
	return crc32.Update(^crc, castagnoli, hdr[4:frameHeaderSize])
}

// TestHeaderCRCAgreesWithTheBytewiseOne: the table-driven headerCRC gives
// the checksums the log always wrote, over many headers (segments written
// before it must still read: compat_test.go reads such logs).
func TestHeaderCRCAgreesWithTheBytewiseOne(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	hdr := make([]byte, frameHeaderSize)
	for i := range 200_000 {
		salt, lsn := r.Uint64(), LSN(r.Uint64())
		if i%4 == 0 {
			lsn = LSN(r.Uint64N(1 << 32)) // LSNs as they are: small
		}
		for i := range hdr {
			hdr[i] = byte(r.Uint32())
		}
		if got, want := headerCRC(salt, lsn, hdr), headerCRCBytewise(salt, lsn, hdr); got != want {
			t.Fatalf("headerCRC(%#x, %d, %x) = %#x, the bytewise one %#x", salt, lsn, hdr, got, want)
		}
	}
}

var sinkCRC uint32

func BenchmarkHeaderCRC(b *testing.B) {
	hdr := make([]byte, frameHeaderSize)
	for i := range hdr {
		hdr[i] = byte(i * 7)
	}
	for _, c := range []struct {
		name string
		f    func(uint64, LSN, []byte) uint32
	}{{"tables", headerCRC}, {"bytewise", headerCRCBytewise}} {
		b.Run(c.name, func(b *testing.B) {
			lsn := LSN(0)
			for b.Loop() {
				sinkCRC ^= c.f(0x1234567890abcdef, lsn, hdr)
				lsn += 113
			}
		})
	}
}
