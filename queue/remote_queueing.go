package queue

import (
	"errors"
	"slices"

	"github.com/diskque/diskque/storage"
)

// About one queued copy (CLUSTER.md "One queued copy"): every holder of a
// job has its own requeue timer; WillQueueAdvance before it fires, the
// holder sends WILLQUEUE to the others, and when it queues the job it sends
// QUEUED. This file is the broker's side: the wheel's WILLQUEUE events, the
// notices collected under Broker.mu and sent after it, and the incoming
// WILLQUEUE, QUEUED, WORKING and PAUSE.

// eventWillQueue is a wheel-only event kind (never stored): WillQueueAdvance
// before a retry event, while the broker is in a cluster. It fires a
// WILLQUEUE if the job is still active, due at that retry and held by other
// nodes too.
const eventWillQueue storage.EventKind = 'w'

// willQueueCompanion is the WILLQUEUE event of a retry event e.
func willQueueCompanion(e storage.Event) storage.Event {
	return storage.Event{Due: e.Due - WillQueueAdvance.Milliseconds(), Kind: eventWillQueue, ID: e.ID}
}

// addEventLocked puts e in the wheel, and its WILLQUEUE companion with it
// when e is a retry event of a clustered broker — unless the wheel held e
// already (added live before a full wheel moved the cursor back before it:
// syncTimersLocked), whose companion is there or has fired.
func (b *Broker) addEventLocked(e storage.Event) {
	held := b.wheel.Holds(e.ID, e.Kind)
	b.wheel.Add(e)
	if e.Kind == storage.EventRetry && b.inCluster && !held {
		b.wheel.Add(willQueueCompanion(e))
	}
}

// holdersElsewhere reports whether nodes other than this one may hold a
// copy of j.
func (b *Broker) holdersElsewhere(j *storage.Job) bool {
	return len(j.Nodes) > 0 && !onlyNode(j.Nodes, b.NodeID())
}

// notices are the messages to other nodes that changes made under
// Broker.mu call for, sent once it is released (and the changes durable).
type notices struct {
	willQueue []*storage.Job
	queued    []QueuedJob
}

func (n *notices) send(c Cluster) {
	if len(n.willQueue) > 0 {
		c.WillQueue(n.willQueue)
	}
	if len(n.queued) > 0 {
		c.Queued(n.queued)
	}
}

// TieBreak is Disque's order of two nodes for one job (compareNodeIDsByJob):
// each 40-char node id is XORed byte by byte with the job id's 24 random
// characters (from offset 11, cycling) and the results compared as bytes.
// Of two nodes that both queued a job, the one that compares greater keeps
// it. Ids of another length compare as plain strings.
func TieBreak(a, c, jobID string) int {
	const n, off, rnd = 40, 11, 24
	if len(a) != n || len(c) != n || len(jobID) < off+rnd {
		switch {
		case a < c:
			return -1
		case a > c:
			return 1
		}
		return 0
	}
	for i := range n {
		k := jobID[off+i%rnd]
		x, y := a[i]^k, c[i]^k
		if x != y {
			if x < y {
				return -1
			}
			return 1
		}
	}
	return 0
}

// RemoteWillQueue handles another node's WILLQUEUE: that node holds these
// jobs and queues them in WillQueueAdvance. A job known here gets the
// sender in its nodes (it may hold a copy: a later ack must reach it); it
// returns the jobs queued here (the caller answers QUEUED to their holders,
// so the sender does not queue them too) and the ids acked here (the
// caller answers SETACK, so the sender acks its copy).
func (b *Broker) RemoteWillQueue(from string, ids []string) (queued []*storage.Job, acked []string, err error) {
	self := b.NodeID()
	_, err = b.idBatch(ids, func(batch *storage.Batch, id string, _ int64) error {
		j, err := b.st.Job(id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			return nil
		case err != nil:
			return wrapStore(err)
		case j.State == storage.StateWaitRepl:
			return nil // its ADDJOB is still being answered here
		}
		if from != "" && from != self && !j.IsDummyAck() && !slices.Contains(j.Nodes, from) {
			nodes := append(slices.Clip(j.Nodes), from)
			batch.SetNodes(id, nodes)
			nj := *j
			nj.Nodes = nodes
			j = &nj
		}
		switch j.State {
		case storage.StateQueued:
			queued = append(queued, j)
		case storage.StateAcked:
			acked = append(acked, id)
		}
		return nil
	}, nil)
	if err != nil {
		return nil, nil, err
	}
	return queued, acked, nil
}

