package replication

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/diskque/diskque/storage"
)

// The job protocol's payloads (Message.Payload of MsgReplJob, MsgGotJob,
// MsgSetAck, MsgGotAck, MsgDelJob). Every payload starts with codecVersion;
// integers are varints, strings a uvarint length and the bytes. Decoding is
// bounded by the payload: a count larger than the bytes left, a bad id or
// a trailing byte is ErrBadPayload, never a panic or a large allocation.
//
//	REPLJOB  version flags [incarnation] count { id queue ctime etime delay retry repl awake nodes body }…
//	GOTJOB   version count { id }…   or   2 incarnation count { id }…
//	DELJOB   version count { id }…
//	SETACK   version count { id mayhave }…
//	GOTACK   version count { id known }…
//
// SETACK's mayhave is how many nodes the sender knows may hold the job,
// itself included (0 for a dummy ack): a receiver that knows more does not
// answer GOTACK (it would let the sender finish with a holder left out)
// but collects the job itself (Disque's SETACK aux field).
const codecVersion = 1

// replFlagNoReply: the sender wants no GOTJOB (ASYNC).
const replFlagNoReply = 1

// replFlagFirst: every job of the REPLJOB is the first its origin sends
// the receiver, and the incarnation of the receiver's store the origin
// learned (from its GOTJOBs) follows the flags: the receiver may store
// the copies without the index lookup (storage.Batch.AddReplicaFirst).
// A GOTJOB of version gotJobVersionInc carries the incarnation. An origin
// marks nothing for a node whose GOTJOBs carry none (an older build,
// which would refuse the flag); an older origin refuses the new GOTJOB,
// so the nodes of a cluster run builds that both have it.
const replFlagFirst = 2

// gotJobVersionInc is the version of a GOTJOB that carries the sender
// store's incarnation (storage.Store.ReplicaIncarnation).
const gotJobVersionInc = 2

// replHeader is what a REPLJOB says of all its jobs.
type replHeader struct {
	noReply bool   // ASYNC: no GOTJOB
	first   uint64 // not 0: replFlagFirst, with this incarnation
}

// ErrBadPayload: a message payload that does not decode; it is dropped.
var ErrBadPayload = errors.New("replication: malformed message payload")

// maxNodesPerJob bounds the node list of one job in a message.
const maxNodesPerJob = 1024

// replJob is one job of a REPLJOB.
type replJob struct {
	Job  *storage.Job
	Body []byte
}

func encodeReplJobs(noReply bool, jobs []replJob) []byte {
	return encodeReplJobsHeader(replHeader{noReply: noReply}, jobs)
}

func encodeReplJobsHeader(h replHeader, jobs []replJob) []byte {
	size := 3 + binary.MaxVarintLen64
	for _, r := range jobs {
		size += 80 + len(r.Job.Queue) + 41*len(r.Job.Nodes) + len(r.Body)
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion)
	flags := byte(0)
	if h.noReply {
		flags |= replFlagNoReply
	}
	if h.first != 0 {
		flags |= replFlagFirst
	}
	b = append(b, flags)
	if h.first != 0 {
		b = binary.AppendUvarint(b, h.first)
	}
	b = binary.AppendUvarint(b, uint64(len(jobs)))
	for _, r := range jobs {
		j := r.Job
		b = appendJobHead(b, j)
		b = binary.AppendVarint(b, j.AwakeTime)
		b = appendNodes(b, j.Nodes)
		b = appendBytes(b, r.Body)
	}
	return b
}

func decodeReplJobs(p []byte) (h replHeader, jobs []replJob, err error) {
	d := msgDecoder{b: p}
	d.version()
	flags := d.byte()
	if d.err == nil && flags&^(replFlagNoReply|replFlagFirst) != 0 {
		d.fail("unknown flags")
	}
	if flags&replFlagFirst != 0 {
		if h.first = d.uvarint(); d.err == nil && h.first == 0 {
			d.fail("first REPLJOB of incarnation 0")
		}
	}
	n := d.count(minReplJobBytes)
	// One array of jobs for the message, and its node ids and queue names
	// decoded once (a Replicate call's jobs share them): a replica decodes
	// every copy it stores: decoding was half of a replica's allocations,
	// and its GC 17% of its CPU. The jobs share strings only, never an array.
	slab := make([]storage.Job, n)
	jobs = make([]replJob, 0, n)
	var seen internTable
	for i := 0; i < n && d.err == nil; i++ {
		j := &slab[i]
		j.ID = d.id()
		j.Queue = d.queueNameIn(&seen)
		j.Ctime = d.uvarint()
		j.Etime = d.varint()
		j.Delay = d.u32()
		j.Retry = d.u32()
		j.Repl = uint16(d.bounded(65535))
		j.AwakeTime = d.varint()
		j.Nodes = d.nodesIn(&seen)
		jobs = append(jobs, replJob{Job: j, Body: d.bytes()})
	}
	if err := d.end(); err != nil {
		return replHeader{}, nil, err
	}
	h.noReply = flags&replFlagNoReply != 0
	return h, jobs, nil
}

