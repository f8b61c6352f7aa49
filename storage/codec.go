package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"

	"github.com/diskque/diskque/wal"
	"github.com/klauspost/compress/s2"
)

// AOF record types. Each is one state change of one job (or of a queue, or of
// the node); the payload layouts are in encodeOp.
const (
	recAdd     wal.RecordType = 1  // job header + body
	recQueue   wal.RecordType = 2  // id, qtime: active or wait-repl → queued
	recDeliver wal.RecordType = 3  // id, qtime[, node list]: queued → active, delivered (and the nodes replaced: a job moved to another node)
	recRequeue wal.RecordType = 4  // id, qtime: retry timer fired → queued
	recNack    wal.RecordType = 5  // id, qtime, awake: → queued (or delayed), nacks+1
	recWorking wal.RecordType = 6  // id, qtime[, +nacks, +additional deliveries]: requeue postponed (Postpone: QUEUED's counters)
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
	// recMoveFull: job header, source lsn, flags, body size, stored body.
	// recMove with the job's whole state, which the collector writes since
	// format 3: a replay of the AOF from its first segment (an index
	// rebuild) can then create the job from it once its ADD's segment is
	// gone (see forward.go).
	recMoveFull wal.RecordType = 14
	// recSnap: job header, body lsn, body size, stored size. The job's
	// whole state, its body left where it is: written forward before a
	// segment holding the job's history is removed (forward.go), and by the
	// collector for a job anchored in a segment it empties. Applied live it
	// changes nothing but the job's creator list; replayed it sets the job
	// (creating it if needed).
	recSnap wal.RecordType = 15
	// recTomb: id, source lsn, creator lsns. A deleted job's DEL (at the
	// source lsn) copied forward by the collector out of a segment it
	// empties, while a record that could create the job in a replay (its
	// ADD, MOVE or SNAP at those lsns) is still in the AOF (accounting.go).
	// Replayed it deletes the job.
	recTomb wal.RecordType = 16
	// recMeta: node id, highest ctime, then every queue's pause state
	// (count, then state and name each). Written forward before a segment
	// holding the node id or a pause record is removed; replayed it sets the
	// node id and the highest ctime and replaces every pause state.
	recMeta wal.RecordType = 17
	// recNodes: id, node list. The nodes that may hold a copy of the job
	// (nodes-delivered) replaced, in whatever state: the origin records
	// the nodes it sent a REPLJOB to (format 5); a wait-repl job becomes
	// active (its replication is achieved).
	recNodes wal.RecordType = 18
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
	// nodesFn, when set (live deliveries only), computes from the job the
	// node list the DELIVER also sets (nil: the list stays), before the
	// record is encoded; the record then carries it (o.nodes).
	nodesFn func(*Job) []string
	// fresh (live adds only): the id was just made by NewJobID, so the
	// lookup that refuses a duplicate id is skipped.
	fresh bool
	// replica (live adds only): an add of a copy sent by another node
	// (REPLJOB) or of a dummy ack; an id that exists makes it a no-op that
	// succeeds (Result.Old is the job as it is), not ErrExists.
	replica bool
	// firstInc (live adds only): AddReplicaFirst's stamp; firstFast: its
	// add skipped the Pebble lookup (replica_first.go).
	firstInc  uint64
	firstFast bool
	// nodes: the node list a NODES record sets, or a DELIVER that carries
	// one (nil: none).
	nodes []string
	awake int64 // nack
	// working: the counters to add (QUEUED from another node).
	addNacks, addDeliveries uint32
	// add
	job        *Job
	body       []byte // as stored (compressed when compressed is set)
	compressed bool
	// pause
	queue string
	pause PauseState
	// node
	node string
	// ifEmpty (live NODE records only, not logged): refused with
	// ErrNotEmpty unless the store holds no job when it applies —
	// checked under the store's lock, so no add slips in between.
	ifEmpty bool
	// deliver (live only, not logged): where the job sits in its queue,
	// so prefetchQueued can read it with its neighbours.
	hintQueue string
	hintCtime uint64
	// cached (deliver, live, not logged): the job as prefetchQueued found
	// it in the job cache, under the same hold of mu as the batch's
	// apply, so resolve need not look it up again unless an earlier op
	// of the batch changed it (the overlay then has it).
	cached *Job
	// seen, seenAt (deliver, live, not logged): the job as a read at
	// seenAt found it (Batch.DeliverQueued); current if the store applied
	// nothing since.
	seen   *Job
	seenAt WriteMark
	// move: where the body was; bodySize is its uncompressed length.
	src      wal.LSN
	bodySize uint32
	// del, tomb: the lsns of the deleted job's records that could create it
	// in a replay (Job.creatorLSNs), filled in when the deletion applies.
	creators []wal.LSN
	// tomb, live: the creator segments checkTomb found the deletion held
	// on, which its write takes over without reading the keys again.
	held []wal.LSN
	// meta: every queue's pause state, and the highest ctime.
	pauses   map[string]PauseState
	maxCtime uint64
	// replay: the op is replayed from the AOF, not applied live (records
	// carrying a whole job state set it instead of checking it).
	replay bool
	// rebuild: replayed into an index rebuilt from the whole AOF, whose
	// collected history is corrected by later records (forward.go): a
	// transition that does not apply is skipped, not an error.
	rebuild bool
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
	case recQueue, recRequeue:
		dst = append(dst, o.id...)
		return binary.AppendVarint(dst, o.qtime)
	case recDeliver:
		dst = append(dst, o.id...)
		dst = binary.AppendVarint(dst, o.qtime)
		if len(o.nodes) > 0 { // a job moved to another node: its nodes too
			dst = appendNodes(dst, o.nodes)
		}
		return dst
	case recWorking:
		dst = append(dst, o.id...)
		dst = binary.AppendVarint(dst, o.qtime)
		if o.addNacks != 0 || o.addDeliveries != 0 {
			dst = binary.AppendUvarint(dst, uint64(o.addNacks))
			dst = binary.AppendUvarint(dst, uint64(o.addDeliveries))
		}
		return dst
	case recNack:
		dst = append(dst, o.id...)
		dst = binary.AppendVarint(dst, o.qtime)
		return binary.AppendVarint(dst, o.awake)
	case recAck, recDequeue:
		return append(dst, o.id...)
	case recNodes:
		return appendNodes(append(dst, o.id...), o.nodes)
	case recDel:
		dst = append(dst, o.id...)
		return appendLSNs(dst, o.creators)
	case recTomb:
		dst = append(dst, o.id...)
		dst = binary.AppendUvarint(dst, uint64(o.src))
		return appendLSNs(dst, o.creators)
	case recSnap:
		dst = appendJobHeader(dst, o.job)
		dst = binary.AppendUvarint(dst, uint64(o.job.BodyLSN))
		dst = binary.AppendUvarint(dst, uint64(o.job.BodySize))
		return binary.AppendUvarint(dst, uint64(o.job.StoredSize))
	case recMeta:
		dst = binary.AppendUvarint(dst, uint64(len(o.node)))
		dst = append(dst, o.node...)
		dst = binary.AppendUvarint(dst, o.maxCtime)
		dst = binary.AppendUvarint(dst, uint64(len(o.pauses)))
		for _, q := range sortedPauseQueues(o.pauses) {
			dst = append(dst, byte(o.pauses[q]))
			dst = binary.AppendUvarint(dst, uint64(len(q)))
			dst = append(dst, q...)
		}
		return dst
	case recMoveFull:
		return appendMovedBody(appendJobHeader(dst, o.job), o)
	case recPause:
		dst = append(dst, byte(o.pause))
		return append(dst, o.queue...)
	case recNode:
		return append(dst, o.node...)
	case recFlush:
		return dst
	case recMove:
		return appendMovedBody(append(dst, o.id...), o)
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
		var stored []byte
		stored, o.compressed, j.BodySize = d.bodyTail()
		o.job, o.id, o.bodySize = j, j.ID, j.BodySize
		o.body = append([]byte(nil), stored...)
		j.StoredSize = uint32(len(o.body))
	case recQueue, recRequeue:
		o.id = d.id()
		o.qtime = d.varint()
	case recDeliver:
		o.id = d.id()
		o.qtime = d.varint()
		if len(d.b) > 0 { // the node list, when the delivery set one
			var j Job
			d.nodes(&j)
			if d.err == nil && len(j.Nodes) == 0 {
				d.fail("empty node list")
			}
			o.nodes = j.Nodes
		}
	case recWorking:
		o.id = d.id()
		o.qtime = d.varint()
		if len(d.b) > 0 { // the counters, when some were bumped
			o.addNacks, o.addDeliveries = d.u32(), d.u32()
		}
	case recNack:
		o.id = d.id()
		o.qtime = d.varint()
		o.awake = d.varint()
	case recAck, recDequeue:
		o.id = d.id()
	case recNodes:
		o.id = d.id()
		var j Job
		d.nodes(&j)
		o.nodes = j.Nodes
	case recDel:
		o.id = d.id()
		if len(d.b) > 0 { // a format-2 DEL is the id alone
			o.creators = d.lsns()
		}
	case recTomb:
		o.id = d.id()
		o.src = wal.LSN(d.uvarint())
		o.creators = d.lsns()
	case recSnap:
		j := &Job{}
		d.jobHeader(j)
		j.BodyLSN = wal.LSN(d.uvarint())
		j.BodySize = d.u32()
		j.StoredSize = d.u32()
		o.job, o.id = j, j.ID
	case recMeta:
		o.node = d.str()
		o.maxCtime = d.uvarint()
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			d.fail("too many pause states")
		}
		o.pauses = make(map[string]PauseState, n)
		for i := uint64(0); i < n && d.err == nil; i++ {
			p := PauseState(d.byte())
			q := d.str()
			if d.err == nil && (p == PauseNone || p > PauseAll || q == "") {
				d.fail("bad pause state")
			}
			o.pauses[q] = p
		}
	case recMoveFull:
		j := &Job{}
		d.jobHeader(j)
		o.job, o.id = j, j.ID
		d.movedBody(o)
		j.BodySize = o.bodySize
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
		d.movedBody(o)
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

