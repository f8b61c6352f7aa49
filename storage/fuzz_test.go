package storage

import (
	"bytes"
	"encoding/binary"
	"errors"
	"reflect"
	"testing"

	"github.com/diskque/diskque/wal"
)

// fuzzJobID is a valid id for seeds.
const fuzzJobID = "D-5ca1ab1e-AAAAAAAAAAAAAAAAAAAAAAAA-0e11"

// fuzzSeedJobs are jobs in every state, with and without nodes and times.
func fuzzSeedJobs() []*Job {
	return []*Job{
		{ID: fuzzJobID, Queue: "q1", State: StateQueued, Ctime: 1_000_000_000, Etime: 3_601_000,
			Retry: 60, Repl: 3, QueueTime: 61_000, Nodes: []string{"node-a", "node-b"},
			BodyLSN: 16, BodySize: 5, StoredSize: 5},
		{ID: fuzzJobID, Queue: "delayed", State: StateActive, Ctime: 2_000_000_001, Etime: 3_602_000,
			Delay: 10, Retry: 60, Repl: 1, AwakeTime: 12_000, Nacks: 2, AdditionalDeliveries: 3,
			Deliveries: 4, BodyLSN: 1 << 40, BodySize: 2400, StoredSize: 21},
		{ID: fuzzJobID, Queue: "q", State: StateWaitRepl, Repl: 65535, Etime: -1, QueueTime: -5},
		{ID: fuzzJobID, Queue: "", State: StateAcked, Ctime: 1<<64 - 1, BodySize: 1<<32 - 1, StoredSize: 1<<32 - 1,
			Nacks: 1<<32 - 1, BodyLSN: 1<<64 - 1, Nodes: []string{""}},
	}
}

// fuzzSeedOps are records of every type.
func fuzzSeedOps() []*op {
	jobs := fuzzSeedJobs()
	big := bytes.Repeat([]byte("compressible "), 200)
	stored, compressed := compressBody(big, 1024)
	bigJob := *jobs[1]
	bigJob.BodySize = uint32(len(big))
	return []*op{
		{typ: recAdd, id: fuzzJobID, job: jobs[0], body: []byte("hello")},
		{typ: recAdd, id: fuzzJobID, job: &bigJob, body: stored, compressed: compressed},
		{typ: recAdd, id: fuzzJobID, job: &Job{ID: fuzzJobID, Queue: "q", State: StateWaitRepl}, body: nil},
		{typ: recQueue, id: fuzzJobID, qtime: 61_000},
		{typ: recDeliver, id: fuzzJobID, qtime: 70_000},
		{typ: recRequeue, id: fuzzJobID, qtime: -1},
		{typ: recNack, id: fuzzJobID, qtime: 80_000, awake: 150_000},
		{typ: recNack, id: fuzzJobID, qtime: 80_000},
		{typ: recWorking, id: fuzzJobID, qtime: 1 << 62},
		{typ: recWorking, id: fuzzJobID, qtime: 90_000, addNacks: 1, addDeliveries: 1 << 31},
		{typ: recAck, id: fuzzJobID},
		{typ: recDel, id: fuzzJobID},
		{typ: recDequeue, id: fuzzJobID},
		{typ: recPause, queue: "q1", pause: PauseOut},
		{typ: recPause, queue: "", pause: PauseNone},
		{typ: recNode, node: NewNodeID()},
		{typ: recNode},
		{typ: recFlush},
		{typ: recMove, id: fuzzJobID, src: 1 << 40, body: []byte("hello"), bodySize: 5},
		{typ: recMove, id: fuzzJobID, src: 0, body: stored, compressed: compressed, bodySize: uint32(len(big))},
	}
}

// fuzzVariants returns b, its truncations at a few points, and copies with
// one bit flipped at a few places.
func fuzzVariants(b []byte) [][]byte {
	out := [][]byte{b}
	for _, n := range []int{0, 1, len(b) / 2, len(b) - 1} {
		if n >= 0 && n < len(b) {
			out = append(out, append([]byte(nil), b[:n]...))
		}
	}
	for _, i := range []int{0, 1, 2, 41, 42, len(b) / 2, len(b) - 1} {
		if i >= 0 && i < len(b) {
			c := append([]byte(nil), b...)
			c[i] ^= 1 << (i % 8)
			out = append(out, c)
		}
	}
	return append(out, append(append([]byte(nil), b...), 0))
}

