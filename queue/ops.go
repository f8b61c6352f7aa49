package queue

import (
	"errors"

	"github.com/diskque/diskque/storage"
)

// The commands that take job ids. Each applies one store batch for all its
// ids, updates heads and timers under the broker's lock, and returns once
// the batch is durable per the fsync policy. Unknown ids and jobs in a state
// the command does not apply to are skipped, not errors: the count says how
// many jobs the command changed (SPEC.md).

// Ack acknowledges jobs (ACKJOB). On a lone node no other copy needs
// confirming, so an acked job is deleted at once. It returns how many known
// jobs were newly acked.
//
// In a cluster (Clustered) a job that other nodes may hold is marked acked
// and handed to Cluster.Acked, which collects its copies and then deletes
// it here; a job only this node holds is deleted at once; an unknown
// at-least-once id leaves a dummy ack (counted 0), handed to Cluster.Acked
// too, so a copy elsewhere is acked and a late REPLJOB here does not bring
// the job back.
func (b *Broker) Ack(ids []string) (int, error) {
	if !b.Clustered() {
		return b.deleteJobs(ids, func(s *Stats, n int64) { s.JobsAcked += n })
	}
	self := b.NodeID()
	var acked []*storage.Job
	count := 0
	_, err := b.idBatch(ids, func(batch *storage.Batch, id string, now int64) error {
		j, err := b.st.Job(id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			if storage.ValidJobID(id) && !storage.IDAtMostOnce(id) {
				return wrapStore(batch.AckUnknown(id, now+idTTLMillis(id)))
			}
			return nil
		case err != nil:
			return wrapStore(err)
		case j.State == storage.StateAcked:
			return nil // acked already: its collection runs
		case onlyNode(j.Nodes, self):
			batch.Delete(id)
		default:
			batch.Ack(id)
		}
		return nil
	}, func(old, nj *storage.Job, now int64) {
		if old != nil && old.State == storage.StateQueued {
			b.unqueuedLocked(old)
		}
		if old != nil {
			count++
			b.stats.JobsAcked++
		}
		if nj != nil && (old == nil || old.State != storage.StateAcked) {
			acked = append(acked, nj)
		}
	})
	if err != nil {
		return 0, err
	}
	if len(acked) > 0 {
		b.cluster.Acked(acked)
	}
	return count, nil
}

// FastAck is ACKJOB without the cluster confirmation round (FASTACK). On a
// lone node the two are the same. In a cluster a job only this node holds
// is deleted at once; one other nodes may hold is acked here, a bodiless
// placeholder (so a late REPLJOB does not bring it back), and handed to
// Cluster.FastAcked, which deletes the copies (DELJOB, retried until each
// holder answered) and then this placeholder; an unknown at-least-once id
// leaves a dummy ack, handed over too (its deletion goes to every node). A
// job acked already counts, and keeps its collection. It returns how many
// known jobs it acked or deleted.
func (b *Broker) FastAck(ids []string) (int, error) {
	if !b.Clustered() {
		return b.Ack(ids)
	}
	acked, unknown, count, err := b.fastAck(ids)
	if err != nil {
		return 0, err
	}
	if len(acked) > 0 || len(unknown) > 0 {
		b.cluster.FastAcked(acked, unknown)
	}
	return count, nil
}

// FastAckFor is FASTACK's change here without the call to the cluster: a
// holder that another node's FASTACK deletion reached, and that knows
// more holders than that deletion does, takes the rest of it over
// (package replication starts its own for what this returns). The acks
// are durable when it returns.
func (b *Broker) FastAckFor(ids []string) (acked []*storage.Job, unknown []string, err error) {
	acked, unknown, _, err = b.fastAck(ids)
	return acked, unknown, err
}

