package queue

import (
	"errors"
	"slices"

	"github.com/diskque/diskque/storage"
)

// The broker's side of the cluster's incoming messages. Package
// replication calls these from its links' goroutines; like every broker
// method they apply under Broker.mu, wait for durability outside it, and
// never call the cluster (so a Cluster may call them while it holds its
// own locks, as long as it never holds one the broker could wait for).

// Replica is one job copy another node sent (REPLJOB).
type Replica struct {
	// Job is the job as its origin sent it: id, queue, ctime, etime,
	// delay, retry, repl, awake time (for DELAY) and the nodes it was sent
	// to. State, counters and the requeue time are this node's to set.
	Job  *storage.Job
	Body []byte
	// First, if not 0: the origin's first REPLJOB of the job to this
	// node, stamped with this store's incarnation as the origin learned
	// it (storage.Batch.AddReplicaFirst, which may skip the lookup).
	First uint64
}

// ReplicaAdd stores copies sent by other nodes (REPLJOB): each is an
// active job, not queued (its origin queues it), with a requeue at its
// RETRY after it would be queued (so a copy takes over if its origin dies)
// and the node list it was sent with. A copy of an id known here — the
// same REPLJOB again, or a job acked (a dummy ack among them) — succeeds
// and changes nothing, but that a live copy learns the nodes of the new
// list it did not know (Disque's updateJobNodes): the origin sends a
// REPLJOB again, naming one more node, while it is short of GOTJOBs, and
// a copy that kept the shorter list would leave the added node's copy out
// of the ack collection an ACKJOB here starts. It returns, per copy, nil
// once it is durable per
// this node's fsync policy (answer GOTJOB), or why it was refused: a queue
// paused for input (ErrPaused), a malformed job, a failed store.
func (b *Broker) ReplicaAdd(reps []Replica) []error {
	out, durable := b.ReplicaApply(reps)
	if err := durable(); err != nil {
		for i := range out {
			if out[i] == nil {
				out[i] = err
			}
		}
	}
	return out
}

// ReplicaApply is ReplicaAdd without the wait for durability: the copies
// are applied (visible here, in log order) when it returns, with nil or
// why each was refused, and durable waits until they are durable per the
// fsync policy (its error fails every copy applied). A link that applies
// its REPLJOBs in order and waits for them elsewhere lets the next
// REPLJOBs share one AOF write: no GOTJOB before durable returned nil.
func (b *Broker) ReplicaApply(reps []Replica) (out []error, durable func() error) {
	out = make([]error, len(reps))
	durable = func() error { return nil }
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		for i := range out {
			out[i] = err
		}
		return out, durable
	}
	now := b.nowMillis()
	batch := b.st.NewBatch()
	var refs []int // batch op → rep
	for i, r := range reps {
		if r.Job == nil {
			out[i] = storage.ErrInvalidJob
			continue
		}
		if b.st.PauseState(r.Job.Queue)&storage.PauseIn != 0 {
			out[i] = ErrPaused
			continue
		}
		j := *r.Job
		j.State = storage.StateActive
		j.Nacks, j.AdditionalDeliveries, j.Deliveries = 0, 0, 0
		j.QueueTime = 0
		if j.Retry > 0 {
			j.QueueTime = retryTime(max(now, j.AwakeTime), j.Retry)
		}
		// A copy is queued only by its requeue: the origin runs the DELAY.
		j.AwakeTime = 0
		// A copy of a known id is a no-op of AddReplica (its result's Old
		// is the job here): its nodes are merged below. Not looked up
		// first: a new copy's miss in the index cost as much as its add.
		var err error
		if r.First != 0 {
			err = batch.AddReplicaFirst(&j, r.Body, r.First)
		} else {
			err = batch.AddReplica(&j, r.Body)
		}
		if err != nil {
			out[i] = wrapStore(err)
			continue
		}
		refs = append(refs, i)
	}
	if len(refs) == 0 {
		b.mu.Unlock()
		return out, durable
	}
	res, pending := b.st.Apply(batch)
	var merge *storage.Batch
	var mergeRefs []int
	for k, i := range refs {
		r := res[k]
		if r.Err != nil {
			out[i] = wrapStore(r.Err)
			continue
		}
		if r.Old == nil { // new here (Old set: it was known already)
			b.syncTimersLocked(r.Job.ID, r.Job)
			continue
		}
		if cur := r.Old; cur.State == storage.StateActive || cur.State == storage.StateQueued {
			if merged, grew := mergeNodes(cur.Nodes, reps[i].Job.Nodes); grew {
				if merge == nil {
					merge = b.st.NewBatch()
				}
				merge.SetNodes(cur.ID, merged)
				mergeRefs = append(mergeRefs, i)
			}
		}
	}
	if merge != nil {
		mres, mpending := b.st.Apply(merge)
		for k, i := range mergeRefs {
			if err := mres[k].Err; err != nil {
				out[i] = wrapStore(err)
			}
		}
		pending = pending.Join(mpending)
	}
	b.mu.Unlock()
	return out, func() error {
		if err := pending.Wait(); err != nil {
			return wrapStore(err)
		}
		return nil
	}
}

// maxReplicaNodes bounds the node list a copy learns from REPLJOBs (a
// peer's messages cannot grow it without end).
const maxReplicaNodes = 1024

