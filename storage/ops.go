package storage

import (
	"errors"
	"fmt"
	"slices"

	"github.com/diskque/diskque/wal"
)

// The lifecycle operations. Each writes one AOF record and its index writes
// (to the write buffer, which reaches Pebble atomically), and returns once
// the record is written per the fsync policy (fsynced under
// wal.SyncAlways). Times are Unix milliseconds chosen by the caller, so that
// the log replays to exactly the same state. A job operation on an unknown
// id returns ErrNotFound; one that does not apply to the job's state returns
// ErrWrongState; in both cases nothing is written. Batch offers the same
// operations to commit several under one lock.

// Add stores a new job with its body. j.State must be StateQueued (queued at
// once), StateActive with AwakeTime set (delayed) or StateWaitRepl. The body
// goes to the AOF (compressed past CompressThreshold); the index keeps its
// location. On success *j is updated to the stored job (BodyLSN and sizes
// filled in, counters zero).
func (s *Store) Add(j *Job, body []byte) error {
	o, err := s.addOp(j, body, false)
	if err != nil {
		return err
	}
	nj, err := s.commitOne(o)
	if err != nil {
		return err
	}
	*j = *nj
	return nil
}

// addOp makes the ADD record of j. The op keeps a copy of j, or j itself
// when the caller hands it over (own).
func (s *Store) addOp(j *Job, body []byte, own bool) (*op, error) {
	if err := validateNew(j); err != nil {
		return nil, err
	}
	if j.State == StateAcked && len(body) > 0 {
		return nil, fmt.Errorf("%w: a dummy ack has no body", ErrInvalidJob)
	}
	if len(body) > wal.MaxPayload-64-len(j.Queue)-64*len(j.Nodes) {
		return nil, fmt.Errorf("%w: body of %d bytes is too large", ErrInvalidJob, len(body))
	}
	stored, compressed := compressBody(body, s.opts.CompressThreshold)
	jc := j
	if !own {
		jc = new(Job)
		*jc = *j
	}
	jc.Nacks, jc.AdditionalDeliveries, jc.Deliveries = 0, 0, 0
	jc.BodySize = uint32(len(body))
	jc.BodyLSN, jc.StoredSize = 0, 0
	return &op{typ: recAdd, id: j.ID, job: jc, body: stored, compressed: compressed}, nil
}

// FlushAll deletes every job and every pause state (DEBUG FLUSHALL) with
// one AOF record and one Pebble batch of range deletions, whatever the number
// of jobs. Like Apply it returns once the change is applied; Pending.Wait
// waits for its durability. The next checkpoint removes every AOF segment
// written before it.
func (s *Store) FlushAll() Pending {
	res := make([]Result, 1)
	p := s.apply([]*op{{typ: recFlush}}, res)
	if p.err == nil && res[0].Err != nil {
		p.err = res[0].Err
	}
	return p
}

// Queue puts an active (delayed, delivered, replicated) or wait-repl job in
// its queue, with its next requeue at qtime (ignored for RETRY 0 jobs): the
// DELAY ran out, ENQUEUE, or replication completed.
func (s *Store) Queue(id string, qtime int64) (*Job, error) {
	return s.jobOp(queueOp(id, qtime))
}

// Deliver takes a queued job out of its queue for a consumer (GETJOB) and
// sets its next requeue to qtime. For an at-most-once job (Retry 0) Deliver
// returns only once the delivery is fsynced, whatever the policy, so a crash
// can never deliver it twice.
func (s *Store) Deliver(id string, qtime int64) (*Job, error) {
	return s.jobOp(deliverOp(id, qtime))
}

// Requeue queues an active job again because its retry time came: its
// additional-deliveries counter grows if it had been delivered.
func (s *Store) Requeue(id string, qtime int64) (*Job, error) {
	return s.jobOp(requeueOp(id, qtime))
}

// Nack returns a delivered (active) job: nacks + 1, then queued again with
// its next requeue at qtime, or, if awake is not 0, kept waiting until awake
// like a delayed job (NACK … DELAY).
func (s *Store) Nack(id string, qtime, awake int64) (*Job, error) {
	return s.jobOp(nackOp(id, qtime, awake))
}

