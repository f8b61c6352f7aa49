package storage

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"sync"

	"github.com/diskque/diskque/wal"
)

// State is a job's lifecycle state (SPEC.md "Job model").
type State uint8

const (
	// StateWaitRepl: added, waiting for synchronous replication.
	StateWaitRepl State = 1
	// StateActive: known to this node but not queued: delivered, delayed,
	// or a replica's copy.
	StateActive State = 2
	// StateQueued: in this node's queue, deliverable.
	StateQueued State = 3
	// StateAcked: acknowledged, kept until every copy's owner confirms.
	StateAcked State = 4
)

// String returns Disque's name for the state.
func (s State) String() string {
	switch s {
	case StateWaitRepl:
		return "wait-repl"
	case StateActive:
		return "active"
	case StateQueued:
		return "queued"
	case StateAcked:
		return "acked"
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Job is the index's record of one job. Times are Unix milliseconds unless
// named otherwise; 0 means "none".
type Job struct {
	ID    string // 40 characters, see NewJobID
	Queue string
	State State
	// Ctime orders the queue: milliseconds × 1,000,000, strictly increasing
	// per node (see CtimeClock).
	Ctime uint64
	// Etime is the absolute expiry: at Etime the job is deleted in whatever
	// state.
	Etime int64
	Delay uint32 // seconds
	Retry uint32 // seconds; 0 = at-most-once
	Repl  uint16 // replication factor
	// Nacks counts NACKs; AdditionalDeliveries counts requeues after a
	// delivery (SPEC.md "Requeue").
	Nacks                uint32
	AdditionalDeliveries uint32
	// Deliveries counts GETJOB deliveries of this copy.
	Deliveries uint32
	// QueueTime is when an unacked job is queued again (0: never).
	QueueTime int64
	// AwakeTime is when an active job waiting for its DELAY (or a NACK
	// DELAY) is queued (0: not waiting).
	AwakeTime int64
	// Nodes are the ids of the nodes that may hold a copy.
	Nodes []string

	// BodyLSN locates the ADD record holding the body in the AOF.
	BodyLSN wal.LSN
	// BodySize is the body's length as given; StoredSize its length in the
	// AOF (smaller when compressed).
	BodySize   uint32
	StoredSize uint32
	// creatorLSNs are the LSNs of the job's records that could create it in a
	// replay of the AOF from its first segment — its ADD, and the MOVE and
	// SNAP records that carry its whole state — as far as their segments
	// may still be in the AOF; nil means just BodyLSN. A deletion logs them,
	// so that the deletion is carried forward while any of them remains
	// (forward.go). Shared between versions of the job: never modified in
	// place.
	creatorLSNs []wal.LSN
}

// creators returns the job's creator LSNs (see creatorLSNs).
func (j *Job) creators() []wal.LSN {
	if j.creatorLSNs == nil {
		return []wal.LSN{j.BodyLSN}
	}
	return j.creatorLSNs
}

// creatorsAreBody reports whether the job's creators are just its body's
// record (the index value then leaves them out).
func (j *Job) creatorsAreBody() bool {
	return j.creatorLSNs == nil || len(j.creatorLSNs) == 1 && j.creatorLSNs[0] == j.BodyLSN
}

// CtimeMillis returns the wall-clock millisecond of the job's creation.
func (j *Job) CtimeMillis() int64 { return int64(j.Ctime / 1_000_000) }

// Delayed reports whether the job is waiting for its DELAY (or a NACK DELAY).
func (j *Job) Delayed() bool { return j.State == StateActive && j.AwakeTime != 0 }

// JobIDLen is the length of every job id.
const JobIDLen = 40

// JobIDPrefix is the start of every id NewJobID makes for nodeID: "D-", its
// first 8 hex digits (padded with 0s), "-".
func JobIDPrefix(nodeID string) string {
	var b [11]byte
	putJobIDPrefix(b[:], nodeID)
	return string(b[:])
}

// putJobIDPrefix writes JobIDPrefix(nodeID) into b[:11], without allocating
// (NewJobID runs for every ADDJOB).
func putJobIDPrefix(b []byte, nodeID string) {
	b[0], b[1], b[10] = 'D', '-', '-'
	n := copy(b[2:10], nodeID)
	for i := 2 + n; i < 10; i++ {
		b[i] = '0'
	}
}

// ValidJobID checks what Disque checks of an id: length 40, the "D-" prefix
// and '-' at offsets 10 and 35. Anything else is -BADID.
func ValidJobID(id string) bool {
	return len(id) == JobIDLen && id[0] == 'D' && id[1] == '-' && id[10] == '-' && id[35] == '-'
}

// NewJobID makes an id per SPEC.md: "D-", the first 8 hex digits of the node
// id, "-", 144 random bits in base64, "-", and the TTL in minutes as 4 hex
// digits (capped at 65535) whose lowest bit is 1 when retry > 0 and 0 for an
// at-most-once job (retry == 0).
func NewJobID(nodeID string, ttlSeconds, retrySeconds int64) string {
	var b [JobIDLen]byte
	putJobIDPrefix(b[:11], nodeID)
	var rnd [18]byte
	_, _ = rand.Read(rnd[:]) // crypto/rand.Read never fails on Linux (Go ≥ 1.24)
	base64.StdEncoding.Encode(b[11:35], rnd[:])
	b[35] = '-'
	mins := min(max(ttlSeconds/60, 0), 65535)
	if retrySeconds > 0 {
		mins |= 1
	} else {
		mins &^= 1
	}
	hex.Encode(b[36:40], []byte{byte(mins >> 8), byte(mins)})
	return string(b[:])
}

// IDNodePrefix returns the 8 hex digits of the creating node's id that a job
// id carries (clients route on them, and so will the cluster's nodes).
func IDNodePrefix(id string) string { return id[2:10] }

// IDAtMostOnce reports whether the id's TTL digits mark an at-most-once job
// (RETRY 0), for a node that sees the id without the job: a cluster's
// dummy ack of a job it never held takes what it knows from the id.
func IDAtMostOnce(id string) bool { return hexDigit(id[39])&1 == 0 }

// IDTTLMinutes is the TTL a job id carries, in minutes (its last 4 hex
// digits, the lowest bit aside): a dummy ack of an id lives that long.
func IDTTLMinutes(id string) int64 {
	var mins int64
	for _, c := range []byte(id[36:40]) {
		mins = mins<<4 | int64(hexDigit(c))
	}
	return mins
}

// hexDigit is the value of one hex digit of an id (0 for anything else:
// the caller checked the id's shape, ValidJobID).
func hexDigit(c byte) byte {
	switch {
	case c >= '0' && c <= '9':
		return c - '0'
	case c >= 'a' && c <= 'f':
		return c - 'a' + 10
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10
	}
	return 0
}

// NewNodeID returns a random 40-hex-digit node id.
func NewNodeID() string {
	var b [20]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// CtimeClock issues ctimes: milliseconds × 1,000,000, strictly increasing.
// Two jobs in the same millisecond get consecutive values; a clock that steps
// back never makes ctime go back. Safe for concurrent use.
type CtimeClock struct {
	mu   sync.Mutex
	last uint64
}

// Next returns the ctime for a job created at nowMillis.
func (c *CtimeClock) Next(nowMillis int64) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	t := uint64(max(nowMillis, 0)) * 1_000_000
	if t <= c.last {
		t = c.last + 1
	}
	c.last = t
	return t
}

// Last is the highest ctime issued or observed so far: every ctime Next
// returns from now on is greater.
func (c *CtimeClock) Last() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.last
}

// Observe makes later ctimes sort after ctime (used after recovery).
func (c *CtimeClock) Observe(ctime uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last = max(c.last, ctime)
}