// RemoteQueuedJob is one job of another node's QUEUED.
type RemoteQueuedJob struct {
	ID   string
	Bump Bump
}

// RemoteQueued handles another node's QUEUED: the sender queued these jobs.
// Each copy here postpones its requeue by its RETRY (± 500 ms) and bumps
// the counter the sender bumped; one queued here too stays queued only if
// this node wins the tie-break (TieBreak) against the sender. It returns
// the ids acked here: the caller answers SETACK, so the sender acks its
// copy.
func (b *Broker) RemoteQueued(from string, jobs []RemoteQueuedJob) (acked []string, err error) {
	ids := make([]string, len(jobs))
	bumps := make(map[string]Bump, len(jobs))
	for i, q := range jobs {
		ids[i] = q.ID
		bumps[q.ID] = max(bumps[q.ID], q.Bump)
	}
	return b.remotePostpone(from, ids, func(id string) (Bump, bool) {
		return bumps[id], TieBreak(from, b.NodeID(), id) > 0
	})
}

// RemoteWorking handles another node's WORKING: a consumer is working on
// these jobs there. Each copy here postpones its requeue by its RETRY and
// leaves its queue if it is queued. It returns the ids acked here (answer
// SETACK).
func (b *Broker) RemoteWorking(from string, ids []string) (acked []string, err error) {
	return b.remotePostpone(from, ids, func(string) (Bump, bool) { return BumpNone, true })
}

// remotePostpone applies a QUEUED or WORKING: decide says, per id, the
// counter to bump and whether a queued copy leaves its queue.
func (b *Broker) remotePostpone(from string, ids []string, decide func(id string) (Bump, bool)) ([]string, error) {
	var acked []string
	_, err := b.idBatch(ids, func(batch *storage.Batch, id string, now int64) error {
		j, err := b.st.Job(id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			return nil
		case err != nil:
			return wrapStore(err)
		}
		switch j.State {
		case storage.StateAcked:
			acked = append(acked, id)
			return nil
		case storage.StateQueued, storage.StateActive:
		default:
			return nil
		}
		bump, dequeue := decide(id)
		if j.State == storage.StateQueued && dequeue {
			batch.Dequeue(id)
		}
		if j.Retry > 0 { // an at-most-once copy is never requeued
			var nacks, deliveries uint32
			switch bump {
			case BumpNacks:
				nacks = 1
			case BumpDeliveries:
				deliveries = 1
			}
			batch.Postpone(id, retryTime(now, j.Retry), nacks, deliveries)
		}
		return nil
	}, func(old, nj *storage.Job, _ int64) {
		if old != nil && nj != nil && old.State == storage.StateQueued && nj.State != storage.StateQueued {
			b.unqueuedLocked(old)
		}
	})
	if err != nil {
		return nil, err
	}
	return acked, nil
}

// RemotePause applies a queue's pause state another node broadcast (PAUSE
// … BCAST there); it is not sent on.
func (b *Broker) RemotePause(queue string, p storage.PauseState) error {
	if p > storage.PauseAll {
		return storage.ErrInvalidJob
	}
	if b.st.PauseState(queue) == p {
		return nil
	}
	_, err := b.Pause(queue, p)
	return err
}

// BroadcastPause sends a queue's pause state to every other node (PAUSE …
// BCAST). The caller holds no broker lock.
func (b *Broker) BroadcastPause(queue string, p storage.PauseState) {
	b.cluster.Paused(queue, p)
}

// willQueueLocked fires a WILLQUEUE event: the job goes to notes if it is
// still active, due to be requeued at the retry the event announces, and
// held by other nodes too. A job read fails silently: the requeue itself
// (its retry event) reads it again and reports.
func (b *Broker) willQueueLocked(e storage.Event, notes *notices) {
	j, err := b.st.Job(e.ID)
	if err != nil {
		return
	}
	if j.State == storage.StateActive && j.Retry > 0 && j.AwakeTime == 0 &&
		j.QueueTime == e.Due+WillQueueAdvance.Milliseconds() && b.holdersElsewhere(j) {
		notes.willQueue = append(notes.willQueue, j)
	}
}
