package storage

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/diskque/diskque/wal"
)

// The keyspace (DESIGN.md "The log is the truth"). Integers are big-endian so
// that byte order is numeric order.
//
//	j <id:40>                                  → job meta (encodeJob)
//	q <len:2> <queue> <ctime:8> <id:40>         → job meta, the same as its j key;
//	                                              present iff the job is queued
//	s <due:8> <kind:1> <id:40>                  → ""   schedule: delay, retry, ttl
//	p <queue>                                   → pause state (1 byte)
//	c <queue>                                   → queued count (uvarint), absent when 0
//	g <segment first lsn:8>                     → segment accounting (accounting.go)
//	h <creator segment:8> <deletion lsn:8>      → ""   a deletion still needed while the
//	                                              creator segment is in the AOF
//	r <id:40>                                   → ""   the resume set: the job is acked or
//	                                              wait-repl (resume.go, format 6)
//	n <number:4>                                → a node id interned (nodenames.go, format 6)
//	m <name>                                    → store metadata (applied LSN, node id, …)
const (
	prefixJob      = 'j'
	prefixQueue    = 'q'
	prefixSchedule = 's'
	prefixPause    = 'p'
	prefixCount    = 'c'
	prefixSegment  = 'g'
	prefixHold     = 'h'
	prefixMeta     = 'm'
	prefixResume   = 'r'
	prefixNodeName = 'n'
)

var (
	// keyState holds the applied LSN (8 bytes), the job count (uvarint)
	// and the highest ctime of any job added (uvarint), written together
	// with every buffer flush. An index written before the ctime was kept
	// has only the first two.
	keyState  = []byte("mstate")
	keyFormat = []byte("mformat")
	keyNodeID = []byte("mnode")
	// keyRebuild is set while the index is being rebuilt from the AOF
	// (Store.rebuild): an index that has it is a rebuild cut short, and is
	// rebuilt again.
	keyRebuild = []byte("mrebuild")
)

// indexState is the value of keyState.
type indexState struct {
	applied wal.LSN
	jobs    int64
	// maxCtime is the highest ctime of any job ever added (FlushAll and
	// deletes do not lower it), so that a restart's CtimeClock never issues
	// a smaller one, whatever the wall clock did meanwhile.
	maxCtime uint64
	// hasMaxCtime: the value carried maxCtime (an older index's did not).
	hasMaxCtime bool
}

func encodeState(st indexState) []byte {
	v := binary.BigEndian.AppendUint64(make([]byte, 0, 24), uint64(st.applied))
	v = binary.AppendUvarint(v, uint64(st.jobs))
	return binary.AppendUvarint(v, st.maxCtime)
}

func decodeState(v []byte) (indexState, error) {
	bad := fmt.Errorf("storage: malformed state key")
	if len(v) < 9 {
		return indexState{}, bad
	}
	st := indexState{applied: wal.LSN(binary.BigEndian.Uint64(v))}
	jobs, n := binary.Uvarint(v[8:])
	if n <= 0 {
		return indexState{}, bad
	}
	st.jobs = int64(jobs)
	rest := v[8+n:]
	if len(rest) == 0 {
		return st, nil // written before maxCtime was kept
	}
	ctime, m := binary.Uvarint(rest)
	if m <= 0 || m != len(rest) {
		return indexState{}, bad
	}
	st.maxCtime, st.hasMaxCtime = ctime, true
	return st, nil
}

// formatVersion is the index's format. Format 1 wrote index values with
// the id and node list spelled out; format 2 (encodeJob) leaves out what the
// key or the store says; format 3 adds a job's creator LSNs where they are
// more than its body's (Job.creatorLSNs); format 4 keeps the deletions still
// needed (h/ keys, counted in g/ values); format 5 says the AOF may hold
// the cluster's records (NODES) and dummy acks (acked jobs with no queue),
// which an older build cannot replay; format 6 interns node ids (n/ keys:
// a value lists numbers, indexFlagNodeNums) and keeps the resume set (r/
// keys). Open reads all six, marks an older index as format 6 (its old
// values stay readable; the holds a format-3 index counted without keys
// get them, and an index of format 5 or older its resume set:
// accounting.go upgradeIndex), and refuses any other.
const formatVersion = 6