// jobEncodingVersion heads a job in an ADD record, and every index value of
// an index in format 1.
const jobEncodingVersion = 1

// indexValueVersion heads an index value (j/ and q/ keys) of format 2: the
// job without what its key or the store already says, which was more than
// half of a format-1 value. The id is in the key; the node list, when it is
// just this store's node (every job of a lone node), is a flag.
const indexValueVersion = 2

// Index value flags. indexFlagSelfNodes: the job's nodes are exactly the
// store's node. indexFlagCreators (format 3): the job's creator LSNs follow
// the body's location (without it they are just the body's LSN).
// indexFlagNodeNums (format 6): the node list is the count and each node's
// number in the store's table (nodenames.go), not the ids spelled out.
const (
	indexFlagSelfNodes = 1
	indexFlagCreators  = 2
	indexFlagNodeNums  = 4
)

// appendJobHeader encodes everything of a job but its body location.
func appendJobHeader(dst []byte, j *Job) []byte {
	dst = append(dst, jobEncodingVersion)
	dst = append(dst, j.ID...)
	dst = appendJobFields(dst, j)
	return appendNodes(dst, j.Nodes)
}

// appendJobFields encodes the fields between the id and the node list.
func appendJobFields(dst []byte, j *Job) []byte {
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
	return binary.AppendVarint(dst, j.AwakeTime)
}

