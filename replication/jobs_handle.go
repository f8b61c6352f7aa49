package replication

import (
	"slices"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// Handle is the Transport handler of the job protocol's messages (the
// others are ignored: their parts handle them). A malformed payload is
// dropped with a log line. It runs on the sender's link goroutine, so a
// REPLJOB's durable write slows that link only.
func (j *Jobs) Handle(from string, m Message) {
	j.mu.Lock()
	ready := j.broker != nil && !j.closed
	j.mu.Unlock()
	if !ready {
		return
	}
	var err error
	switch m.Type {
	case MsgReplJob:
		err = j.handleReplJob(from, m.Payload)
	case MsgGotJob:
		ids, inc, e := decodeGotJobs(m.Payload)
		if err = e; err == nil && j.gotJobs(from, ids, inc) {
			// The peer's store may have opened again since this node
			// told it its incarnation: the mark it held went with it.
			j.tellIncarnation([]string{from}, true) // jobs_federation_first.go
		}
	case MsgSetAck, MsgGotAck, MsgDelJob:
		j.handleCollectRun(from, []Message{m}) // ackgc_batch.go
		return
	case MsgFastDel:
		ids, mayhave, e := decodeSetAcks(m.Payload)
		if err = e; err == nil {
			j.fastDelJobs(from, ids, mayhave)
		}
	case MsgWillQueue:
		var ids []string
		if ids, err = decodeIDs(m.Payload); err == nil {
			j.willQueue(from, ids)
		}
	case MsgQueued:
		var qs []queue.RemoteQueuedJob
		if qs, err = decodeQueued(m.Payload); err == nil {
			j.queued(from, qs)
		}
	case MsgWorking:
		var ids []string
		if ids, err = decodeIDs(m.Payload); err == nil {
			j.working(from, ids)
		}
	case MsgPause:
		name, v, versioned, e := decodePauseVersion(m.Payload)
		if err = e; err == nil {
			j.pause(from, name, v, versioned)
		}
	case MsgPauseHave, MsgPauseForget:
		name, v, versioned, e := decodePauseVersion(m.Payload)
		switch {
		case e != nil:
			err = e
		case !versioned:
			err = errUnversionedPause
		case m.Type == MsgPauseHave:
			j.pauseHave(from, name, v)
		default:
			j.pauseForget(name, v)
		}
	case MsgEnqueue:
		err = j.handleEnqueue(from, m.Payload)
	case MsgNeedJobs:
		err = j.handleNeedJobs(from, m.Payload)
	case MsgYourJobs:
		err = j.handleYourJobs(from, m.Payload)
	case MsgQueueLen:
		err = j.handleQueueLen(from, m.Payload)
	case MsgQueueLenAnswer:
		err = j.handleQueueLenAnswer(from, m.Payload)
	}
	if err != nil {
		j.count(func(s *JobsStats) { s.BadPayloads++ })
		j.log.Warn("replication: dropped a malformed message", "from", from, "type", m.Type, "bytes", len(m.Payload), "err", err)
	}
}

// HandleBatch is the BatchHandler of the job protocol: the messages of
// one sender its link read together, handled in order as Handle would
// one by one — but a run of consecutive REPLJOBs is applied as one
// (handleReplJobs): one store commit for all their copies, and one
// GOTJOB for those of them that want an answer; so is a run of SETACKs
// and DELJOBs, and one of GOTACKs (handleCollectRun, ackgc_batch.go);
// and the batch's NEEDJOBS go first (needJobsFirst).
func (j *Jobs) HandleBatch(from string, ms []Message) {
	ms = j.needJobsFirst(from, ms) // jobs_federation.go
	for i := 0; i < len(ms); {
		if k := collectRunEnd(ms, i); k > i {
			j.handleCollectRun(from, ms[i:k])
			i = k
			continue
		}
		k := i + 1
		for ms[i].Type == MsgReplJob && k < len(ms) && ms[k].Type == MsgReplJob {
			k++
		}
		if k-i == 1 {
			j.Handle(from, ms[i])
		} else {
			j.handleReplJobRun(from, ms[i:k])
		}
		i = k
	}
}

// handleReplJobRun is Handle for consecutive REPLJOBs of one sender: a
// malformed one is dropped (logged and counted, as by Handle) and the
// others are applied together.
func (j *Jobs) handleReplJobRun(from string, ms []Message) {
	j.mu.Lock()
	ready := j.broker != nil && !j.closed
	j.mu.Unlock()
	if !ready {
		return
	}
	var all []replJob
	var heads []replHeader // per job of all: its REPLJOB's
	for _, m := range ms {
		h, jobs, err := decodeReplJobs(m.Payload)
		if err != nil {
			j.count(func(s *JobsStats) { s.BadPayloads++ })
			j.log.Warn("replication: dropped a malformed message", "from", from, "type", m.Type, "bytes", len(m.Payload), "err", err)
			continue
		}
		all = append(all, jobs...)
		for range jobs {
			heads = append(heads, h)
		}
	}
	j.applyReplJobs(from, all, heads)
}

// handleReplJob stores the copies and answers GOTJOB for those durable
// here (unless the sender asked for no reply). A copy refused (a queue
// paused for input, a failed store) gets no GOTJOB: the sender tries
// another node. The copies are applied here, on the sender's link, in
// order; their durability is waited for by the sender's confirmer
// (confirmGotJobs), so the link goes on to the next REPLJOBs meanwhile
// and they share the AOF write, and one GOTJOB answers them all.
func (j *Jobs) handleReplJob(from string, p []byte) error {
	h, jobs, err := decodeReplJobs(p)
	if err != nil {
		return err
	}
	heads := make([]replHeader, len(jobs))
	for i := range heads {
		heads[i] = h
	}
	j.applyReplJobs(from, jobs, heads)
	return nil
}

// applyReplJobs applies copies in one ReplicaApply and hands the ids of
// those applied whose REPLJOB wants an answer to the sender's confirmer.
// While RefuseCopies gives a reason, none is applied. heads[i] is the
// header of the REPLJOB of jobs[i]: whether it wants an answer, and
// whether it is the origin's first to this node (queue.Replica.First).
func (j *Jobs) applyReplJobs(from string, jobs []replJob, heads []replHeader) {
	if len(jobs) == 0 {
		return
	}
	if j.cfg.RefuseCopies != nil {
		if why := j.cfg.RefuseCopies(); why != "" {
			j.count(func(s *JobsStats) { s.CopiesRefused += int64(len(jobs)) })
			j.log.Debug("replication: copies refused", "from", from, "jobs", len(jobs), "why", why)
			return
		}
	}
	jobs, heads, late := j.gone.dropGone(jobs, heads)
	if late > 0 {
		j.count(func(s *JobsStats) { s.LateCopiesDropped += int64(late) })
		j.log.Debug("replication: copies of ended jobs dropped", "from", from, "jobs", late)
		if len(jobs) == 0 {
			return
		}
	}
	reps := make([]queue.Replica, len(jobs))
	for i, r := range jobs {
		reps[i] = queue.Replica{Job: r.Job, Body: r.Body, First: heads[i].first}
	}
	errs, durable := j.broker.ReplicaApply(reps)
	var ok []string
	for i, e := range errs {
		switch {
		case e != nil:
			j.log.Debug("replication: copy refused", "job", jobs[i].Job.ID, "from", from, "err", e)
		case !heads[i].noReply:
			ok = append(ok, jobs[i].Job.ID)
		}
	}
	if len(ok) == 0 {
		return
	}
	j.mu.Lock()
	if j.closed {
		j.mu.Unlock()
		return // no GOTJOB: the sender tries again or gives up
	}
	c := j.confirm[from]
	if c == nil {
		c = &gotJobConfirmer{}
		j.confirm[from] = c
	}
	c.waiting = append(c.waiting, pendingGotJob{ids: ok, durable: durable})
	start := !c.running
	c.running = true
	if start {
		j.confirmers.Add(1)
	}
	j.mu.Unlock()
	if start {
		go j.confirmGotJobs(from, c)
	}
}

// gotJobConfirmer is the GOTJOBs owed to one sender: the copies its
// REPLJOBs applied, waiting for their durability. One goroutine runs it
// while any are waiting.
type gotJobConfirmer struct {
	waiting []pendingGotJob // under Jobs.mu
	running bool            // under Jobs.mu: confirmGotJobs is running
}

// pendingGotJob is the applied copies of one REPLJOB.
type pendingGotJob struct {
	ids     []string
	durable func() error
}

// confirmGotJobs takes every REPLJOB of c waiting, waits for their
// durability (in log order: the first wait is the long one, the others
// were written with it) and answers them in one GOTJOB, until none is
// left. A copy whose durability failed gets no GOTJOB.
func (j *Jobs) confirmGotJobs(from string, c *gotJobConfirmer) {
	defer j.confirmers.Done()
	for {
		j.mu.Lock()
		batch := c.waiting
		c.waiting = nil
		if len(batch) == 0 {
			c.running = false
			if j.confirm[from] == c {
				delete(j.confirm, from)
			}
			j.mu.Unlock()
			return
		}
		j.mu.Unlock()
		var ok []string
		for _, pg := range batch {
			if err := pg.durable(); err != nil {
				j.log.Debug("replication: copies not durable", "from", from, "jobs", len(pg.ids), "err", err)
				continue
			}
			ok = append(ok, pg.ids...)
		}
		if len(ok) > 0 {
			// With this store's incarnation, which the sender stamps
			// its next first REPLJOBs with.
			j.send(from, MsgGotJob, encodeGotJobs(ok, j.broker.Store().ReplicaIncarnation()))
		}
	}
}

// gotJobs records GOTJOB answers and wakes the Replicate calls that have
// enough; incarnation is the sender store's (0: none), which stamps the
// first REPLJOBs sent it from now on. It says whether to tell the sender
// this node's incarnation again: the sender's is new — it replaces
// another (the sender's store was opened again), or it is the first
// heard since this node told the sender its own (which that open may
// have missed, if it came after the tell). Only a change says so, and
// both ends hold what they heard, so two nodes tell each other again at
// most once per open.
func (j *Jobs) gotJobs(from string, ids []string, incarnation uint64) (retell bool) {
	mark := j.fedMarkFor(ids, incarnation) // before j.mu: it reads the broker
	j.mu.Lock()
	defer j.mu.Unlock()
	j.learnFedMarkLocked(from, incarnation, mark)
	if old := j.peerInc[from]; incarnation != old {
		_, told := j.fedIncSent[from]
		retell = incarnation != 0 && (old != 0 || told)
		// A change: new stamps are valid for ASYNC jobs planned from
		// now on only (asyncHead).
		if incarnation != 0 {
			j.peerInc[from] = incarnation
			j.peerIncAt[from] = j.incMark.Add(1)
		} else {
			delete(j.peerInc, from)
			delete(j.peerIncAt, from)
		}
	}
	j.stats.GotJobsReceived += int64(len(ids))
	now := j.nowMillis()
	for i, id := range ids {
		p := j.repl[id]
		if p == nil || slices.Contains(p.confirmed, from) {
			continue
		}
		if i == 0 {
			// One sample per message: an average over 8 answers.
			old := j.replRTT.Load()
			j.replRTT.Store(old + (max(now-p.start, 0)-old)/8)
			j.rtt.observe(now - p.start)
		}
		p.confirmed = append(p.confirmed, from)
		if len(p.confirmed) >= p.need {
			wakeUp(p.wake)
		}
	}
	return retell
}

// answerSetAcks is the rest of a SETACK once its acks are applied here
// and durable (res: RemoteCollect's outcome for each of ids; a queued job
// left its queue, an unknown one left a dummy ack): it answers GOTACK, as
// Disque does — but for a job this node knows more holders of than the
// sender (mayhave): it collects that job itself (Acked), and answers
// GOTACK only if the sender has a dummy ack (mayhave 0), which may then
// go. Answered, a sender that knows fewer holders would delete the job
// everywhere it knows and leave the others' copies to be requeued. Every
// other copy acked here, and every dummy ack the SETACK left, gets a
// collection of its own whose first round waits (heldAcked): if the
// sender's DELJOB never comes, this node collects the job itself.
//
// A SETACK with mayhave 0 is a search: the sender holds a dummy ack (an
// ACKJOB of an id it never had) and asks every node. A job unknown here
// is answered "not known" and leaves nothing (as in Disque): a dummy ack
// left by a search is collected by nobody — no holder's collection names
// this node, or it deleted its copy already — and stays until its TTL.
// (A search held up on a link to a restarting peer arrived after the
// copies were collected and left acked "copies" on their holders: Disque
// suite 05-acks, "acknowledge jobs to nodes not knowing it".)
//
// It returns the GOTACK's ids and known flags: the caller sends them, with
// those of the other SETACKs of the run, in one message.
func (j *Jobs) answerSetAcks(from string, ids []string, mayhave []int, res []queue.Collected) (answer []string, answerKnown []bool) {
	var collect, held []*storage.Job
	var dummies, deleted []string
	for i, id := range ids {
		job, known := res[i].Job, res[i].Known
		switch {
		case res[i].Deleted:
			// The pair's copy here is deleted, durably (ackgc_pair.go):
			// nothing is left here to collect or to wait on.
			deleted = append(deleted, id)
		case job == nil:
			// Not here (a search's unknown id, an at-most-once one), or
			// deleted by a DELJOB read with this SETACK: nothing to collect.
		case known && len(job.Nodes) > mayhave[i]:
			collect = append(collect, job)
			if mayhave[i] != 0 {
				continue
			}
		case known:
			held = append(held, job)
		case job.IsDummyAck() && mayhave[i] != 0:
			// A holder's SETACK left (or found) a dummy ack here. A
			// dummy ack's SETACK (mayhave 0) does not: the dummies
			// it reaches are collected by the SETACK that left them.
			dummies = append(dummies, id)
		}
		answer, answerKnown = append(answer, id), append(answerKnown, known)
	}
	// Recorded before the GOTACK goes, so the DELJOB it brings finds
	// the collections and ends them.
	if len(deleted) > 0 {
		// jobs_gone.go: as a DELJOB's deletes, marked so that from's
		// DELJOB of them skips the store (takePairs).
		j.gone.addPairs(from, deleted)
	}
	j.heldAcked(from, held, dummies, j.cfg.Now())
	if len(collect) > 0 {
		j.Acked(collect)
	}
	return answer, answerKnown
}

// endCollections is the rest of a DELJOB once its copies are deleted
// here: it forgets their collection. A collection here that has sent
// nothing yet (a holder's, waiting for its first round: the common case,
// the collector's DELJOB came in time) just ends: no SETACK from here left
// anything anywhere. One that has sent a SETACK round (two nodes collect
// at once: the DELJOB was late, or an ACKJOB on a node that never had the
// job) ends as if it had finished: DELJOB to its other targets, whose
// SETACK from here may have left a dummy ack on a node that had deleted
// the job already — the dummy's own collection would clear it too, but
// only after its retry period and with a SETACK to every node. A dummy
// ack's SETACK (mayhave 0) leaves nothing, so a dummy's collection ends
// with no message either.
func (j *Jobs) endCollections(ids []string) {
	dels := map[string][]string{}
	j.mu.Lock()
	for _, id := range ids {
		if gc := j.acks.get(id); gc != nil && !gc.dummy && gc.retries > 0 {
			// The sender too: a SETACK from here it had not yet
			// read when it deleted the job leaves it a dummy ack.
			for _, n := range gc.targets {
				dels[n] = append(dels[n], id)
			}
		}
		j.acks.drop(id)
	}
	j.mu.Unlock()
	j.sendDelJobs(dels)
}