// fastAck applies FastAck here: it returns the jobs acked (placeholders,
// or acked before), the unknown ids and how many known jobs it acked or
// deleted.
func (b *Broker) fastAck(ids []string) (acked []*storage.Job, unknown []string, count int, err error) {
	self := b.NodeID()
	_, err = b.idBatch(ids, func(batch *storage.Batch, id string, now int64) error {
		j, err := b.st.Job(id)
		switch {
		case errors.Is(err, storage.ErrNotFound):
			if !storage.ValidJobID(id) {
				return nil
			}
			unknown = append(unknown, id)
			if !storage.IDAtMostOnce(id) {
				return wrapStore(batch.AckUnknown(id, now+idTTLMillis(id)))
			}
		case err != nil:
			return wrapStore(err)
		case j.State == storage.StateAcked:
			count++ // its collection runs (FastAcked keeps it)
			acked = append(acked, j)
		case onlyNode(j.Nodes, self):
			batch.Delete(id)
		default:
			batch.Ack(id)
		}
		return nil
	}, func(old, nj *storage.Job, _ int64) {
		if old == nil {
			return // a dummy ack, in unknown already
		}
		if old.State == storage.StateQueued {
			b.unqueuedLocked(old)
		}
		count++
		b.stats.JobsAcked++
		if nj != nil {
			acked = append(acked, nj)
		}
	})
	if err != nil {
		return nil, nil, 0, err
	}
	return acked, unknown, count, nil
}

// onlyNode reports whether nodes name no node but self.
func onlyNode(nodes []string, self string) bool {
	for _, n := range nodes {
		if n != self {
			return false
		}
	}
	return true
}

// idTTLMillis is the TTL a job id carries: a dummy ack lives that long.
func idTTLMillis(id string) int64 { return max(storage.IDTTLMinutes(id), 1) * 60_000 }

// DelJob deletes jobs locally (DELJOB) and returns how many were deleted.
func (b *Broker) DelJob(ids []string) (int, error) {
	return b.deleteJobs(ids, nil)
}

func (b *Broker) deleteJobs(ids []string, count func(*Stats, int64)) (int, error) {
	return b.blindBatch(ids, (*storage.Batch).Delete, func(old, nj *storage.Job, now int64) {
		if old.State == storage.StateQueued {
			b.unqueuedLocked(old)
		}
		if count != nil {
			count(&b.stats, 1)
		}
	})
}

// Nack puts delivered (active) jobs back in their queues with nacks + 1
// (NACK). With delaySec > 0 they wait that long first (NACK … DELAY, beyond
// Disque). It returns how many jobs were nacked. The other holders of a
// nacked job get QUEUED with its nacks to bump (Cluster.Queued).
func (b *Broker) Nack(ids []string, delaySec int64) (int, error) {
	var queued []QueuedJob
	n, err := b.jobBatch(ids, func(batch *storage.Batch, j *storage.Job, now int64) {
		if j.State != storage.StateActive || j.Delayed() {
			return
		}
		awake := int64(0)
		if delaySec > 0 {
			awake = now + secondsToMillis(delaySec)
		}
		batch.Nack(j.ID, retryTime(now, j.Retry), awake)
	}, func(old, nj *storage.Job, now int64) {
		if nj.State == storage.StateQueued {
			b.queuedLocked(nj, now)
		}
		if b.holdersElsewhere(nj) {
			queued = append(queued, QueuedJob{Job: nj, Bump: BumpNacks})
		}
	})
	if err == nil && len(queued) > 0 {
		b.cluster.Queued(queued)
	}
	return n, err
}