func appendNodes(dst []byte, nodes []string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(nodes)))
	for _, n := range nodes {
		dst = binary.AppendUvarint(dst, uint64(len(n)))
		dst = append(dst, n...)
	}
	return dst
}

// encodeJob encodes a job's index value (format 2) for a store whose node
// id is self ("" before it has one: the node list is then written out).
// nums gives the numbers of interned node ids (nodenames.go): a list whose
// every id has one is written as numbers (format 6), any other spelled out
// (nil nums: always).
func encodeJob(dst []byte, j *Job, self string, nums func(id string) (uint32, bool)) []byte {
	dst = append(dst, indexValueVersion)
	selfOnly := self != "" && len(j.Nodes) == 1 && j.Nodes[0] == self
	flags := byte(0)
	if selfOnly {
		flags |= indexFlagSelfNodes
	}
	numbered := !selfOnly && len(j.Nodes) > 0 && nums != nil
	for _, n := range j.Nodes {
		if !numbered {
			break
		}
		_, numbered = nums(n)
	}
	if numbered {
		flags |= indexFlagNodeNums
	}
	explicit := !j.creatorsAreBody()
	if explicit {
		flags |= indexFlagCreators
	}
	dst = append(dst, flags)
	dst = appendJobFields(dst, j)
	switch {
	case numbered:
		dst = binary.AppendUvarint(dst, uint64(len(j.Nodes)))
		for _, n := range j.Nodes {
			num, _ := nums(n)
			dst = binary.AppendUvarint(dst, uint64(num))
		}
	case !selfOnly:
		dst = appendNodes(dst, j.Nodes)
	}
	dst = binary.AppendUvarint(dst, uint64(j.BodyLSN))
	dst = binary.AppendUvarint(dst, uint64(j.BodySize))
	dst = binary.AppendUvarint(dst, uint64(j.StoredSize))
	if explicit {
		dst = appendLSNs(dst, j.creatorLSNs)
	}
	return dst
}