// minReplJobBytes is the fewest bytes one job takes in a REPLJOB (its id and a
// byte per field), which bounds the count a payload may claim.
const minReplJobBytes = storage.JobIDLen + 10

func encodeIDs(ids []string) []byte {
	b := make([]byte, 0, 2+len(ids)*storage.JobIDLen)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = append(b, id...)
	}
	return b
}

// encodeGotJobs is GOTJOB's payload: the ids, and the incarnation of this
// node's store (0: none, a version-1 payload).
func encodeGotJobs(ids []string, incarnation uint64) []byte {
	if incarnation == 0 {
		return encodeIDs(ids)
	}
	b := make([]byte, 0, 2+binary.MaxVarintLen64+len(ids)*storage.JobIDLen)
	b = append(b, gotJobVersionInc)
	b = binary.AppendUvarint(b, incarnation)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for _, id := range ids {
		b = append(b, id...)
	}
	return b
}

// decodeGotJobs reads either GOTJOB payload (incarnation 0: a version-1
// one, which carries none). The ids of an incarnation payload share one
// string (sharedIDs): look them up, keep none.
func decodeGotJobs(p []byte) (ids []string, incarnation uint64, err error) {
	if len(p) == 0 || p[0] != gotJobVersionInc {
		ids, err = decodeIDs(p)
		return ids, 0, err
	}
	d := msgDecoder{b: p[1:]}
	if incarnation = d.uvarint(); d.err == nil && incarnation == 0 {
		d.fail("GOTJOB of incarnation 0")
	}
	n := d.count(storage.JobIDLen)
	ids = d.sharedIDs(n)
	if err := d.end(); err != nil {
		return nil, 0, err
	}
	return ids, incarnation, nil
}

func decodeIDs(p []byte) ([]string, error) {
	d := msgDecoder{b: p}
	d.version()
	n := d.count(storage.JobIDLen)
	ids := make([]string, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, d.id())
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return ids, nil
}

func encodeSetAcks(ids []string, mayhave []int) []byte {
	b := make([]byte, 0, 2+len(ids)*(storage.JobIDLen+2))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for i, id := range ids {
		b = append(b, id...)
		b = binary.AppendUvarint(b, uint64(mayhave[i]))
	}
	return b
}

func decodeSetAcks(p []byte) ([]string, []int, error) {
	d := msgDecoder{b: p}
	d.version()
	n := d.count(storage.JobIDLen + 1)
	ids, mayhave := make([]string, 0, n), make([]int, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, d.id())
		mayhave = append(mayhave, int(d.bounded(maxNodesPerJob)))
	}
	if err := d.end(); err != nil {
		return nil, nil, err
	}
	return ids, mayhave, nil
}

func encodeGotAcks(ids []string, known []bool) []byte {
	b := make([]byte, 0, 2+len(ids)*(storage.JobIDLen+1))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for i, id := range ids {
		b = append(b, id...)
		k := byte(0)
		if known[i] {
			k = 1
		}
		b = append(b, k)
	}
	return b
}

func decodeGotAcks(p []byte) ([]string, []bool, error) {
	d := msgDecoder{b: p}
	d.version()
	n := d.count(storage.JobIDLen + 1)
	ids, known := make([]string, 0, n), make([]bool, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, d.id())
		k := d.byte()
		if d.err == nil && k > 1 {
			d.fail("bad known flag")
		}
		known = append(known, k == 1)
	}
	if err := d.end(); err != nil {
		return nil, nil, err
	}
	return ids, known, nil
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendBytes is appendString of a []byte, without a string's copy.
func appendBytes(b []byte, p []byte) []byte {
	b = binary.AppendUvarint(b, uint64(len(p)))
	return append(b, p...)
}

// msgDecoder reads the encodings above; the first error sticks and every
// read after it returns zero values.
type msgDecoder struct {
	b   []byte
	err error
}

func (d *msgDecoder) fail(msg string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: %s", ErrBadPayload, msg)
	}
	d.b = nil
}

func (d *msgDecoder) end() error {
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	return d.err
}

func (d *msgDecoder) version() {
	if v := d.byte(); d.err == nil && v != codecVersion {
		d.fail(fmt.Sprintf("unknown version %d", v))
	}
}

func (d *msgDecoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("short")
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *msgDecoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("bad uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *msgDecoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("bad varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *msgDecoder) bounded(limit uint64) uint64 {
	v := d.uvarint()
	if v > limit {
		d.fail("value out of range")
		return 0
	}
	return v
}

func (d *msgDecoder) u32() uint32 { return uint32(d.bounded(1<<32 - 1)) }

// count reads an element count, each element at least min bytes: more than
// the payload can hold is an error, so no allocation follows a lie.
func (d *msgDecoder) count(min int) int {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)/min) {
		d.fail("count larger than the payload")
		return 0
	}
	return int(n)
}

