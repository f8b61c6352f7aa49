package replication

import (
	"slices"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// About one queued copy (Disque's WILLQUEUE/QUEUED, cluster.c), WORKING and
// PAUSE … BCAST: the queue.Cluster methods the broker calls when its timers
// or its clients queue, postpone or pause, and the handlers of the same
// messages from other nodes. The broker decides (queue/remote_queueing.go);
// Jobs only addresses the messages: to a job's other holders (its nodes),
// or for PAUSE to every known node.

// idsPerMessage bounds the ids of one WILLQUEUE, QUEUED or WORKING message
// (41 bytes each: far below MaxFrame), however many a NACK names.
const idsPerMessage = 4096

// holders returns, per other node of each job, the indexes of its jobs.
func (j *Jobs) holders(n int, nodes func(i int) []string) map[string][]int {
	self := j.self()
	per := map[string][]int{}
	for i := range n {
		for _, id := range nodes(i) {
			if id != self && !slices.Contains(per[id], i) {
				per[id] = append(per[id], i)
			}
		}
	}
	return per
}

// sendIDs sends typ with the ids of jobs to each of their other holders.
func (j *Jobs) sendIDs(typ MsgType, jobs []*storage.Job) int {
	sent := 0
	for to, idx := range j.holders(len(jobs), func(i int) []string { return jobs[i].Nodes }) {
		for c := range slices.Chunk(idx, idsPerMessage) {
			ids := make([]string, len(c))
			for k, i := range c {
				ids[k] = jobs[i].ID
			}
			j.send(to, typ, encodeIDs(ids))
			sent++
		}
	}
	return sent
}

// WillQueue implements queue.Cluster: WILLQUEUE to the jobs' other holders.
func (j *Jobs) WillQueue(jobs []*storage.Job) {
	if j.bound.Load() == nil {
		return // not started: no transport yet
	}
	n := j.sendIDs(MsgWillQueue, jobs)
	j.count(func(s *JobsStats) { s.WillQueuesSent += int64(n) })
}

// Working implements queue.Cluster: WORKING to the jobs' other holders.
func (j *Jobs) Working(jobs []*storage.Job) {
	if j.bound.Load() == nil {
		return // not started: no transport yet
	}
	n := j.sendIDs(MsgWorking, jobs)
	j.count(func(s *JobsStats) { s.WorkingsSent += int64(n) })
}

// Queued implements queue.Cluster: QUEUED, with each job's counter to
// bump, to the jobs' other holders.
func (j *Jobs) Queued(jobs []queue.QueuedJob) {
	if j.bound.Load() == nil {
		return // not started: no transport yet
	}
	sent := 0
	for to, idx := range j.holders(len(jobs), func(i int) []string { return jobs[i].Job.Nodes }) {
		for c := range slices.Chunk(idx, idsPerMessage) {
			qs := make([]queue.RemoteQueuedJob, len(c))
			for k, i := range c {
				qs[k] = queue.RemoteQueuedJob{ID: jobs[i].Job.ID, Bump: jobs[i].Bump}
			}
			j.send(to, MsgQueued, encodeQueued(qs))
			sent++
		}
	}
	j.count(func(s *JobsStats) { s.QueuedSent += int64(sent) })
}

// willQueue handles WILLQUEUE: from will queue these jobs shortly. The
// broker adds it to their nodes; jobs queued here are announced (QUEUED,
// nothing to bump) to their holders, so from postpones its requeue; jobs
// acked here are acked on from (SETACK).
func (j *Jobs) willQueue(from string, ids []string) {
	queued, acked, err := j.broker.RemoteWillQueue(from, ids)
	if err != nil {
		j.log.Warn("replication: WILLQUEUE", "from", from, "jobs", len(ids), "err", err)
		return
	}
	if len(queued) > 0 {
		qs := make([]queue.QueuedJob, len(queued))
		for i, job := range queued {
			qs[i] = queue.QueuedJob{Job: job, Bump: queue.BumpNone}
		}
		j.Queued(qs)
	}
	j.setAckTo(from, acked)
}

// queued handles QUEUED: from queued these jobs.
func (j *Jobs) queued(from string, qs []queue.RemoteQueuedJob) {
	acked, err := j.broker.RemoteQueued(from, qs)
	if err != nil {
		j.log.Warn("replication: QUEUED", "from", from, "jobs", len(qs), "err", err)
		return
	}
	j.setAckTo(from, acked)
}

// working handles WORKING: a consumer of from is working on these jobs.
func (j *Jobs) working(from string, ids []string) {
	acked, err := j.broker.RemoteWorking(from, ids)
	if err != nil {
		j.log.Warn("replication: WORKING", "from", from, "jobs", len(ids), "err", err)
		return
	}
	j.setAckTo(from, acked)
}

// setAckTo answers a node that queues (or will queue, or works on) jobs
// acked here with SETACK, so it acks its copy (Disque: "some other node
// queued a message that we have as already acknowledged"). The node joins
// the collection of each job collected here, so its copy is deleted with
// the others.
func (j *Jobs) setAckTo(from string, ids []string) {
	if len(ids) == 0 || from == j.self() {
		return
	}
	mayhave := make([]int, len(ids)) // 0 where no collection runs here
	j.mu.Lock()
	for i, id := range ids {
		gc := j.acks.get(id)
		if gc == nil {
			continue
		}
		if !gc.dummy && !slices.Contains(gc.targets, from) {
			gc.targets = append(gc.targets, from)
		}
		mayhave[i] = gc.mayhave
	}
	j.stats.SetAcksSent++
	j.mu.Unlock()
	j.send(from, MsgSetAck, encodeSetAcks(ids, mayhave))
}
