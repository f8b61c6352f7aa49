package replication

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// External replication (CLUSTER.md "External replication"; Disque's
// addjobCommand with extrepl and its ENQUEUE): the broker's ADDJOB keeps
// no copy on this node — it is leaving, or short of memory or disk — so
// the job goes to Repl *other* nodes, and one of them is told to queue it.
//
//   - ReplicateExternal is Replicate with Repl other nodes to confirm and
//     this node left out of the copies' node list; once a job has its
//     confirmations, ENQUEUE goes to one of the nodes that confirmed it,
//     chosen at random. A job short at its deadline is deleted where it
//     was sent (DELJOB), as Replicate does.
//   - ReplicateExternalAsync sends the REPLJOBs flagged no-reply and the
//     ENQUEUE to one of the nodes at once: the link to a node is ordered,
//     so its copy is stored before the ENQUEUE is handled.
//   - ENQUEUE carries the job's DELAY left (ms), from the origin's clock.
//     The receiver queues its copy (queue.Broker.RemoteEnqueue) if it is
//     still active and not delivered, now or at the delay's end.
//
// ENQUEUE is best effort like every bus message: when it is lost (the link
// broke), the copies still requeue at their RETRY, so an at-least-once job
// is delivered anyway, later; an at-most-once one (REPLICATE 1 RETRY 0)
// waits for its TTL.

var _ queue.ExternalCluster = (*Jobs)(nil)

// ReplicateExternal implements queue.ExternalCluster.
func (j *Jobs) ReplicateExternal(jobs []queue.Replication) []queue.ReplicationResult {
	return j.replicate(jobs, true)
}

// ReplicateExternalAsync implements queue.ExternalCluster.
func (j *Jobs) ReplicateExternalAsync(jobs []queue.Replication) [][]string {
	reach := j.linkedIDs()
	now := j.nowMillis()
	prs := make([]*pendingRepl, len(jobs))
	nodes := make([][]string, len(jobs))
	var enq enqueues
	for i, r := range jobs {
		p := &pendingRepl{need: int(r.Job.Repl), external: true}
		p.sent = pick(reach, nil, p.need)
		prs[i], nodes[i] = p, p.sent
		// Any of them: none confirms, and each gets its copy before the
		// ENQUEUE on their link.
		enq.addTo(p.sent, r.Job, now)
	}
	j.sendRepl(jobs, prs, nil, func(string) replHeader { return replHeader{noReply: true} })
	j.sendEnqueues(enq)
	return nodes
}

// nodeList is the node list a job's copies carry (nodes-delivered): this
// node and the nodes sent to, or those alone when this node keeps no copy.
//
// The list is shared (the REPLJOBs' encoding and the call's result read it
// while sent has not grown since): its callers never change it.
func (j *Jobs) nodeList(p *pendingRepl) []string {
	if p.external {
		return slices.Clone(p.sent)
	}
	if p.list == nil || len(p.list) != len(p.sent)+1 {
		p.list = append(make([]string, 0, len(p.sent)+1), j.self())
		p.list = append(p.list, p.sent...)
	}
	return p.list
}

// enqueues are ENQUEUE messages to send, per node.
type enqueues struct {
	order []string
	per   map[string]*enqueueList
}

type enqueueList struct {
	ids    []string
	delays []int64
}

// add schedules an ENQUEUE of job to one of the nodes that confirmed it.
func (e *enqueues) add(p *pendingRepl, job *storage.Job, now int64) {
	var cand []string
	for _, n := range p.sent {
		if slices.Contains(p.confirmed, n) {
			cand = append(cand, n)
		}
	}
	e.addTo(cand, job, now)
}

// addTo schedules an ENQUEUE of job to one of nodes, at random.
func (e *enqueues) addTo(nodes []string, job *storage.Job, now int64) {
	if len(nodes) == 0 {
		return
	}
	n := nodes[rand.IntN(len(nodes))]
	if e.per == nil {
		e.per = map[string]*enqueueList{}
	}
	l := e.per[n]
	if l == nil {
		l = &enqueueList{}
		e.per[n] = l
		e.order = append(e.order, n)
	}
	l.ids = append(l.ids, job.ID)
	l.delays = append(l.delays, max(job.AwakeTime-now, 0))
}

func (j *Jobs) sendEnqueues(e enqueues) {
	for _, n := range e.order {
		l := e.per[n]
		j.send(n, MsgEnqueue, encodeEnqueues(l.ids, l.delays))
		j.count(func(s *JobsStats) { s.EnqueuesSent += int64(len(l.ids)) })
	}
}

// handleEnqueue queues the copies the sender chose this node to queue.
func (j *Jobs) handleEnqueue(from string, p []byte) error {
	ids, delays, err := decodeEnqueues(p)
	if err != nil {
		return err
	}
	j.count(func(s *JobsStats) { s.EnqueuesReceived += int64(len(ids)) })
	if _, err := j.broker.RemoteEnqueue(ids, delays); err != nil {
		j.log.Warn("replication: ENQUEUE", "from", from, "jobs", len(ids), "err", err)
	}
	return nil
}

// ENQUEUE's payload: version count { id delay }…, delay a uvarint in ms.

// maxEnqueueDelay bounds a decoded delay (a job's TTL is at most ~2^32 s).
const maxEnqueueDelay = 1 << 42

func encodeEnqueues(ids []string, delays []int64) []byte {
	b := make([]byte, 0, 2+len(ids)*(storage.JobIDLen+4))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(len(ids)))
	for i, id := range ids {
		b = append(b, id...)
		b = binary.AppendUvarint(b, uint64(max(delays[i], 0)))
	}
	return b
}

func decodeEnqueues(p []byte) ([]string, []int64, error) {
	d := msgDecoder{b: p}
	d.version()
	n := d.count(storage.JobIDLen + 1)
	ids := make([]string, 0, n)
	delays := make([]int64, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		ids = append(ids, d.id())
		delays = append(delays, int64(d.bounded(maxEnqueueDelay)))
	}
	if err := d.end(); err != nil {
		return nil, nil, err
	}
	return ids, delays, nil
}
