package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/diskque/diskque/wal"
	"github.com/klauspost/compress/s2"
)

// AOF record types. Each is one state change of one job (or of a queue, or of
// the node); the payload layouts are in encodeOp.
const (
	recAdd     wal.RecordType = 1  // job header + body
	recQueue   wal.RecordType = 2  // id, qtime: active or wait-repl → queued
	recDeliver wal.RecordType = 3  // id, qtime: queued → active, delivered
	recRequeue wal.RecordType = 4  // id, qtime: retry timer fired → queued
	recNack    wal.RecordType = 5  // id, qtime, awake: → queued (or delayed), nacks+1
	recWorking wal.RecordType = 6  // id, qtime: next requeue postponed
	recAck     wal.RecordType = 7  // id: → acked
	recDel     wal.RecordType = 8  // id: deleted
	recPause   wal.RecordType = 9  // queue, pause state
	recDequeue wal.RecordType = 10 // id: queued → active
	recNode    wal.RecordType = 11 // node id, written once when a store is created
	// recMove: id, source lsn, flags, body size, stored body. The
	// collector copies a live body forward out of a segment it is
	// emptying; the job's body location becomes this record. It applies
	// only if the job's body is still at the source LSN.
	recMove wal.RecordType = 12
	// recFlush: no payload. Every job and pause state is deleted (DEBUG
	// FLUSHALL); the node id stays.
	recFlush wal.RecordType = 13
)

// ErrBadRecord is returned when an AOF record's payload does not decode.
var ErrBadRecord = errors.New("storage: malformed aof record")

// op is one decoded AOF record.
type op struct {
	typ   wal.RecordType
	id    string // job id (every job record)
	qtime int64  // queue, deliver, requeue, nack, working
	// qtimeFn, when set (live operations only), computes qtime from the job
	// before the record is encoded.
	qtimeFn func(*Job) int64
	// fresh (live adds only): the id was just made by NewJobID, so the
	// lookup that refuses a duplicate id is skipped.
	fresh bool
	awake int64 // nack
	// add
	job        *Job
	body       []byte // as stored (compressed when compressed is set)
	compressed bool
	// pause
	queue string
	pause PauseState
	// node
	node string
	// deliver (live only, not logged): where the job sits in its queue,
	// so prefetchQueued can read it with its neighbours.
	hintQueue string
	hintCtime uint64
	// move: where the body was; bodySize is its uncompressed length.
	src      wal.LSN
	bodySize uint32
}

const flagCompressed = 1

// encodeOp appends o's payload to dst.
func encodeOp(dst []byte, o *op) []byte {
	switch o.typ {
	case recAdd:
		dst = appendJobHeader(dst, o.job)
		flags := byte(0)
		if o.compressed {
			flags |= flagCompressed
		}
		dst = append(dst, flags)
		dst = binary.AppendUvarint(dst, uint64(o.job.BodySize))
		return append(dst, o.body...)
	case recQueue, recDeliver, recRequeue, recWorking:
		dst = append(dst, o.id...)
		return binary.AppendVarint(dst, o.qtime)
	case recNack:
		dst = append(dst, o.id...)
		dst = binary.AppendVarint(dst, o.qtime)
		return binary.AppendVarint(dst, o.awake)
	case recAck, recDel, recDequeue:
		return append(dst, o.id...)
	case recPause:
		dst = append(dst, byte(o.pause))
		return append(dst, o.queue...)
	case recNode:
		return append(dst, o.node...)
	case recFlush:
		return dst
	case recMove:
		dst = append(dst, o.id...)
		dst = binary.AppendUvarint(dst, uint64(o.src))
		flags := byte(0)
		if o.compressed {
			flags |= flagCompressed
		}
		dst = append(dst, flags)
		dst = binary.AppendUvarint(dst, uint64(o.bodySize))
		return append(dst, o.body...)
	}
	panic(fmt.Sprintf("storage: encode of unknown record type %d", o.typ))
}

// decodeOp decodes a record. The result does not alias payload.
func decodeOp(typ wal.RecordType, payload []byte) (*op, error) {
	d := decoder{b: payload}
	o := &op{typ: typ}
	switch typ {
	case recAdd:
		j := &Job{}
		d.jobHeader(j)
		flags := d.byte()
		j.BodySize = d.u32()
		if d.err == nil && flags&^flagCompressed != 0 {
			d.fail("unknown flags")
		}
		o.job, o.compressed = j, flags&flagCompressed != 0
		o.id, o.bodySize = j.ID, j.BodySize
		o.body = append([]byte(nil), d.rest()...)
		j.StoredSize = uint32(len(o.body))
		if d.err == nil && j.BodySize > wal.MaxPayload {
			d.fail("body size out of range")
		}
		if d.err == nil && !o.compressed && len(o.body) != int(j.BodySize) {
			d.fail("body length mismatch")
		}
	case recQueue, recDeliver, recRequeue, recWorking:
		o.id = d.id()
		o.qtime = d.varint()
	case recNack:
		o.id = d.id()
		o.qtime = d.varint()
		o.awake = d.varint()
	case recAck, recDel, recDequeue:
		o.id = d.id()
	case recPause:
		o.pause = PauseState(d.byte())
		o.queue = string(d.rest())
		if d.err == nil && o.pause > PauseAll {
			d.fail("bad pause state")
		}
	case recNode:
		o.node = string(d.rest())
	case recFlush:
	case recMove:
		o.id = d.id()
		o.src = wal.LSN(d.uvarint())
		flags := d.byte()
		o.bodySize = d.u32()
		o.compressed = flags&flagCompressed != 0
		o.body = append([]byte(nil), d.rest()...)
		switch {
		case d.err != nil:
		case flags&^flagCompressed != 0:
			d.fail("unknown flags")
		case o.bodySize > wal.MaxPayload:
			d.fail("body size out of range")
		case !o.compressed && len(o.body) != int(o.bodySize):
			d.fail("body length mismatch")
		}
	default:
		return nil, fmt.Errorf("%w: unknown type %d", ErrBadRecord, typ)
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, fmt.Errorf("%w: type %d: %v", ErrBadRecord, typ, d.err)
	}
	return o, nil
}

