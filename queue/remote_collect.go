package queue

import (
	"errors"

	"github.com/diskque/diskque/storage"
)

// The store side of the ack collection's incoming messages, batched: the
// SETACKs and DELJOBs one link read brought are applied as one store
// batch (RemoteCollect), and the collector's own deletes of collected
// jobs do not wait for their durability (DeleteCollected).

// CollectOp is one change of RemoteCollect: a SETACK's ack of ID, or, with
// Delete, a DELJOB's delete.
type CollectOp struct {
	ID     string
	Delete bool
	// Search: the SETACK is a dummy ack's search (mayhave 0), so an id
	// unknown here leaves nothing (RemoteSetAckKnown), not a dummy ack.
	Search bool
	// Pair is the SETACK's sender when it says two nodes may hold the job
	// (mayhave 2) and no collection of the job runs here. If the copy
	// here is unacked and names exactly this node and Pair as its
	// holders, it is deleted instead of acked: one record where the ack
	// and the DELJOB's delete were two (Collected.Deleted; why that is
	// safe: replication/ackgc_pair.go).
	Pair string
}

// Collected is the outcome of one SETACK op of RemoteCollect.
type Collected struct {
	// Known: the job was here and is not a dummy ack (GOTACK's "known").
	Known bool
	// Job is the job here once acked (nil: none here, a search's unknown
	// id or an at-most-once one): its Nodes and IsDummyAck tell the
	// caller who else to collect from.
	Job *storage.Job
	// Deleted: the op's Pair matched and the copy here is deleted, not
	// acked (Job is then the copy as the ack would have left it).
	Deleted bool
}