// FuzzDecodeRecord: decodeOp never panics, fails only with ErrBadRecord, and
// what it decodes re-encodes to a payload that decodes to the same op.
func FuzzDecodeRecord(f *testing.F) {
	for _, o := range fuzzSeedOps() {
		for _, p := range fuzzVariants(encodeOp(nil, o)) {
			f.Add(byte(o.typ), p)
		}
	}
	f.Add(byte(0), []byte{})
	f.Add(byte(recNode+1), []byte("x"))
	f.Add(byte(255), []byte(fuzzJobID))
	f.Fuzz(func(t *testing.T, typ byte, payload []byte) {
		orig := append([]byte(nil), payload...)
		o, err := decodeOp(wal.RecordType(typ), payload)
		if !bytes.Equal(payload, orig) {
			t.Fatalf("decodeOp modified its input")
		}
		if err != nil {
			if o != nil {
				t.Fatalf("decodeOp returned an op and an error: %v", err)
			}
			if !errors.Is(err, ErrBadRecord) {
				t.Fatalf("decodeOp error %v is not ErrBadRecord", err)
			}
			return
		}
		if o.typ != wal.RecordType(typ) {
			t.Fatalf("decoded type %d from a type %d record", o.typ, typ)
		}
		enc := encodeOp(nil, o)
		// The op does not alias the payload.
		for i := range payload {
			payload[i] ^= 0xff
		}
		if enc2 := encodeOp(nil, o); !bytes.Equal(enc, enc2) {
			t.Fatalf("decoded op aliases its payload")
		}
		o2, err := decodeOp(wal.RecordType(typ), enc)
		if err != nil {
			t.Fatalf("re-encoded op does not decode: %v\nop: %+v\npayload %x\nre-encoded %x", err, o, orig, enc)
		}
		if !reflect.DeepEqual(o, o2) {
			t.Fatalf("round trip changed the op:\n%+v\n%+v", o, o2)
		}
		if o.job != nil && !reflect.DeepEqual(o.job, o2.job) {
			t.Fatalf("round trip changed the job:\n%+v\n%+v", o.job, o2.job)
		}
		if enc3 := encodeOp(nil, o2); !bytes.Equal(enc, enc3) {
			t.Fatalf("encoding is not stable: %x then %x", enc, enc3)
		}
		if o.typ == recAdd {
			// A body that decodes must decode to BodySize bytes; one that
			// does not must say ErrBadRecord (Body's contract), not panic.
			body, err := decompressBody(o.body, o.compressed, o.job.BodySize)
			switch {
			case err != nil && !errors.Is(err, ErrBadRecord):
				t.Fatalf("decompressBody error %v is not ErrBadRecord", err)
			case err == nil && len(body) != int(o.job.BodySize):
				t.Fatalf("body of %d bytes, BodySize %d", len(body), o.job.BodySize)
			}
		}
	})
}

// fuzzSelf is the store node the fuzzed index values are decoded for: the
// first seed job's first node, so that the seeds hold jobs of that node
// alone (the flagged form), of it and others, and of others.
var fuzzSelf = []string{"node-a"}

// fuzzNames is what the fuzzed index values may refer to: fuzzSelf, and a
// table of interned node ids (format 6) that numbers some of the seeds'
// nodes (fuzzNums), not all.
var fuzzNames = &nodeNames{self: fuzzSelf, ids: []string{"node-b", "node-a", "node-c"}}

func fuzzNums(id string) (uint32, bool) {
	for i, n := range fuzzNames.ids {
		if n == id {
			return uint32(i + 1), true
		}
	}
	return 0, false
}

// encodeJobV1 is an index value as format 1 wrote it (what an index written
// before format 2 still holds).
func encodeJobV1(dst []byte, j *Job) []byte {
	dst = appendJobHeader(dst, j)
	dst = binary.AppendUvarint(dst, uint64(j.BodyLSN))
	dst = binary.AppendUvarint(dst, uint64(j.BodySize))
	return binary.AppendUvarint(dst, uint64(j.StoredSize))
}