// decodeJob decodes the index value of the job with this id, in any
// format. names is what a value may refer to: the store's node list (which
// decoded jobs share: Nodes is never modified in place) and its interned
// node ids.
func decodeJob(id string, b []byte, names *nodeNames) (*Job, error) {
	d := decoder{b: b}
	j := &Job{}
	flags := byte(0)
	switch {
	case len(b) > 0 && b[0] == jobEncodingVersion:
		d.jobHeader(j)
		if d.err == nil && j.ID != id {
			d.fail(fmt.Sprintf("holds job %q", j.ID))
		}
	case len(b) > 0 && b[0] == indexValueVersion:
		d.byte()
		flags = d.byte()
		if flags&^(indexFlagSelfNodes|indexFlagCreators|indexFlagNodeNums) != 0 {
			d.fail(fmt.Sprintf("unknown flags %#x", flags))
		}
		if flags&indexFlagSelfNodes != 0 && flags&indexFlagNodeNums != 0 {
			d.fail("two node lists")
		}
		if len(id) != JobIDLen {
			d.fail("bad id")
		}
		j.ID = id
		d.jobFields(j)
		switch {
		case flags&indexFlagSelfNodes != 0:
			self := names.selfList()
			if len(self) != 1 {
				d.fail("refers to the node id of a store that has none")
			}
			j.Nodes = self
		case flags&indexFlagNodeNums != 0:
			d.nodeNums(j, names)
		default:
			d.nodes(j)
		}
		d.checkState(j)
	default:
		d.fail("unknown job encoding version")
	}
	j.BodyLSN = wal.LSN(d.uvarint())
	j.BodySize = d.u32()
	j.StoredSize = d.u32()
	if flags&indexFlagCreators != 0 {
		j.creatorLSNs = d.lsns()
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return nil, fmt.Errorf("storage: malformed job record of %s: %v", id, d.err)
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

// appendMovedBody appends what a MOVE record carries after the job (what
// movedBody reads): the source LSN, flags, body size and stored body.
func appendMovedBody(dst []byte, o *op) []byte {
	dst = binary.AppendUvarint(dst, uint64(o.src))
	flags := byte(0)
	if o.compressed {
		flags |= flagCompressed
	}
	dst = append(dst, flags)
	dst = binary.AppendUvarint(dst, uint64(o.bodySize))
	return append(dst, o.body...)
}

// movedBody reads what a MOVE record carries after the job: the source
// LSN, flags, body size and stored body.
func (d *decoder) movedBody(o *op) {
	o.src = wal.LSN(d.uvarint())
	var stored []byte
	stored, o.compressed, o.bodySize = d.bodyTail()
	o.body = append([]byte(nil), stored...)
}

// bodyTail reads what ends an ADD or MOVE record: the flags, the body's
// size and the stored body (aliasing the payload), and checks them: known
// flags, a size in range and, uncompressed, a body of that length.
func (d *decoder) bodyTail() (stored []byte, compressed bool, size uint32) {
	flags := d.byte()
	size = d.u32()
	compressed = flags&flagCompressed != 0
	stored = d.rest()
	switch {
	case d.err != nil:
	case flags&^flagCompressed != 0:
		d.fail("unknown flags")
	case size > wal.MaxPayload:
		d.fail("body size out of range")
	case !compressed && len(stored) != int(size):
		d.fail("body length mismatch")
	}
	return stored, compressed, size
}

// lsns reads a list appendLSNs wrote.
func (d *decoder) lsns() []wal.LSN {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("too many lsns")
		return nil
	}
	if n == 0 {
		return nil
	}
	out := make([]wal.LSN, 0, n)
	prev := uint64(0)
	for i := uint64(0); i < n && d.err == nil; i++ {
		prev += d.uvarint()
		out = append(out, wal.LSN(prev))
	}
	return out
}

// appendLSNs appends an ascending list of LSNs: the count, then each as the
// difference from the one before.
func appendLSNs(dst []byte, lsns []wal.LSN) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(lsns)))
	prev := wal.LSN(0)
	for _, l := range lsns {
		dst = binary.AppendUvarint(dst, uint64(l-prev))
		prev = l
	}
	return dst
}

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
	d.jobFields(j)
	d.nodes(j)
	d.checkState(j)
}