// RemoteCollect applies ops in their order as one store batch: each SETACK
// as RemoteSetAck (RemoteSetAckKnown when Search) and each DELJOB as
// RemoteDelJob would, one after the other — but that an ack whose job a
// later op deletes is not written: the delete is, and it is what durable
// waits for, so a GOTACK sent after durable returns promises the same
// (this node never queues the job again) with one record instead of two.
// res[i] is op i's outcome (zero for deletes). durable waits for the
// batch's durability: a GOTACK for the acks goes only after it returned
// nil; deletes alone need not wait (a DELJOB's delete follows an ack
// already durable, or is as good as a lost message if a crash forgets it).
func (b *Broker) RemoteCollect(ops []CollectOp) (res []Collected, durable func() error, err error) {
	res = make([]Collected, len(ops))
	durable = func() error { return nil }
	if len(ops) == 0 {
		return res, durable, nil
	}
	// nextDel[i]: the index of the first delete of op i's id after it
	// (0: none).
	nextDel := make([]int, len(ops))
	last := map[string]int{}
	for i := len(ops) - 1; i >= 0; i-- {
		nextDel[i] = last[ops[i].ID]
		if ops[i].Delete {
			last[ops[i].ID] = i
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpenLocked(); err != nil {
		return nil, durable, err
	}
	now := b.nowMillis()
	// The acks are blind (no lookup first: a copy here is usually only
	// in Pebble, and its read in the ack's resolve is the one the ack
	// needs anyway); an id found nowhere leaves its dummy ack in a second
	// batch of the same hold, after the others — the same as in its
	// place, since no later op of the run deletes it.
	batch := b.st.NewBatch()
	var at []int                     // batch op → ops index
	inBatch := make([]int, len(ops)) // ops index → batch op, -1: not written
	var seen map[string]int          // with a Pair op: id → its first op
	paired := map[int]bool{}         // ops index → deleted as a pair
	self := b.NodeID()
	for i, o := range ops {
		first := -1
		if o.Pair != "" || seen != nil {
			if seen == nil {
				seen = map[string]int{}
				for k := range i {
					if _, ok := seen[ops[k].ID]; !ok {
						seen[ops[k].ID] = k
					}
				}
			}
			if k, ok := seen[o.ID]; ok {
				first = k
			} else {
				seen[o.ID] = i
			}
		}
		switch {
		case o.Delete:
			batch.Delete(o.ID)
		case nextDel[i] > 0:
			// Deleted later in the run: the ack is not written, and
			// the job is reported from the delete's result below.
			inBatch[i] = -1
			continue
		case first >= 0 && paired[first]:
			// The same SETACK twice in the run: the first deleted the
			// copy, this one reports the same.
			inBatch[i] = -1
			continue
		case first < 0 && b.pairLocked(o, self):
			batch.Delete(o.ID)
			paired[i] = true
		default:
			batch.Ack(o.ID)
		}
		inBatch[i] = len(at)
		at = append(at, i)
	}
	results, pending := b.st.Apply(batch)
	var unknown []int // ops indexes of acks of ids not here
	for k, r := range results {
		i := at[k]
		o := ops[i]
		if r.Err != nil {
			switch {
			case errUnusable(r.Err):
				return nil, durable, wrapStore(r.Err)
			case !o.Delete && errors.Is(r.Err, storage.ErrNotFound):
				unknown = append(unknown, i)
			case !o.Delete && errors.Is(r.Err, storage.ErrWrongState):
				// Acked already (a retried SETACK, a second collector,
				// the id twice in the run, a dummy ack): as RemoteSetAck,
				// known unless a dummy, and the job for the bookkeeping.
				// Its ack may not be durable yet: the GOTACK waits
				// for it too.
				if j, err := b.st.Job(o.ID); err == nil && j.State == storage.StateAcked {
					res[i] = Collected{Known: !j.IsDummyAck(), Job: j}
					pending = pending.Join(b.st.AppliedPending())
				} else if err != nil && errUnusable(err) {
					return nil, durable, wrapStore(err)
				}
			}
			continue // a delete of an id not here
		}
		b.syncTimersLocked(r.Old.ID, r.Job)
		if r.Old.State == storage.StateQueued {
			b.unqueuedLocked(r.Old)
		}
		switch {
		case paired[i]:
			acked := *r.Old
			acked.State = storage.StateAcked
			res[i] = Collected{Known: true, Job: &acked, Deleted: true}
		case !o.Delete:
			res[i] = Collected{Known: !r.Old.IsDummyAck(), Job: r.Job}
		}
	}
	// The acks not written: their job as the delete found it, acked.
	for i := range ops {
		if inBatch[i] >= 0 {
			continue
		}
		if nextDel[i] == 0 {
			res[i] = res[seen[ops[i].ID]] // a paired SETACK's repeat
			continue
		}
		if old := results[inBatch[nextDel[i]]].Old; old != nil {
			acked := *old
			acked.State = storage.StateAcked
			res[i] = Collected{Known: !old.IsDummyAck(), Job: &acked}
		}
	}
	dummies := b.st.NewBatch()
	var dummyAt []int // dummies' op → ops index
	for _, i := range unknown {
		if id := ops[i].ID; !ops[i].Search && storage.ValidJobID(id) && !storage.IDAtMostOnce(id) {
			if err := dummies.AckUnknown(id, now+idTTLMillis(id)); err != nil {
				return nil, durable, wrapStore(err)
			}
			dummyAt = append(dummyAt, i)
		}
	}
	if len(dummyAt) < len(unknown) {
		// An ack of an id not here that leaves no dummy (a search's, an
		// at-most-once id's) writes nothing, and its GOTACK "not known"
		// may report a delete whose fsync still runs (a DELJOB's): it
		// waits for everything applied before it, as idBatch's does. (A
		// dummy written waits for that already.)
		pending = pending.Join(b.st.AppliedPending())
	}
	if dummies.Len() > 0 {
		dres, dpending := b.st.Apply(dummies)
		pending = pending.Join(dpending)
		for k, r := range dres {
			if r.Err != nil {
				if errUnusable(r.Err) {
					return nil, durable, wrapStore(r.Err)
				}
				continue // one id twice in the run: its dummy is added once
			}
			b.syncTimersLocked(r.Job.ID, r.Job)
			res[dummyAt[k]].Job = r.Job
		}
	}
	return res, func() error {
		if err := pending.Wait(); err != nil {
			return wrapStore(err)
		}
		return nil
	}, nil
}

// pairLocked reports whether SETACK op o deletes its copy here rather than
// acking it (CollectOp.Pair): an unacked job, not a dummy, whose holders
// are exactly this node and the sender. The job is usually in the cache
// here (the giver's copy of a job it just moved); a miss is the read the
// ack's resolve would have made.
func (b *Broker) pairLocked(o CollectOp, self string) bool {
	if o.Pair == "" || o.Pair == self {
		return false
	}
	j, err := b.st.Job(o.ID)
	if err != nil || j.State == storage.StateAcked || j.IsDummyAck() || len(j.Nodes) != 2 {
		return false
	}
	return j.Nodes[0] == self && j.Nodes[1] == o.Pair || j.Nodes[0] == o.Pair && j.Nodes[1] == self
}

// DeleteCollected deletes acked jobs whose collection finished here (every
// holder answered GOTACK), without waiting for the deletes' durability: the
// ack is durable already, so a crash that forgets a delete leaves the acked
// job, whose collection resumes at the restart (every holder answers "not
// known" and it is deleted again); it is never queued. It returns how many
// were deleted.
func (b *Broker) DeleteCollected(ids []string) (int, error) {
	b.mu.Lock()
	n, _, err := b.idBatchLocked(ids, func(batch *storage.Batch, id string, _ int64) error {
		batch.Delete(id)
		return nil
	}, func(old, _ *storage.Job, _ int64) {
		if old.State == storage.StateQueued {
			b.unqueuedLocked(old)
		}
	})
	b.mu.Unlock()
	return n, err
}
