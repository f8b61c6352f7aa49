package storage

import (
	"errors"
	"fmt"
)

// Errors of the lifecycle operations.
var (
	// ErrNotFound: no job with that id is known to this store.
	ErrNotFound = errors.New("storage: job not found")
	// ErrExists: Add of an id that is already known.
	ErrExists = errors.New("storage: job already exists")
	// ErrWrongState: the operation does not apply to the job's current
	// state (Deliver of a job that is not queued, Ack of an acked job, …).
	// Nothing was written.
	ErrWrongState = errors.New("storage: operation not valid in the job's state")
	// ErrInvalidJob: Add of a job whose fields break the job model.
	ErrInvalidJob = errors.New("storage: invalid job")
)

// transition is the job state machine: given the current job (never nil) and
// a decoded record, it returns the job after the record, or nil when the job
// is deleted. It does not modify cur. Live operations call it to validate
// before they log; recovery calls it to replay, so both derive the index from
// the same function.
func transition(cur *Job, o *op) (*Job, error) {
	if o.typ == recDel {
		return nil, nil
	}
	if o.typ == recSnap {
		// The job's state written again (forward.go): nothing changes but
		// its creators (write sets them).
		j := *cur
		return &j, nil
	}
	if o.typ == recMove || o.typ == recMoveFull {
		// The collector copied the body forward; only its location
		// changes (write sets it), whatever the job's state. A body that
		// moved or was replaced since the collector read it stays put.
		if cur.BodyLSN != o.src {
			return nil, fmt.Errorf("%w: %s's body is no longer at lsn %d", ErrWrongState, cur.ID, o.src)
		}
		j := *cur
		return &j, nil
	}
	if o.typ == recNodes {
		// Who may hold a copy changes in any state: an acked job's list
		// is what its ack GC asks. A wait-repl job's nodes are recorded
		// once its replication is achieved: it becomes active (queued
		// next, or at its DELAY), as in Disque's jobReplicationAchieved.
		j := *cur
		j.Nodes = o.nodes
		if j.State == StateWaitRepl {
			j.State = StateActive
		}
		return &j, nil
	}
	if cur.State == StateAcked {
		return nil, fmt.Errorf("%w: %s is acked", ErrWrongState, cur.ID)
	}
	if cur.Retry == 0 && cur.Deliveries > 0 && (o.typ == recQueue || o.typ == recRequeue || o.typ == recNack) {
		// At-most-once: once delivered, never queued again (SPEC.md).
		return nil, fmt.Errorf("%w: %s is at-most-once and was delivered", ErrWrongState, cur.ID)
	}
	j := *cur
	switch o.typ {
	case recQueue:
		if cur.State == StateQueued {
			return nil, fmt.Errorf("%w: %s is already queued", ErrWrongState, cur.ID)
		}
		j.State = StateQueued
		j.AwakeTime = 0
		j.QueueTime = requeueAt(&j, o.qtime)
	case recDeliver:
		if cur.State != StateQueued {
			return nil, fmt.Errorf("%w: %s is %s, not queued", ErrWrongState, cur.ID, cur.State)
		}
		j.State = StateActive
		j.Deliveries++
		j.QueueTime = requeueAt(&j, o.qtime)
	case recRequeue:
		if cur.State != StateActive {
			return nil, fmt.Errorf("%w: %s is %s, not active", ErrWrongState, cur.ID, cur.State)
		}
		if cur.Deliveries > 0 {
			j.AdditionalDeliveries++
		}
		j.State = StateQueued
		j.AwakeTime = 0
		j.QueueTime = requeueAt(&j, o.qtime)
	case recNack:
		if cur.State != StateActive {
			return nil, fmt.Errorf("%w: %s is %s, not active", ErrWrongState, cur.ID, cur.State)
		}
		j.Nacks++
		if o.awake != 0 {
			// NACK … DELAY: wait like a delayed job, no retry timer meanwhile.
			j.AwakeTime, j.QueueTime = o.awake, 0
		} else {
			j.State = StateQueued
			j.AwakeTime = 0
			j.QueueTime = requeueAt(&j, o.qtime)
		}
	case recWorking:
		if cur.Retry == 0 {
			return nil, fmt.Errorf("%w: %s is at-most-once", ErrWrongState, cur.ID)
		}
		j.QueueTime = o.qtime
		j.Nacks += o.addNacks
		j.AdditionalDeliveries += o.addDeliveries
	case recDequeue:
		if cur.State != StateQueued {
			return nil, fmt.Errorf("%w: %s is %s, not queued", ErrWrongState, cur.ID, cur.State)
		}
		j.State = StateActive
	case recAck:
		j.State = StateAcked
		j.QueueTime, j.AwakeTime = 0, 0
	default:
		return nil, fmt.Errorf("storage: record type %d is not a job transition", o.typ)
	}
	j.Nodes = cur.Nodes // shared, never mutated in place
	if o.typ == recDeliver && o.nodes != nil {
		// A job moved to another node (federation): who may hold a copy
		// now, in the delivery's own record.
		j.Nodes = o.nodes
	}
	return &j, nil
}

