package storage

import (
	"fmt"

	"github.com/diskque/diskque/wal"
)

// The lifecycle operations. Each writes one AOF record and one index batch,
// atomically, and returns once the record is written per the fsync policy
// (fsynced under wal.SyncAlways). Times are Unix milliseconds chosen by the
// caller, so that the log replays to exactly the same state. A job operation
// on an unknown id returns ErrNotFound; one that does not apply to the job's
// state returns ErrWrongState; in both cases nothing is written.

// Add stores a new job with its body. j.State must be StateQueued (queued at
// once), StateActive with AwakeTime set (delayed) or StateWaitRepl. The body
// goes to the AOF (compressed past CompressThreshold); the index keeps its
// location. j's BodyLSN and sizes are filled in.
func (s *Store) Add(j *Job, body []byte) error {
	if err := validateNew(j); err != nil {
		return err
	}
	if len(body) > wal.MaxPayload-64-len(j.Queue)-64*len(j.Nodes) {
		return fmt.Errorf("%w: body of %d bytes is too large", ErrInvalidJob, len(body))
	}
	stored, compressed := compressBody(body, s.opts.CompressThreshold)
	jc := *j
	jc.Nacks, jc.AdditionalDeliveries, jc.Deliveries = 0, 0, 0
	jc.BodySize = uint32(len(body))
	nj, err := s.commitOp(&op{typ: recAdd, id: j.ID, job: &jc, body: stored, compressed: compressed})
	if err != nil {
		return err
	}
	*j = *nj
	return nil
}

// Queue puts an active (delayed, delivered, replicated) or wait-repl job in
// its queue, with its next requeue at qtime (ignored for RETRY 0 jobs): the
// DELAY ran out, ENQUEUE, or replication completed.
func (s *Store) Queue(id string, qtime int64) (*Job, error) {
	return s.jobOp(&op{typ: recQueue, id: id, qtime: qtime})
}

// Deliver takes a queued job out of its queue for a consumer (GETJOB) and
// sets its next requeue to qtime. For an at-most-once job (Retry 0) Deliver
// returns only once the delivery is fsynced, whatever the policy, so a crash
// can never deliver it twice.
func (s *Store) Deliver(id string, qtime int64) (*Job, error) {
	return s.jobOp(&op{typ: recDeliver, id: id, qtime: qtime})
}

// Requeue queues an active job again because its retry time came: its
// additional-deliveries counter grows if it had been delivered.
func (s *Store) Requeue(id string, qtime int64) (*Job, error) {
	return s.jobOp(&op{typ: recRequeue, id: id, qtime: qtime})
}

// Nack returns a delivered (active) job: nacks + 1, then queued again with
// its next requeue at qtime, or, if awake is not 0, kept waiting until awake
// like a delayed job (NACK … DELAY).
func (s *Store) Nack(id string, qtime, awake int64) (*Job, error) {
	return s.jobOp(&op{typ: recNack, id: id, qtime: qtime, awake: awake})
}

// Working postpones a job's next requeue to qtime (WORKING).
func (s *Store) Working(id string, qtime int64) (*Job, error) {
	return s.jobOp(&op{typ: recWorking, id: id, qtime: qtime})
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
	if queue == "" || len(queue) > MaxQueueNameLen || p > PauseAll {
		return fmt.Errorf("%w: bad pause request", ErrInvalidJob)
	}
	_, err := s.commitOp(&op{typ: recPause, queue: queue, pause: p})
	return err
}

func (s *Store) jobOp(o *op) (*Job, error) {
	if len(o.id) != JobIDLen {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, o.id)
	}
	return s.commitOp(o)
}