const jobEncodingVersion = 1

// appendJobHeader encodes everything of a job but its body location.
func appendJobHeader(dst []byte, j *Job) []byte {
	dst = append(dst, jobEncodingVersion)
	dst = append(dst, j.ID...)
	dst = binary.AppendUvarint(dst, uint64(len(j.Queue)))
	dst = append(dst, j.Queue...)
	dst = append(dst, byte(j.State))
	dst = binary.AppendUvarint(dst, j.Ctime)
	dst = binary.AppendVarint(dst, j.Etime)
	dst = binary.AppendUvarint(dst, uint64(j.Delay))
	dst = binary.AppendUvarint(dst, uint64(j.Retry))
	dst = binary.AppendUvarint(dst, uint64(j.Repl))
	dst = binary.AppendUvarint(dst, uint64(j.Nacks))
	dst = binary.AppendUvarint(dst, uint64(j.AdditionalDeliveries))
	dst = binary.AppendUvarint(dst, uint64(j.Deliveries))
	dst = binary.AppendVarint(dst, j.QueueTime)
	dst = binary.AppendVarint(dst, j.AwakeTime)
	dst = binary.AppendUvarint(dst, uint64(len(j.Nodes)))
	for _, n := range j.Nodes {
		dst = binary.AppendUvarint(dst, uint64(len(n)))
		dst = append(dst, n...)
	}
	return dst
}

// encodeJob encodes a job's index value: its header and body location.
func encodeJob(dst []byte, j *Job) []byte {
	dst = appendJobHeader(dst, j)
	dst = binary.AppendUvarint(dst, uint64(j.BodyLSN))
	dst = binary.AppendUvarint(dst, uint64(j.BodySize))
	return binary.AppendUvarint(dst, uint64(j.StoredSize))
}

func decodeJob(b []byte) (*Job, error) {
	d := decoder{b: b}
	j := &Job{}
	d.jobHeader(j)
	j.BodyLSN = wal.LSN(d.uvarint())
	j.BodySize = d.u32()
	j.StoredSize = d.u32()
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, fmt.Errorf("storage: malformed job record: %v", d.err)
	}
	return j, nil
}

// decoder reads the encodings above; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(msg string) {
	if d.err == nil {
		d.err = errors.New(msg)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("short")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) bytes(n int) []byte {
	if n < 0 || len(d.b) < n {
		d.fail("short")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) id() string { return string(d.bytes(JobIDLen)) }

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u32() uint32 {
	v := d.uvarint()
	if v > 1<<32-1 {
		d.fail("value out of range")
	}
	return uint32(v)
}

func (d *decoder) str() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("short string")
		return ""
	}
	return string(d.bytes(int(n)))
}

func (d *decoder) rest() []byte {
	v := d.b
	d.b = nil
	return v
}

func (d *decoder) jobHeader(j *Job) {
	if v := d.byte(); d.err == nil && v != jobEncodingVersion {
		d.fail(fmt.Sprintf("unknown job encoding version %d", v))
	}
	j.ID = d.id()
	j.Queue = d.str()
	j.State = State(d.byte())
	j.Ctime = d.uvarint()
	j.Etime = d.varint()
	j.Delay = d.u32()
	j.Retry = d.u32()
	repl := d.uvarint()
	if repl > 65535 {
		d.fail("repl out of range")
	}
	j.Repl = uint16(repl)
	j.Nacks = d.u32()
	j.AdditionalDeliveries = d.u32()
	j.Deliveries = d.u32()
	j.QueueTime = d.varint()
	j.AwakeTime = d.varint()
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("too many nodes")
		return
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		j.Nodes = append(j.Nodes, d.str())
	}
	if d.err == nil && (j.State < StateWaitRepl || j.State > StateAcked) {
		d.fail(fmt.Sprintf("bad job state %d", j.State))
	}
}

// compressBody returns the body as it goes to the AOF: s2-compressed when it
// is at least threshold bytes and compression saves space.
func compressBody(body []byte, threshold int) (stored []byte, compressed bool) {
	if threshold <= 0 || len(body) < threshold {
		return body, false
	}
	c := s2.Encode(nil, body)
	if len(c) >= len(body) {
		return body, false
	}
	return c, true
}

func decompressBody(stored []byte, compressed bool, size uint32) ([]byte, error) {
	if !compressed {
		return stored, nil
	}
	n, err := s2.DecodedLen(stored)
	if err != nil || n != int(size) {
		return nil, fmt.Errorf("%w: compressed body length", ErrBadRecord)
	}
	out, err := s2.Decode(make([]byte, n), stored)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadRecord, err)
	}
	return out, nil
}