// requeueAt is the requeue time qtime the caller chose (queue computes it
// from RETRY), or none for an at-most-once job, which is never requeued.
func requeueAt(j *Job, qtime int64) int64 {
	if j.Retry == 0 {
		return 0
	}
	return qtime
}

// validateNew checks a job given to Add.
func validateNew(j *Job) error {
	switch {
	case !ValidJobID(j.ID):
		return fmt.Errorf("%w: bad id %q", ErrInvalidJob, j.ID)
	case j.State == StateAcked:
		// Only a dummy ack (Batch.AckUnknown) is added acked: no queue,
		// no body, no timers but its TTL.
		if j.Queue != "" || j.BodySize != 0 || j.AwakeTime != 0 || j.QueueTime != 0 {
			return fmt.Errorf("%w: an acked job is added only as a dummy ack", ErrInvalidJob)
		}
	case j.Queue == "":
		return fmt.Errorf("%w: empty queue name", ErrInvalidJob)
	case len(j.Queue) > MaxQueueNameLen:
		return fmt.Errorf("%w: queue name longer than %d bytes", ErrInvalidJob, MaxQueueNameLen)
	case j.State != StateQueued && j.State != StateActive && j.State != StateWaitRepl:
		return fmt.Errorf("%w: a new job is queued, active, wait-repl or a dummy ack, not %s", ErrInvalidJob, j.State)
	case j.State == StateQueued && j.AwakeTime != 0:
		return fmt.Errorf("%w: a queued job has no awake time", ErrInvalidJob)
	case j.Retry == 0 && j.QueueTime != 0:
		return fmt.Errorf("%w: an at-most-once job has no requeue time", ErrInvalidJob)
	}
	return nil
}

// MaxQueueNameLen bounds queue names so they fit the queue-order key.
const MaxQueueNameLen = 1024

// events returns the schedule events a job in this state has: its delay
// (AwakeTime), its retry (QueueTime, while active) and its ttl (Etime).
func events(j *Job) (evs [3]Event, n int) {
	if j == nil {
		return evs, 0
	}
	if j.AwakeTime != 0 {
		evs[n] = Event{Due: j.AwakeTime, Kind: EventDelay, ID: j.ID}
		n++
	}
	// Only an active job is ever requeued: a queued one is where a requeue
	// would put it (its QueueTime is kept for SHOW, but nothing is
	// scheduled), so a backlog of queued jobs costs one schedule key each,
	// its TTL.
	if j.QueueTime != 0 && j.State == StateActive {
		evs[n] = Event{Due: j.QueueTime, Kind: EventRetry, ID: j.ID}
		n++
	}
	if j.Etime != 0 {
		evs[n] = Event{Due: j.Etime, Kind: EventTTL, ID: j.ID}
		n++
	}
	return evs, n
}

// Event is one entry of the on-disk schedule.
type Event struct {
	Due  int64 // Unix milliseconds
	Kind EventKind
	ID   string
}

// PauseState is a queue's pause setting (SPEC.md PAUSE).
type PauseState uint8

const (
	PauseNone PauseState = 0
	PauseIn   PauseState = 1 // refuse ADDJOB/ENQUEUE
	PauseOut  PauseState = 2 // stop GETJOB
	PauseAll  PauseState = PauseIn | PauseOut
)

// String returns the PAUSE reply word.
func (p PauseState) String() string {
	switch p {
	case PauseNone:
		return "none"
	case PauseIn:
		return "in"
	case PauseOut:
		return "out"
	case PauseAll:
		return "all"
	}
	return "unknown"
}

// Events returns the schedule events the job has in its current state: its
// delay (AwakeTime), retry (QueueTime) and ttl (Etime) times, those set.
func (j *Job) Events() []Event {
	return j.AppendEvents(nil)
}

// AppendEvents appends the job's events (as Events) to dst: with a
// caller's array, no allocation (the broker's timers ask for every job
// it changes).
func (j *Job) AppendEvents(dst []Event) []Event {
	evs, n := events(j)
	return append(dst, evs[:n]...)
}