// mergeNodes returns cur with the nodes of more it lacks appended, and
// whether there were any (and room for them).
func mergeNodes(cur, more []string) ([]string, bool) {
	out := cur
	for _, n := range more {
		if !slices.Contains(out, n) {
			if len(out) >= maxReplicaNodes {
				return cur, false
			}
			out = append(slices.Clip(out), n)
		}
	}
	return out, len(out) > len(cur)
}

// RemoteSetAck marks jobs acked because another node says so (SETACK): a
// queued one leaves its queue; an unknown at-least-once id leaves a dummy
// ack, so a late REPLJOB does not bring it back. It returns, per id,
// whether the job was known here (GOTACK's "known"), once durable.
func (b *Broker) RemoteSetAck(ids []string) ([]bool, error) { return b.remoteSetAck(ids, true) }

// RemoteSetAckKnown is RemoteSetAck for a dummy ack's search (SETACK with
// mayhave 0): the jobs known here are acked, an unknown id leaves nothing
// (Disque's answer: not known). Looked up in the same batch as the ack, so
// a DELJOB committed meanwhile cannot turn the ack into a dummy nobody
// collects.
func (b *Broker) RemoteSetAckKnown(ids []string) ([]bool, error) { return b.remoteSetAck(ids, false) }

func (b *Broker) remoteSetAck(ids []string, dummies bool) ([]bool, error) {
	known := make(map[string]bool, len(ids))
	_, err := b.idBatch(ids, func(batch *storage.Batch, id string, now int64) error {
		j, err := b.st.Job(id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			if dummies && storage.ValidJobID(id) && !storage.IDAtMostOnce(id) {
				return wrapStore(batch.AckUnknown(id, now+idTTLMillis(id)))
			}
		case err != nil:
			return wrapStore(err)
		default:
			known[id] = !j.IsDummyAck()
			if j.State != storage.StateAcked {
				batch.Ack(id)
			}
		}
		return nil
	}, func(old, _ *storage.Job, _ int64) {
		if old != nil && old.State == storage.StateQueued {
			b.unqueuedLocked(old)
		}
	})
	if err != nil {
		return nil, err
	}
	out := make([]bool, len(ids))
	for i, id := range ids {
		out[i] = known[id]
	}
	return out, nil
}

// RemoteDelJob deletes jobs because another node says so (DELJOB: the ack
// collection is over, FASTACK, or a replication that timed out). It returns
// how many were deleted.
func (b *Broker) RemoteDelJob(ids []string) (int, error) { return b.DelJob(ids) }

// RemoteFastDel deletes jobs because another node's FASTACK says so
// (FASTDEL), as RemoteDelJob, except that an unknown at-least-once id
// whose sender counts this node among its holders (held[i]: a copy was
// sent here, or is on its way) leaves a dummy ack instead, as SETACK's
// does: a REPLJOB of it still on its way must not queue a copy of a job
// the client acked. The dummies are written in the same hold of the
// broker's lock as the deletes that found nothing, so no REPLJOB is
// applied between (its copy would be left beside no dummy). A dummy ack
// the deletes find is not a copy: it stands for a REPLJOB maybe still on
// its way (left by an earlier FASTDEL whose GOTACK was lost, or by a
// SETACK), and is left again, whatever held says. It returns the ids of
// the dummy acks left (their collection is the caller's), once the batch
// is durable.
func (b *Broker) RemoteFastDel(ids []string, held []bool) (dummies []string, err error) {
	deleted := make(map[string]bool, len(ids))
	var dummy map[string]bool // dummy acks the deletes found
	b.mu.Lock()
	// The deletes blind, as DELJOB's (the store skips unknown ids); then,
	// in the same hold of mu (no REPLJOB applied between), the dummy
	// acks of the held ids that were not here.
	_, pending, err := b.idBatchLocked(ids, func(batch *storage.Batch, id string, _ int64) error {
		batch.Delete(id)
		return nil
	}, func(old, _ *storage.Job, _ int64) {
		if old.IsDummyAck() {
			// Not a copy: a dummy a SETACK or an earlier FASTDEL of
			// this deletion left (its GOTACK lost, this one is sent
			// again), which stands for a REPLJOB maybe still on its
			// way. It is left again below, and its collection kept.
			if dummy == nil {
				dummy = map[string]bool{}
			}
			dummy[old.ID] = true
			return
		}
		deleted[old.ID] = true
		if old.State == storage.StateQueued {
			b.unqueuedLocked(old)
		}
	})
	var miss []string
	for i, id := range ids {
		if err == nil && (held[i] || dummy[id]) && !deleted[id] && storage.ValidJobID(id) && !storage.IDAtMostOnce(id) {
			miss = append(miss, id)
		}
	}
	if len(miss) > 0 {
		var more storage.Pending
		_, more, err = b.idBatchLocked(miss, func(batch *storage.Batch, id string, now int64) error {
			return wrapStore(batch.AckUnknown(id, now+idTTLMillis(id)))
		}, func(old, nj *storage.Job, _ int64) {
			if old == nil {
				dummies = append(dummies, nj.ID)
			}
		})
		pending = pending.Join(more)
	}
	b.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if err := pending.Wait(); err != nil {
		return nil, wrapStore(err)
	}
	return dummies, nil
}