// Working postpones a job's next requeue to qtime (WORKING).
func (s *Store) Working(id string, qtime int64) (*Job, error) {
	return s.jobOp(workingOp(id, qtime))
}

// Dequeue takes a queued job out of its queue without delivering it.
func (s *Store) Dequeue(id string) (*Job, error) {
	return s.jobOp(&op{typ: recDequeue, id: id})
}

// Ack marks a job acknowledged: out of its queue, no more requeues, kept (with
// its TTL) until Delete, so a cluster can collect its copies.
func (s *Store) Ack(id string) (*Job, error) {
	return s.jobOp(&op{typ: recAck, id: id})
}

// Delete removes a job in whatever state; its body becomes garbage in the
// AOF.
func (s *Store) Delete(id string) error {
	_, err := s.jobOp(&op{typ: recDel, id: id})
	return err
}

// Pause sets a queue's pause state; it survives restarts.
func (s *Store) Pause(queue string, p PauseState) error {
	o, err := pauseOp(queue, p)
	if err != nil {
		return err
	}
	_, err = s.commitOne(o)
	return err
}

func queueOp(id string, qtime int64) *op   { return &op{typ: recQueue, id: id, qtime: qtime} }
func deliverOp(id string, qtime int64) *op { return &op{typ: recDeliver, id: id, qtime: qtime} }
func requeueOp(id string, qtime int64) *op { return &op{typ: recRequeue, id: id, qtime: qtime} }
func workingOp(id string, qtime int64) *op { return &op{typ: recWorking, id: id, qtime: qtime} }
func nackOp(id string, qtime, awake int64) *op {
	return &op{typ: recNack, id: id, qtime: qtime, awake: awake}
}

func pauseOp(queue string, p PauseState) (*op, error) {
	if queue == "" || len(queue) > MaxQueueNameLen || p > PauseAll {
		return nil, fmt.Errorf("%w: bad pause request for queue %q", ErrInvalidJob, queue)
	}
	return &op{typ: recPause, queue: queue, pause: p}, nil
}

func (s *Store) jobOp(o *op) (*Job, error) {
	if len(o.id) != JobIDLen {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, o.id)
	}
	return s.commitOne(o)
}

// NewBatch returns an empty batch for s.
func (s *Store) NewBatch() *Batch { return &Batch{s: s} }

// Add adds a job to the batch; an invalid job is refused at once.
func (b *Batch) Add(j *Job, body []byte) error {
	o, err := b.s.addOp(j, body, false)
	if err != nil {
		return err
	}
	b.ops = append(b.ops, o)
	return nil
}

// AddNew is Add for a new job of this node: the store makes its id
// (NewJobID, from ttlSeconds and the job's Retry) and sets j.ID, which must
// be empty. 144 random bits cannot collide, so the store skips the index
// lookup that refuses a duplicate id and writes the job's keys as new to
// the index (no tombstone when they go): because no caller can hand it an
// id from elsewhere (a client, another node), a duplicate that would bring
// an old job back cannot happen. The batch takes j over (no copy): the
// caller must not change it afterwards, and the job of the add's Result is
// j itself.
func (b *Batch) AddNew(j *Job, body []byte, ttlSeconds int64) error {
	if j.ID != "" {
		return fmt.Errorf("%w: AddNew makes the job id itself, got %q", ErrInvalidJob, j.ID)
	}
	if b.node == "" {
		b.node = b.s.NodeID()
	}
	j.ID = NewJobID(b.node, ttlSeconds, int64(j.Retry))
	o, err := b.s.addOp(j, body, true)
	if err != nil {
		j.ID = ""
		return err
	}
	o.fresh = true
	b.ops = append(b.ops, o)
	return nil
}

// AddReplica adds a copy of a job that another node created and sent here
// (REPLJOB): j.State is StateActive (not queued: the origin queues it),
// with the node list it was sent. It is idempotent: if the id is already
// known here — the same REPLJOB received again, or a job acked (a dummy
// ack among them) — nothing is written and the add still succeeds, its
// Result's Old (and Job) the job as it is, so the sender is answered
// again and an acked job is not resurrected. Either way the batch's
// Pending waits for what was applied before it too, so the copy that was
// already there is as durable as a new one when Wait returns.
func (b *Batch) AddReplica(j *Job, body []byte) error {
	o, err := b.s.addOp(j, body, false)
	if err != nil {
		return err
	}
	o.replica = true
	b.ops = append(b.ops, o)
	return nil
}

