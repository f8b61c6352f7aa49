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
//	REPLJOB  version flags count { id queue ctime etime delay retry repl awake nodes body }…
//	GOTJOB, DELJOB  version count { id }…
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
	size := 3
	for _, r := range jobs {
		size += 80 + len(r.Job.Queue) + 41*len(r.Job.Nodes) + len(r.Body)
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion)
	flags := byte(0)
	if noReply {
		flags |= replFlagNoReply
	}
	b = append(b, flags)
	b = binary.AppendUvarint(b, uint64(len(jobs)))
	for _, r := range jobs {
		j := r.Job
		b = appendJobHead(b, j)
		b = binary.AppendVarint(b, j.AwakeTime)
		b = appendNodes(b, j.Nodes)
		b = appendString(b, string(r.Body))
	}
	return b
}

func decodeReplJobs(p []byte) (noReply bool, jobs []replJob, err error) {
	d := msgDecoder{b: p}
	d.version()
	flags := d.byte()
	if d.err == nil && flags&^replFlagNoReply != 0 {
		d.fail("unknown flags")
	}
	n := d.count(minReplJobBytes)
	for i := 0; i < n && d.err == nil; i++ {
		j := &storage.Job{ID: d.id()}
		j.Queue = d.queueName()
		j.Ctime = d.uvarint()
		j.Etime = d.varint()
		j.Delay = d.u32()
		j.Retry = d.u32()
		j.Repl = uint16(d.bounded(65535))
		j.AwakeTime = d.varint()
		j.Nodes = d.nodes()
		body := d.str()
		jobs = append(jobs, replJob{Job: j, Body: []byte(body)})
	}
	if err := d.end(); err != nil {
		return false, nil, err
	}
	return flags&replFlagNoReply != 0, jobs, nil
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

func (d *msgDecoder) str() string {
	n := d.uvarint()
	if d.err == nil && n > uint64(len(d.b)) {
		d.fail("short string")
		return ""
	}
	if d.err != nil {
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
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
func (d *msgDecoder) queueName() string {
	name := d.str()
	if d.err == nil && (name == "" || len(name) > storage.MaxQueueNameLen) {
		d.fail("bad queue name")
	}
	return name
}

// nodes reads a job's node list: at most maxNodesPerJob valid node ids.
func (d *msgDecoder) nodes() []string {
	n := d.count(2)
	if n > maxNodesPerJob {
		d.fail("too many nodes")
		return nil
	}
	var ids []string
	for k := 0; k < n && d.err == nil; k++ {
		id := d.str()
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