// FuzzDecodeJob: decodeJob never panics, and what it decodes re-encodes to a
// value that decodes to the same job.
func FuzzDecodeJob(f *testing.F) {
	for _, j := range fuzzSeedJobs() {
		self := *j
		self.Nodes = fuzzSelf
		for _, j := range []*Job{j, &self} {
			for _, b := range fuzzVariants(encodeJob(nil, j, fuzzSelf[0], fuzzNums)) {
				f.Add(b)
			}
			f.Add(encodeJobV1(nil, j))
		}
	}
	f.Add([]byte{})
	f.Add([]byte{jobEncodingVersion})
	f.Add([]byte{indexValueVersion, indexFlagSelfNodes})
	f.Fuzz(func(t *testing.T, b []byte) {
		orig := append([]byte(nil), b...)
		j, err := decodeJob(fuzzJobID, b, fuzzNames)
		if !bytes.Equal(b, orig) {
			t.Fatalf("decodeJob modified its input")
		}
		if err != nil {
			if j != nil {
				t.Fatalf("decodeJob returned a job and an error: %v", err)
			}
			return
		}
		if j.State < StateWaitRepl || j.State > StateAcked {
			t.Fatalf("decoded a job in state %d", j.State)
		}
		if j.ID != fuzzJobID {
			t.Fatalf("decoded job %q from the value of %q", j.ID, fuzzJobID)
		}
		enc := encodeJob(nil, j, fuzzSelf[0], fuzzNums)
		for i := range b {
			b[i] ^= 0xff
		}
		if enc2 := encodeJob(nil, j, fuzzSelf[0], fuzzNums); !bytes.Equal(enc, enc2) {
			t.Fatalf("decoded job aliases its input")
		}
		j2, err := decodeJob(fuzzJobID, enc, fuzzNames)
		if err != nil {
			t.Fatalf("re-encoded job does not decode: %v\njob: %+v\ninput %x\nre-encoded %x", err, j, orig, enc)
		}
		if !reflect.DeepEqual(j, j2) {
			t.Fatalf("round trip changed the job:\n%+v\n%+v", j, j2)
		}
		if enc3 := encodeJob(nil, j2, fuzzSelf[0], fuzzNums); !bytes.Equal(enc, enc3) {
			t.Fatalf("encoding is not stable: %x then %x", enc, enc3)
		}
		// Every index key a decoded job implies must be parseable back.
		evs, n := events(j)
		for _, e := range evs[:n] {
			if got, err := parseScheduleKey(scheduleKey(e.Due, e.Kind, e.ID)); err != nil || got != e {
				t.Fatalf("schedule key of %+v parses to %+v, %v", e, got, err)
			}
		}
		if len(j.Queue) <= MaxQueueNameLen {
			ctime, id, err := parseQueueKey(queueKey(j.Queue, j.Ctime, j.ID))
			if err != nil || ctime != j.Ctime || id != j.ID {
				t.Fatalf("queue key of %s/%d/%s parses to %d/%s, %v", j.Queue, j.Ctime, j.ID, ctime, id, err)
			}
		}
	})
}

// TestIndexValueFormats pins what format 2 leaves out, and that format-1
// values still decode to the same job.
func TestIndexValueFormats(t *testing.T) {
	for i, j := range fuzzSeedJobs() {
		self := *j
		self.Nodes = []string{fuzzSelf[0]}
		for _, j := range []*Job{j, &self} {
			v2 := encodeJob(nil, j, fuzzSelf[0], nil)
			v1 := encodeJobV1(nil, j)
			for _, v := range [][]byte{v1, v2} {
				got, err := decodeJob(j.ID, v, fuzzNames)
				if err != nil {
					t.Fatalf("seed %d, format %d: %v", i, v[0], err)
				}
				if !reflect.DeepEqual(got, j) {
					t.Fatalf("seed %d, format %d: decoded\n%+v\nwant\n%+v", i, v[0], got, j)
				}
			}
			// The id is never in a format-2 value; the node list is not
			// when it is the store's node alone.
			saved := len(j.ID)
			if len(j.Nodes) == 1 && j.Nodes[0] == fuzzSelf[0] {
				saved += 1 + 1 + len(fuzzSelf[0]) // count, length, id
			}
			if want := len(v1) - saved + 1; len(v2) != want { // +1: the flags byte
				t.Fatalf("seed %d: format 2 is %d bytes, want %d (format 1: %d)", i, len(v2), want, len(v1))
			}
		}
		if _, err := decodeJob("D-00000000-AAAAAAAAAAAAAAAAAAAAAAAA-0000", encodeJobV1(nil, j), fuzzNames); err == nil {
			t.Fatalf("seed %d: a format-1 value decoded under another job's id", i)
		}
	}
	flagged := encodeJob(nil, &Job{ID: fuzzJobID, Queue: "q", State: StateQueued, Nodes: fuzzSelf}, fuzzSelf[0], nil)
	if _, err := decodeJob(fuzzJobID, flagged, nil); err == nil {
		t.Fatal("a value naming the store's node decoded for a store without a node id")
	}
}

// TestCodecSeedsRoundTrip checks the seeds themselves: every record and job
// the fuzzers start from decodes to exactly what was encoded.
func TestCodecSeedsRoundTrip(t *testing.T) {
	for _, o := range fuzzSeedOps() {
		got, err := decodeOp(o.typ, encodeOp(nil, o))
		if err != nil {
			t.Fatalf("type %d: %v", o.typ, err)
		}
		want := *o
		if o.job != nil {
			// The ADD record does not carry the body's location; decoding
			// sets StoredSize from the body it finds.
			j := *o.job
			j.BodyLSN, j.StoredSize = 0, uint32(len(o.body))
			want.job = &j
			want.bodySize = j.BodySize
		}
		if !reflect.DeepEqual(got, &want) {
			t.Fatalf("type %d: decoded\n%+v\nwant\n%+v", o.typ, got, &want)
		}
	}
	for _, j := range fuzzSeedJobs() {
		got, err := decodeJob(j.ID, encodeJob(nil, j, fuzzSelf[0], fuzzNums), fuzzNames)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, j) {
			t.Fatalf("decoded\n%+v\nwant\n%+v", got, j)
		}
	}
}