// AckUnknown adds a dummy ack of a job this node does not know (a
// cluster's ACKJOB or SETACK of an id never seen here): an acked
// placeholder with no queue and no body, deleted at etime like any job, so
// that a REPLJOB arriving late (AddReplica) cannot bring the job back. If
// the id is known the add is a no-op that succeeds, as for AddReplica:
// the caller acks a known job with Ack.
func (b *Batch) AckUnknown(id string, etime int64) error {
	o, err := b.s.addOp(&Job{ID: id, State: StateAcked, Etime: etime}, nil, true)
	if err != nil {
		return err
	}
	o.replica = true
	b.ops = append(b.ops, o)
	return nil
}

// SetNodes replaces the list of nodes that may hold a copy of the job
// (nodes-delivered), in whatever state it is: the origin of a replicated
// job records the nodes it sent it to before it queues it. A wait-repl job
// becomes active: its replication is achieved.
func (b *Batch) SetNodes(id string, nodes []string) {
	b.job(&op{typ: recNodes, id: id, nodes: slices.Clone(nodes)})
}

// IsDummyAck reports whether the job is a dummy ack (Batch.AckUnknown):
// acked, with no queue and no body.
func (j *Job) IsDummyAck() bool { return j.State == StateAcked && j.Queue == "" }

// Queue adds a Store.Queue to the batch.
func (b *Batch) Queue(id string, qtime int64) { b.jobOp(recQueue, id).qtime = qtime }

// Deliver adds a Store.Deliver to the batch.
func (b *Batch) Deliver(id string, qtime int64) { b.jobOp(recDeliver, id).qtime = qtime }

// DeliverAt adds a Store.Deliver of the job at position p of queue, whose
// requeue time qtime computes from the job as it is when the batch applies
// (from its RETRY). The position (the broker's heads know it) lets the batch
// read the jobs of consecutive positions together, in queue order, rather
// than one lookup each.
func (b *Batch) DeliverAt(queue string, p QueuePos, qtime func(*Job) int64) {
	o := b.jobOp(recDeliver, p.ID)
	o.qtimeFn, o.hintQueue, o.hintCtime = qtime, queue, p.Ctime
}

// DeliverMoved is DeliverAt for a job that moves to another node
// (federation's NEEDJOBS): nodes computes from the job, as it is when the
// batch applies, the node list to set with the delivery (nil: the list
// stays). The one DELIVER record then carries the list, instead of a
// DELIVER and a NODES record each applied and written on its own.
// Replayed, it sets both; a build older than this record layout refuses
// an AOF holding one (a malformed record: trailing bytes), never applies
// it in part.
func (b *Batch) DeliverMoved(queue string, p QueuePos, qtime func(*Job) int64, nodes func(*Job) []string) {
	o := b.jobOp(recDeliver, p.ID)
	o.qtimeFn, o.nodesFn, o.hintQueue, o.hintCtime = qtime, nodes, queue, p.Ctime
}

// DeliverQueued is DeliverMoved (DeliverAt for a nil nodes) of j, a job
// QueuedJobs returned with mark m: if the store has applied nothing since,
// the batch takes j as the job's current state instead of looking it up
// again (a probe of the job cache per job); otherwise it reads the job as
// DeliverAt does.
func (b *Batch) DeliverQueued(j *Job, m WriteMark, qtime func(*Job) int64, nodes func(*Job) []string) {
	o := b.jobOp(recDeliver, j.ID)
	o.qtimeFn, o.nodesFn, o.hintQueue, o.hintCtime = qtime, nodes, j.Queue, j.Ctime
	o.seen, o.seenAt = j, m
}

// Requeue adds a Store.Requeue to the batch.
func (b *Batch) Requeue(id string, qtime int64) { b.jobOp(recRequeue, id).qtime = qtime }

// Nack adds a Store.Nack to the batch.
func (b *Batch) Nack(id string, qtime, awake int64) {
	o := b.jobOp(recNack, id)
	o.qtime, o.awake = qtime, awake
}