// Enqueue queues active jobs now (ENQUEUE): delivered ones again, delayed
// ones before their time. Queues paused for input refuse them. It returns
// how many jobs were queued.
//
// A job other nodes hold gets, unless this is its first queueing (a
// delayed job's, here), additional-deliveries + 1 here and on its other
// holders, which get QUEUED (Cluster.Queued), as in Disque.
func (b *Broker) Enqueue(ids []string) (int, error) {
	var queued []QueuedJob
	count := 0
	_, err := b.jobBatch(ids, func(batch *storage.Batch, j *storage.Job, now int64) {
		if j.State == storage.StateQueued || j.State == storage.StateAcked || j.State == storage.StateWaitRepl {
			return
		}
		if b.st.PauseState(j.Queue)&storage.PauseIn != 0 {
			return
		}
		qtime := retryTime(now, j.Retry)
		batch.Queue(j.ID, qtime)
		if b.holdersElsewhere(j) && j.Retry > 0 && !firstQueueing(j) {
			batch.Postpone(j.ID, qtime, 0, 1) // applies after the Queue
		}
	}, func(old, nj *storage.Job, now int64) {
		if old.State == storage.StateQueued {
			// The counter bump of a job just queued (above).
			if n := len(queued); n > 0 && queued[n-1].Job.ID == nj.ID {
				queued[n-1] = QueuedJob{Job: nj, Bump: BumpDeliveries}
			}
			return
		}
		count++
		b.queuedLocked(nj, now)
		if b.holdersElsewhere(nj) {
			queued = append(queued, QueuedJob{Job: nj, Bump: BumpNone})
		}
	})
	if err != nil {
		return 0, err
	}
	if len(queued) > 0 {
		b.cluster.Queued(queued)
	}
	return count, nil
}

// firstQueueing reports whether queueing active job j now is its first
// queueing: a delayed job never delivered nor nacked (a copy is never
// delayed here: its origin runs the DELAY).
func firstQueueing(j *storage.Job) bool {
	return j.AwakeTime != 0 && j.Deliveries == 0 && j.Nacks == 0
}

// Dequeue takes queued jobs out of their queues without delivering them
// (DEQUEUE). It returns how many were dequeued.
func (b *Broker) Dequeue(ids []string) (int, error) {
	// The store refuses (ErrWrongState) a job that is not queued.
	return b.blindBatch(ids, (*storage.Batch).Dequeue, func(old, nj *storage.Job, now int64) {
		b.unqueuedLocked(old)
	})
}

// Working postpones a job's next requeue by its RETRY (WORKING) and returns
// the RETRY in seconds. ErrNoJob for an unknown job (or an at-most-once one,
// which is never requeued); ErrTooLate once half its TTL has elapsed. The
// other holders get WORKING (Cluster.Working): they postpone theirs too and
// dequeue a copy they have queued.
func (b *Broker) Working(id string) (int64, error) {
	var retry int64
	var refused error
	var working *storage.Job
	n, err := b.jobBatch([]string{id}, func(batch *storage.Batch, j *storage.Job, now int64) {
		if j.Retry == 0 || j.State == storage.StateAcked {
			refused = ErrNoJob
			return
		}
		ttl := j.Etime - j.CtimeMillis()
		if now-j.CtimeMillis() > ttl/2 {
			refused = ErrTooLate
			return
		}
		batch.Working(j.ID, retryTime(now, j.Retry))
		retry = int64(j.Retry)
	}, func(_, nj *storage.Job, _ int64) {
		if b.holdersElsewhere(nj) {
			working = nj
		}
	})
	switch {
	case err != nil:
		return 0, err
	case refused != nil:
		return 0, refused
	case n == 0:
		return 0, ErrNoJob
	}
	if working != nil {
		b.cluster.Working([]*storage.Job{working})
	}
	return retry, nil
}

// jobBatch is idBatch for commands that must see each job to decide: plan
// gets the job (unknown ids are skipped) and adds an operation for it, or
// not.
func (b *Broker) jobBatch(ids []string,
	plan func(*storage.Batch, *storage.Job, int64),
	done func(old, nj *storage.Job, now int64)) (int, error) {
	return b.idBatch(ids, func(batch *storage.Batch, id string, now int64) error {
		j, err := b.st.Job(id)
		if errors.Is(err, storage.ErrNotFound) {
			return nil
		}
		if err != nil {
			return wrapStore(err)
		}
		plan(batch, j, now)
		return nil
	}, done)
}