// EventKind is the kind of a schedule event.
type EventKind uint8

const (
	// EventDelay: a delayed (or NACK DELAY) job is due to be queued.
	EventDelay EventKind = 'd'
	// EventRetry: an unacked job is due to be queued again.
	EventRetry EventKind = 'r'
	// EventTTL: the job expires.
	EventTTL EventKind = 't'
)

func (k EventKind) String() string {
	switch k {
	case EventDelay:
		return "delay"
	case EventRetry:
		return "retry"
	case EventTTL:
		return "ttl"
	}
	return "unknown"
}

func jobKey(id string) []byte { return appendJobKey(make([]byte, 0, 1+len(id)), id) }

func appendJobKey(dst []byte, id string) []byte { return append(append(dst, prefixJob), id...) }

// queuePrefix is the prefix of every queue-order key of queue.
func queuePrefix(queue string) []byte {
	k := make([]byte, 0, 3+len(queue)+8+JobIDLen)
	k = append(k, prefixQueue)
	k = binary.BigEndian.AppendUint16(k, uint16(len(queue)))
	return append(k, queue...)
}

func queueKey(queue string, ctime uint64, id string) []byte {
	return appendQueueKey(nil, queue, ctime, id)
}

func appendQueueKey(dst []byte, queue string, ctime uint64, id string) []byte {
	dst = append(dst, prefixQueue)
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(queue)))
	dst = append(dst, queue...)
	dst = binary.BigEndian.AppendUint64(dst, ctime)
	return append(dst, id...)
}

// parseQueueKey returns the ctime and id of a queue-order key.
func parseQueueKey(k []byte) (ctime uint64, id string, err error) {
	if len(k) < 3 || k[0] != prefixQueue {
		return 0, "", errBadKey
	}
	n := int(binary.BigEndian.Uint16(k[1:3]))
	rest := k[3:]
	if len(rest) != n+8+JobIDLen {
		return 0, "", errBadKey
	}
	return binary.BigEndian.Uint64(rest[n : n+8]), string(rest[n+8:]), nil
}

func scheduleKey(due int64, kind EventKind, id string) []byte {
	return appendScheduleKey(make([]byte, 0, 1+8+1+len(id)), due, kind, id)
}

func appendScheduleKey(dst []byte, due int64, kind EventKind, id string) []byte {
	dst = append(dst, prefixSchedule)
	dst = binary.BigEndian.AppendUint64(dst, uint64(due))
	dst = append(dst, byte(kind))
	return append(dst, id...)
}

func parseScheduleKey(k []byte) (Event, error) {
	if len(k) != 1+8+1+JobIDLen || k[0] != prefixSchedule {
		return Event{}, errBadKey
	}
	return Event{
		Due:  int64(binary.BigEndian.Uint64(k[1:9])),
		Kind: EventKind(k[9]),
		ID:   string(k[10:]),
	}, nil
}

func pauseKey(queue string) []byte { return append([]byte{prefixPause}, queue...) }
func countKey(queue string) []byte { return append([]byte{prefixCount}, queue...) }

func segmentKey(first uint64) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixSegment}, first)
}

// holdKey is the key of the hold of the deletion at lsn on creator
// segment cs (accounting.go).
func holdKey(cs, lsn wal.LSN) []byte {
	k := binary.BigEndian.AppendUint64(append(make([]byte, 0, 17), prefixHold), uint64(cs))
	return binary.BigEndian.AppendUint64(k, uint64(lsn))
}

// holdPrefix is the prefix of the holds on creator segment cs.
func holdPrefix(cs wal.LSN) []byte {
	return binary.BigEndian.AppendUint64([]byte{prefixHold}, uint64(cs))
}

var errBadKey = errors.New("storage: malformed index key")

// prefixEnd returns the smallest key greater than every key with prefix p.
func prefixEnd(p []byte) []byte {
	end := append([]byte(nil), p...)
	for i := len(end) - 1; i >= 0; i-- {
		end[i]++
		if end[i] != 0 {
			return end[:i+1]
		}
	}
	return nil
}