// Working adds a Store.Working to the batch.
func (b *Batch) Working(id string, qtime int64) { b.jobOp(recWorking, id).qtime = qtime }

// Postpone is Working for another node's QUEUED or WORKING: the next
// requeue moves to qtime, and nacks and additional deliveries grow by what
// that node added to its own copy's (so SHOW and GETJOB WITHCOUNTERS agree
// across nodes). Like Working it refuses an at-most-once or acked job.
func (b *Batch) Postpone(id string, qtime int64, addNacks, addDeliveries uint32) {
	o := workingOp(id, qtime)
	o.addNacks, o.addDeliveries = addNacks, addDeliveries
	b.job(o)
}

// Dequeue adds a Store.Dequeue to the batch.
func (b *Batch) Dequeue(id string) { b.jobOp(recDequeue, id) }

// Ack adds a Store.Ack to the batch.
func (b *Batch) Ack(id string) { b.jobOp(recAck, id) }

// Delete adds a Store.Delete to the batch.
func (b *Batch) Delete(id string) { b.jobOp(recDel, id) }

// Pause adds a Store.Pause to the batch; a bad request is refused at once.
func (b *Batch) Pause(queue string, p PauseState) error {
	o, err := pauseOp(queue, p)
	if err != nil {
		return err
	}
	b.ops = append(b.ops, o)
	return nil
}

// job adds a job operation; a malformed id fails with ErrNotFound at Commit.
func (b *Batch) job(o *op) { b.ops = append(b.ops, o) }

// jobOp adds a job operation of type typ on id and returns it for the
// caller to fill in. It comes from the batch's slab: an op is about 300
// bytes, and a GETJOB COUNT 100's deliveries and their ACKJOB were a
// hundred allocations each, one per op. Pointers into a slab stay valid
// when the next one is made; Reset drops it (an applied op may still be
// referenced).
func (b *Batch) jobOp(typ wal.RecordType, id string) *op {
	if len(b.slab) == cap(b.slab) {
		b.slab = make([]op, 0, min(max(2*cap(b.slab), 8), maxOpSlab))
	}
	b.slab = append(b.slab, op{typ: typ, id: id})
	o := &b.slab[len(b.slab)-1]
	b.ops = append(b.ops, o)
	return o
}

// maxOpSlab bounds one slab of Batch.jobOp: a batch of thousands of ops
// takes several, not one ever larger.
const maxOpSlab = 128

// Grow makes room for about n more job operations (Deliver, Ack, Delete…)
// in one allocation, for a caller that knows how many it will add: the
// slabs' doubling otherwise allocates about two and a half ops for each.
func (b *Batch) Grow(n int) {
	if n > cap(b.slab)-len(b.slab) {
		b.slab = make([]op, 0, min(n, maxOpSlab))
	}
	b.ops = slices.Grow(b.ops, n)
}

// ErrNotEmpty: SetNodeID on a store that still holds jobs.
var ErrNotEmpty = errors.New("storage: the store holds jobs")

// SetNodeID gives the store a new node id (CLUSTER RESET HARD), persisted
// like the first one (a NODE record, fsynced whatever the policy, and the
// index's m/ key; a checkpoint's META carries it forward). Job ids made
// afterwards carry its prefix. The store must hold no job (flush it first):
// index values that say "this store's node" would otherwise name the new
// id. id is 40 lower-case hex digits.
func (s *Store) SetNodeID(id string) error {
	if !ValidNodeID(id) {
		return fmt.Errorf("%w: bad node id %q", ErrInvalidJob, id)
	}
	if setNodeIDHook != nil {
		setNodeIDHook()
	}
	// The emptiness is checked where the record applies, under the
	// store's lock: checked before, an add could commit between the
	// check and the record (two callers could both pass it).
	if _, err := s.commitOne(&op{typ: recNode, node: id, ifEmpty: true}); err != nil {
		return err
	}
	return s.log.Sync()
}

// setNodeIDHook, when set (tests), runs as SetNodeID starts, before its
// record applies.
var setNodeIDHook func()

// ValidNodeID reports whether id is a node id: 40 lower-case hex digits.
func ValidNodeID(id string) bool {
	if len(id) != 40 {
		return false
	}
	for i := 0; i < len(id); i++ {
		if c := id[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