// skipJobHeader steps over what jobHeader reads, field for field, checking
// its version and its varints but not its values, and returns the job's id
// (aliasing the payload): the body reads' walk to the body (read.go
// recordBody), which must not allocate a Job. A change to jobHeader or
// jobFields changes it too (TestBodyOfReadsWhatDecodeOpReads, FuzzBodyOf).
func (d *decoder) skipJobHeader() string {
	if v := d.byte(); d.err == nil && v != jobEncodingVersion {
		d.fail(fmt.Sprintf("unknown job encoding version %d", v))
	}
	id := unsafeString(d.bytes(JobIDLen))
	d.skipStr()   // the queue
	d.byte()      // the state
	d.uvarint()   // ctime
	d.varint()    // etime
	for range 6 { // delay, retry, repl, nacks, additional deliveries, deliveries
		d.uvarint()
	}
	d.varint() // queue time
	d.varint() // awake time
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("too many nodes")
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		d.skipStr()
	}
	return id
}

// skipStr steps over what str reads, without copying it.
func (d *decoder) skipStr() {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("short string")
		return
	}
	d.bytes(int(n))
}

func (d *decoder) jobFields(j *Job) {
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
}

func (d *decoder) nodes(j *Job) {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("too many nodes")
		return
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		j.Nodes = append(j.Nodes, d.str())
	}
}

// nodeNums reads a node list of numbers (indexFlagNodeNums).
func (d *decoder) nodeNums(j *Job, names *nodeNames) {
	n := d.uvarint()
	if n == 0 || n > uint64(len(d.b)) {
		d.fail("bad node count")
		return
	}
	j.Nodes = make([]string, 0, n)
	for i := uint64(0); i < n && d.err == nil; i++ {
		num := d.uvarint()
		id, ok := names.name(num)
		if !ok && d.err == nil {
			d.fail(fmt.Sprintf("refers to node number %d, which the store's table does not have", num))
		}
		j.Nodes = append(j.Nodes, id)
	}
}

func (d *decoder) checkState(j *Job) {
	if d.err == nil && (j.State < StateWaitRepl || j.State > StateAcked) {
		d.fail(fmt.Sprintf("bad job state %d", j.State))
	}
}

// sortedPauseQueues returns the queues of pauses in name order.
func sortedPauseQueues(pauses map[string]PauseState) []string {
	qs := make([]string, 0, len(pauses))
	for q := range pauses {
		qs = append(qs, q)
	}
	slices.Sort(qs)
	return qs
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