// blindBatch is idBatch for commands the store can check alone: one
// operation per id, without reading the job first; the store skips unknown
// ids and refuses jobs in the wrong state.
func (b *Broker) blindBatch(ids []string, add func(*storage.Batch, string),
	done func(old, nj *storage.Job, now int64)) (int, error) {
	return b.idBatch(ids, func(batch *storage.Batch, id string, _ int64) error {
		add(batch, id)
		return nil
	}, done)
}

// idBatch builds one store batch with plan for each distinct id, applies it
// under the broker's lock, calls done (if not nil) for each changed job with
// its state before and after, and waits for durability outside the lock. It
// returns how many jobs changed.
func (b *Broker) idBatch(ids []string,
	plan func(batch *storage.Batch, id string, now int64) error,
	done func(old, nj *storage.Job, now int64)) (int, error) {
	b.mu.Lock()
	n, pending, err := b.idBatchLocked(ids, plan, done)
	b.mu.Unlock()
	if err != nil {
		return 0, err
	}
	if err := pending.Wait(); err != nil {
		return 0, wrapStore(err)
	}
	return n, nil
}

func (b *Broker) idBatchLocked(ids []string,
	plan func(batch *storage.Batch, id string, now int64) error,
	done func(old, nj *storage.Job, now int64)) (int, storage.Pending, error) {
	if err := b.checkOpenLocked(); err != nil {
		return 0, storage.Pending{}, err
	}
	now := b.nowMillis()
	batch := b.st.NewBatch()
	batch.Grow(len(ids))
	seen := make(map[string]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			continue // the same id twice counts once
		}
		seen[id] = true
		if err := plan(batch, id, now); err != nil {
			return 0, storage.Pending{}, err
		}
	}
	if batch.Len() == 0 {
		// Nothing to write: each id was found unknown or in the state
		// the command would give it, maybe by a command whose write is
		// not durable yet (an ACKJOB whose fsync runs). The reply
		// reports that state, so it waits for it too.
		return 0, b.st.AppliedPending(), nil
	}
	res, pending := b.st.Apply(batch)
	n := 0
	synced := "" // the job whose timers match the batch's last op of it
	for k, r := range res {
		if r.Err != nil {
			if errUnusable(r.Err) {
				return 0, storage.Pending{}, wrapStore(r.Err)
			}
			continue // unknown, or not in a state the command applies to
		}
		n++
		// A job's ops are consecutive (plan adds them together). Its
		// timers are set once, at its first op, from its last: done may
		// hand a job just queued to a blocked GETJOB, whose delivery sets
		// its new retry, and a later op's result (ENQUEUE's counter bump,
		// still queued) synced after that would wipe it.
		if id := resultID(r); id != "" && id != synced {
			final := r.Job
			for _, m := range res[k+1:] {
				if m.Err != nil || resultID(m) != id {
					break
				}
				final = m.Job
			}
			b.syncTimersLocked(id, final)
			synced = id
		}
		if done != nil {
			done(r.Old, r.Job, now)
		}
	}
	if n == 0 {
		// The store refused every op (unknown ids, or in a state the op
		// does not apply to): as above, the reply waits for what it
		// found. (An op written waits for everything applied before it.)
		pending = pending.Join(b.st.AppliedPending())
	}
	return n, pending, nil
}

// resultID is the job an op's result is about ("" for none).
func resultID(r storage.Result) string {
	switch {
	case r.Old != nil:
		return r.Old.ID
	case r.Job != nil:
		return r.Job.ID // an add (a dummy ack)
	}
	return ""
}

