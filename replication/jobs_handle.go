package replication

import (
	"github.com/diskque/diskque/queue"
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
		var ids []string
		if ids, err = decodeIDs(m.Payload); err == nil {
			j.gotJobs(from, ids)
		}
	case MsgSetAck:
		var ids []string
		if ids, err = decodeIDs(m.Payload); err == nil {
			j.setAcks(from, ids)
		}
	case MsgGotAck:
		ids, known, e := decodeGotAcks(m.Payload)
		if err = e; err == nil {
			j.gotAcks(from, ids, known)
		}
	case MsgDelJob:
		var ids []string
		if ids, err = decodeIDs(m.Payload); err == nil {
			j.delJobs(ids)
		}
	case MsgEnqueue:
		err = j.handleEnqueue(from, m.Payload)
	}
	if err != nil {
		j.count(func(s *JobsStats) { s.BadPayloads++ })
		j.log.Warn("replication: dropped a malformed message", "from", from, "type", m.Type, "bytes", len(m.Payload), "err", err)
	}
}

// handleReplJob stores the copies and answers GOTJOB for those durable
// here (unless the sender asked for no reply). A copy refused (a queue
// paused for input, a failed store) gets no GOTJOB: the sender tries
// another node.
func (j *Jobs) handleReplJob(from string, p []byte) error {
	noReply, jobs, err := decodeReplJobs(p)
	if err != nil {
		return err
	}
	reps := make([]queue.Replica, len(jobs))
	for i, r := range jobs {
		reps[i] = queue.Replica{Job: r.Job, Body: r.Body}
	}
	errs := j.broker.ReplicaAdd(reps)
	if noReply {
		return nil
	}
	var ok []string
	for i, e := range errs {
		if e == nil {
			ok = append(ok, jobs[i].Job.ID)
		} else {
			j.log.Debug("replication: copy refused", "job", jobs[i].Job.ID, "from", from, "err", e)
		}
	}
	if len(ok) > 0 {
		j.send(from, MsgGotJob, encodeIDs(ok))
	}
	return nil
}

// gotJobs records GOTJOB answers and wakes the Replicate calls that have
// enough.
func (j *Jobs) gotJobs(from string, ids []string) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.stats.GotJobsReceived += int64(len(ids))
	for _, id := range ids {
		p := j.repl[id]
		if p == nil || p.confirmed[from] {
			continue
		}
		p.confirmed[from] = true
		if len(p.confirmed) >= p.need {
			wakeUp(p.wake)
		}
	}
}

// setAcks acks the jobs here (a queued one leaves its queue; an unknown
// one leaves a dummy ack) and answers GOTACK, once durable.
func (j *Jobs) setAcks(from string, ids []string) {
	known, err := j.broker.RemoteSetAck(ids)
	if err != nil {
		j.log.Warn("replication: SETACK", "from", from, "err", err)
		return // no GOTACK: the sender tries again
	}
	j.send(from, MsgGotAck, encodeGotAcks(ids, known))
	j.takeOverCollection(from, ids, known)
}

// delJobs deletes the copies (DELJOB) and forgets their collection.
func (j *Jobs) delJobs(ids []string) {
	j.mu.Lock()
	for _, id := range ids {
		delete(j.acks, id)
	}
	j.mu.Unlock()
	if _, err := j.broker.RemoteDelJob(ids); err != nil {
		j.log.Warn("replication: DELJOB", "jobs", len(ids), "err", err)
	}
}
