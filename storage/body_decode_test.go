package storage

import (
	"bytes"
	"testing"

	"github.com/diskque/diskque/wal"
)

// bodySeedOps are records of the three types that carry a body: ADDs and
// MOVEs from fuzzSeedOps, and MOVEs with the job's state (recMoveFull).
func bodySeedOps() []*op {
	var out []*op
	for _, o := range fuzzSeedOps() {
		if o.typ == recAdd || o.typ == recMove {
			out = append(out, o)
		}
	}
	big := bytes.Repeat([]byte("compressible "), 200)
	stored, compressed := compressBody(big, 1024)
	for _, j := range fuzzSeedJobs() {
		out = append(out,
			&op{typ: recMoveFull, id: j.ID, job: j, src: 7, body: []byte("moved"), bodySize: 5},
			&op{typ: recMoveFull, id: j.ID, job: j, src: 1 << 40, body: stored, compressed: compressed, bodySize: uint32(len(big))},
			&op{typ: recMoveFull, id: j.ID, job: j, src: 1})
	}
	return out
}

// checkBodyOfAgrees: for a payload decodeOp accepts, bodyOf's reading
// (recordBody) gives the same id and stored body, and bodyOf the body
// decodeOp's op carries, not aliasing the payload.
func checkBodyOfAgrees(t *testing.T, typ wal.RecordType, payload []byte) {
	t.Helper()
	o, err := decodeOp(typ, payload)
	if err != nil {
		return
	}
	id, stored, compressed, size, err := recordBody(typ, payload)
	if err != nil {
		t.Fatalf("type %d: decodeOp reads %x, recordBody fails: %v", typ, payload, err)
	}
	if id != o.id || !bytes.Equal(stored, o.body) || compressed != o.compressed || size != o.bodySize {
		t.Fatalf("type %d: recordBody read id %q body %x compressed %v size %d; decodeOp %q %x %v %d",
			typ, id, stored, compressed, size, o.id, o.body, o.compressed, o.bodySize)
	}
	want, wantErr := decompressBody(o.body, o.compressed, o.bodySize)
	got, gotErr := bodyOf(&Job{ID: o.id}, wal.Record{Type: typ, Payload: payload})
	if (wantErr == nil) != (gotErr == nil) || !bytes.Equal(got, want) || (got == nil) != (want == nil) {
		t.Fatalf("type %d: bodyOf %x, %v; decodeOp's body %x, %v", typ, got, gotErr, want, wantErr)
	}
	// The body may alias the record (the log's reads are the caller's),
	// but an append to it must not write into the record's next bytes.
	if cap(got) != len(got) {
		t.Fatalf("type %d: bodyOf's body has room (cap %d, len %d): an append would write into the record", typ, cap(got), len(got))
	}
}

// TestBodyOfReadsWhatDecodeOpReads: bodyOf reads a record's body without
// decoding the rest of the op (recordBody): for every record that carries
// a body it gives what decodeOp gave, and for every damaged copy (each
// bit flipped) that decodeOp reads, the same; every strict prefix of a
// record (a read cut short) fails, as it did.
func TestBodyOfReadsWhatDecodeOpReads(t *testing.T) {
	for _, o := range bodySeedOps() {
		p := encodeOp(nil, o)
		if _, err := decodeOp(o.typ, p); err != nil {
			t.Fatalf("seed of type %d does not decode: %v", o.typ, err)
		}
		checkBodyOfAgrees(t, o.typ, p)
		j := &Job{ID: o.id}
		if _, err := bodyOf(j, wal.Record{Type: o.typ, Payload: p}); err != nil {
			t.Fatalf("type %d: bodyOf of a sound record: %v", o.typ, err)
		}
		other := &Job{ID: fuzzJobID[:39] + "x"}
		if _, err := bodyOf(other, wal.Record{Type: o.typ, Payload: p}); err == nil {
			t.Fatalf("type %d: bodyOf gave the body of %s for %s", o.typ, o.id, other.ID)
		}
		for n := range len(p) {
			if _, err := bodyOf(j, wal.Record{Type: o.typ, Payload: p[:n]}); err == nil {
				t.Fatalf("type %d: bodyOf read a body from the first %d of %d bytes", o.typ, n, len(p))
			}
		}
		for i := range len(p) {
			for bit := range 8 {
				c := bytes.Clone(p)
				c[i] ^= 1 << bit
				checkBodyOfAgrees(t, o.typ, c)
			}
		}
	}
}

// FuzzBodyOf: whatever decodeOp reads of a record with a body, bodyOf
// reads the same.
func FuzzBodyOf(f *testing.F) {
	for _, o := range bodySeedOps() {
		for _, p := range fuzzVariants(encodeOp(nil, o)) {
			f.Add(byte(o.typ), p)
		}
	}
	f.Fuzz(func(t *testing.T, typ byte, payload []byte) {
		switch wal.RecordType(typ) {
		case recAdd, recMove, recMoveFull:
			checkBodyOfAgrees(t, wal.RecordType(typ), payload)
		}
	})
}

// BenchmarkBodyOf: reading a 100-byte body from its ADD record.
func BenchmarkBodyOf(b *testing.B) {
	j := *fuzzSeedJobs()[0]
	body := bytes.Repeat([]byte("x"), 100)
	j.BodySize = uint32(len(body))
	p := encodeOp(nil, &op{typ: recAdd, id: j.ID, job: &j, body: body})
	r := wal.Record{Type: recAdd, Payload: p}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bodyOf(&j, r); err != nil {
			b.Fatal(err)
		}
	}
}