// Job returns a job and its body (SHOW); ErrNoJob if unknown. The body is
// nil when it cannot be read.
func (b *Broker) Job(id string) (*storage.Job, []byte, error) {
	j, err := b.st.Job(id)
	if errors.Is(err, storage.ErrNotFound) {
		return nil, nil, ErrNoJob
	}
	if err != nil {
		return nil, nil, wrapStore(err)
	}
	body, err := b.st.Body(j)
	if err != nil {
		return j, nil, wrapStore(err)
	}
	return j, body, nil
}

// QueueLen returns the number of queued jobs in the queue (QLEN).
func (b *Broker) QueueLen(name string) int64 { return b.st.QueueLen(name) }

// Peek returns up to count queued jobs of a queue without delivering them
// (QPEEK): the oldest first, or with newest the newest first.
func (b *Broker) Peek(name string, count int, newest bool) ([]Delivered, error) {
	var pos []storage.QueuePos
	var err error
	if newest {
		pos, err = b.st.QueueNewest(name, count)
	} else {
		pos, err = b.st.QueueRange(name, storage.QueuePos{}, count)
	}
	if err != nil {
		return nil, wrapStore(err)
	}
	jobs := make([]*storage.Job, 0, len(pos))
	for _, p := range pos {
		j, err := b.st.Job(p.ID)
		if errors.Is(err, storage.ErrNotFound) {
			continue // deleted since the scan
		}
		if err != nil {
			return nil, wrapStore(err)
		}
		jobs = append(jobs, j)
	}
	out := make([]Delivered, 0, len(jobs))
	for k, r := range b.st.Bodies(jobs) {
		j := jobs[k]
		switch {
		case errors.Is(r.Err, storage.ErrNotFound):
			continue // deleted since it was read
		case r.Err != nil:
			// GETJOB leaves such a job queued and undelivered; QPEEK shows
			// the others rather than failing for it.
			b.mu.Lock()
			b.noteUnreadableLocked(j, r.Err, unreadablePeeked)
			b.mu.Unlock()
			continue
		}
		out = append(out, Delivered{Queue: j.Queue, ID: j.ID, Body: r.Body, Nacks: j.Nacks, AdditionalDeliveries: j.AdditionalDeliveries})
	}
	return out, nil
}

// Pause sets a queue's pause state (persisted) and returns it. Lifting an
// output pause serves the queue's blocked clients.
func (b *Broker) Pause(name string, p storage.PauseState) (storage.PauseState, error) {
	now := b.nowMillis()
	batch := b.st.NewBatch()
	if err := batch.Pause(name, p); err != nil {
		return 0, wrapStore(err)
	}
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return 0, err
	}
	res, pending := b.st.Apply(batch)
	if err := res[0].Err; err != nil {
		b.mu.Unlock()
		return 0, wrapStore(err)
	}
	if p&storage.PauseOut == 0 {
		if q := b.queues[name]; q != nil && len(q.waiters) > 0 {
			b.serveWaitersLocked(q, now)
		}
	}
	b.mu.Unlock()
	// Wait for durability without holding up other commands.
	if err := pending.Wait(); err != nil {
		return 0, wrapStore(err)
	}
	return p, nil
}

// PauseState returns a queue's pause state.
func (b *Broker) PauseState(name string) storage.PauseState { return b.st.PauseState(name) }

// FlushAll deletes every job and lifts every pause (DEBUG FLUSHALL): one
// store record of range deletions, whatever the number of jobs, and the
// broker's heads and timers start afresh; queues nobody waits on are
// forgotten. Blocked GETJOB clients keep waiting.
func (b *Broker) FlushAll() error {
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return err
	}
	p := b.st.FlushAll()
	for name, q := range b.queues {
		if len(q.waiters) == 0 {
			delete(b.queues, name) // gone, as in Disque (registered_queues)
			continue
		}
		q.head = NewHead(b.opts.HeadSize) // complete and empty, like the queue
		q.unreadable = nil
	}
	b.wheel = NewWheel(b.nowMillis())
	b.cursor, b.loader = storage.Event{}, loaderDone
	b.mu.Unlock()
	return wrapStore(p.Wait())
}