// raw reads a length-prefixed string's bytes, aliasing the payload (nil
// after an error): what str, bytes and strIn copy or look up.
func (d *msgDecoder) raw() []byte {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.fail("short string")
	}
	if d.err != nil {
		return nil
	}
	r := d.b[:n:n]
	d.b = d.b[n:]
	return r
}

func (d *msgDecoder) str() string { return string(d.raw()) }

// bytes reads a string's bytes into a new array.
func (d *msgDecoder) bytes() []byte {
	r := d.raw()
	if d.err != nil {
		return nil
	}
	b := make([]byte, len(r))
	copy(b, r)
	return b
}

// internTable holds the strings one message decoded that its jobs are
// likely to repeat (node ids, queue names), so they are allocated once.
// It is bounded: beyond internMax strings, new ones are not kept.
type internTable struct {
	strs [internMax]string
	n    int
}

const internMax = 16

// strIn reads a string as str does, as the one in t when t has it (t nil:
// str).
func (d *msgDecoder) strIn(t *internTable) string {
	raw := d.raw()
	if d.err != nil {
		return ""
	}
	if t == nil {
		return string(raw)
	}
	for _, s := range t.strs[:t.n] {
		if s == string(raw) { // compared without an allocation
			return s
		}
	}
	s := string(raw)
	if t.n < internMax {
		t.strs[t.n], t.n = s, t.n+1
	}
	return s
}

// sharedIDs reads n job ids as id does, into one string they all share:
// two allocations, not one an id. Only for ids their receiver just looks
// up (a GOTJOB's): one kept would keep the whole string.
func (d *msgDecoder) sharedIDs(n int) []string {
	if d.err != nil {
		return nil
	}
	if len(d.b) < n*storage.JobIDLen {
		d.fail("short id")
		return nil
	}
	all := string(d.b[:n*storage.JobIDLen])
	d.b = d.b[n*storage.JobIDLen:]
	ids := make([]string, n)
	for i := range ids {
		ids[i] = all[i*storage.JobIDLen : (i+1)*storage.JobIDLen]
		if !storage.ValidJobID(ids[i]) {
			d.fail("bad job id")
			return nil
		}
	}
	return ids
}

func (d *msgDecoder) id() string {
	if len(d.b) < storage.JobIDLen {
		d.fail("short id")
		return ""
	}
	id := string(d.b[:storage.JobIDLen])
	d.b = d.b[storage.JobIDLen:]
	if !storage.ValidJobID(id) {
		d.fail("bad job id")
	}
	return id
}

// queueName reads a queue name: not empty, at most MaxQueueNameLen.
func (d *msgDecoder) queueName() string { return d.queueNameIn(nil) }

// queueNameIn is queueName, its string shared through t (if not nil).
func (d *msgDecoder) queueNameIn(t *internTable) string {
	name := d.strIn(t)
	if d.err == nil && (name == "" || len(name) > storage.MaxQueueNameLen) {
		d.fail("bad queue name")
	}
	return name
}

// nodes reads a job's node list: at most maxNodesPerJob valid node ids.
func (d *msgDecoder) nodes() []string { return d.nodesIn(nil) }

// nodesIn is nodes, the ids shared through t (if not nil); the list is
// the job's own.
func (d *msgDecoder) nodesIn(t *internTable) []string {
	n := d.count(2)
	if n > maxNodesPerJob {
		d.fail("too many nodes")
		return nil
	}
	var ids []string
	if n > 0 {
		ids = make([]string, 0, n)
	}
	for k := 0; k < n && d.err == nil; k++ {
		id := d.strIn(t)
		if d.err == nil && !storage.ValidNodeID(id) {
			d.fail("bad node id")
		}
		ids = append(ids, id)
	}
	return ids
}

// appendJobHead appends what REPLJOB and YOURJOBS carry first of a job:
// its id, queue, ctime, etime, delay, retry and replication level.
func appendJobHead(b []byte, j *storage.Job) []byte {
	b = append(b, j.ID...)
	b = appendString(b, j.Queue)
	b = binary.AppendUvarint(b, j.Ctime)
	b = binary.AppendVarint(b, j.Etime)
	b = binary.AppendUvarint(b, uint64(j.Delay))
	b = binary.AppendUvarint(b, uint64(j.Retry))
	return binary.AppendUvarint(b, uint64(j.Repl))
}

// appendNodes appends a job's node list (msgDecoder.nodes reads it).
func appendNodes(b []byte, nodes []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(nodes)))
	for _, n := range nodes {
		b = appendString(b, n)
	}
	return b
}
