package replication

import (
	"sync"

	"github.com/diskque/diskque/queue"
)

// Federation on the bus (CLUSTER.md "Federation"; queue's federation.go
// paces the asking and federation_remote.go decides what moves):
//
//   - NeedJobs (queue.Cluster): NEEDJOBS (queue, count) to the nodes of
//     each request, or to every reachable node — leaving ones included:
//     they are the ones being drained — for a broadcast. A node that is
//     leaving sends none (Disque's myselfLeaving()).
//   - An incoming NEEDJOBS is answered only while the bus link back to
//     the asker is up (Disque: no link, no YOURJOBS), so the jobs are not
//     taken from the queue for a message that could not leave:
//     queue.Broker.RemoteNeedJobs takes them (durably) and the YOURJOBS
//     carrying them goes to the asker on its link.
//   - An incoming YOURJOBS is queued here (queue.Broker.ImportYourJobs),
//     and the NEEDJOBS it calls for (blocked clients emptied the queue
//     again) go at once, before the import's durability wait.
//   - NEEDJOBS never waits behind the sender's other messages: a batch's
//     NEEDJOBS are handled first, and with the daemon's handler
//     (HandleBatchQueued, jobs_inbox.go) while earlier batches still wait
//     for their durable writes.
//
// A YOURJOBS lost on the way (the link broke after the write) leaves an
// at-least-once job active on the giver, which requeues it after its
// RETRY; an at-most-once one is lost, never delivered twice.

// NeedJobs implements queue.Cluster.
func (j *Jobs) NeedJobs(reqs []queue.NeedJobsRequest) {
	if len(reqs) == 0 || j.boundTr.Load() == nil || j.selfLeaving() {
		return
	}
	var everyone []string
	sent := 0
	for _, r := range reqs {
		nodes := r.Nodes
		if nodes == nil {
			if everyone == nil {
				everyone = j.needJobsTargets()
			}
			nodes = everyone
		}
		if len(nodes) == 0 {
			continue
		}
		msg := encodeNeedJobs(r.Queue, max(r.Count, 1))
		self := j.self()
		j.tellIncarnation(nodes, false) // jobs_federation_first.go
		for _, n := range nodes {
			if n != self {
				j.send(n, MsgNeedJobs, msg)
				sent++
			}
		}
	}
	j.count(func(s *JobsStats) { s.NeedJobsSent += int64(sent) })
}

// needJobsTargets are the nodes a broadcast NEEDJOBS goes to: every other
// reachable node, leaving or not.
func (j *Jobs) needJobsTargets() []string {
	self := j.self()
	var ids []string
	for _, n := range j.cfg.Peers.Reachable() {
		if n.ID != self && !n.Myself {
			ids = append(ids, n.ID)
		}
	}
	return ids
}

// selfLeaving reports whether this node is leaving the cluster (CLUSTER
// LEAVING yes), as membership says.
func (j *Jobs) selfLeaving() bool {
	self := j.self()
	for _, n := range j.cfg.Peers.Nodes() {
		if n.Myself || n.ID == self {
			return n.Leaving
		}
	}
	return false
}

// givers are the NEEDJOBS received and not answered yet, per asker. They
// are answered off the link's goroutine (giveJobs), so that a NEEDJOBS
// does not wait behind the SETACKs and DELJOBs the same asker sent before
// it, each with its own durable write, and those do not wait for it: the
// next jobs are on their way while the acks of the last ones are applied.
// Under Jobs.mu; running counts the goroutines, which Close waits for.
type givers struct {
	byAsker map[string]*giver
	running sync.WaitGroup
}

// giver is one asker's NEEDJOBS waiting: per queue, the largest count
// asked since the last answer (a NEEDJOBS asked again before it was
// answered is answered once).
type giver struct {
	want map[string]int
}

// maxNeedJobsPending bounds the queues one asker's NEEDJOBS may wait for
// (more are dropped: NEEDJOBS is asked again at its pace).
const maxNeedJobsPending = 1024

// needJobsFirst handles the NEEDJOBS of a batch one link read together
// before the rest of it, and returns the rest in order (HandleBatch). A
// NEEDJOBS only records what the asker wants (handleNeedJobs) and the
// giver goroutine answers it concurrently with whatever the link handles
// next, so taking it first only lets the answer also run beside the
// messages that came before it in the batch: the SETACKs and DELJOBs of
// the asker's last jobs, each of which waits for its own durable write on
// the link (under appendfsync always, an fsync each). Behind them the
// NEEDJOBS waited a few ms to tens of ms per round trip, and the jobs on
// this node waited as long for the asker (bench/README.md "Cross-node
// latency under appendfsync always"). No other message's order changes.
func (j *Jobs) needJobsFirst(from string, ms []Message) []Message {
	n := 0
	for _, m := range ms {
		if m.Type == MsgNeedJobs {
			n++
		}
	}
	if n == 0 {
		return ms
	}
	rest := make([]Message, 0, len(ms)-n)
	for _, m := range ms {
		if m.Type == MsgNeedJobs {
			j.Handle(from, m)
		} else {
			rest = append(rest, m)
		}
	}
	return rest
}

// handleNeedJobs records a NEEDJOBS, to be answered by the asker's giver
// goroutine (started if none runs).
func (j *Jobs) handleNeedJobs(from string, p []byte) error {
	name, count, err := decodeNeedJobs(p)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.closed {
		return nil
	}
	if j.givers.byAsker == nil {
		j.givers.byAsker = map[string]*giver{}
	}
	g := j.givers.byAsker[from]
	start := g == nil
	if start {
		g = &giver{want: map[string]int{}}
		j.givers.byAsker[from] = g
		j.givers.running.Add(1)
		go j.giveJobs(from, g)
	}
	if c, ok := g.want[name]; ok || len(g.want) < maxNeedJobsPending {
		g.want[name] = max(c, count)
	}
	return nil
}

// giveJobs answers one asker's NEEDJOBS until none is waiting: for each
// queue, while the bus link back is up, the jobs the broker gives go in
// one YOURJOBS.
func (j *Jobs) giveJobs(from string, g *giver) {
	defer j.givers.running.Done()
	for {
		j.mu.Lock()
		want := g.want
		if len(want) == 0 || j.closed {
			delete(j.givers.byAsker, from)
			j.mu.Unlock()
			return
		}
		g.want = map[string]int{}
		j.mu.Unlock()
		for name, count := range want {
			j.give(from, name, count)
		}
	}
}

// give answers one NEEDJOBS with the jobs the broker gives, unless the
// YOURJOBS could not go (no link back: take nothing).
func (j *Jobs) give(from, name string, count int) {
	tr := j.boundTr.Load()
	if tr == nil || !(*tr).Connected(from) {
		return
	}
	jobs, err := j.broker.RemoteNeedJobsFirst(from, name, count, j.firstGive(from))
	if err != nil {
		j.log.Warn("replication: NEEDJOBS", "from", from, "queue", name, "err", err)
		return
	}
	if len(jobs) == 0 {
		return
	}
	j.send(from, MsgYourJobs, encodeYourJobs(jobs))
	j.count(func(s *JobsStats) { s.YourJobsSent += int64(len(jobs)) })
}

// handleYourJobs queues the jobs another node moved here. The NEEDJOBS
// the import calls for (blocked clients took every job of it) go before
// its durability wait, not after: that write is not in the next round
// trip (queue.Broker.ImportYourJobs says why it is safe).
func (j *Jobs) handleYourJobs(from string, p []byte) error {
	jobs, err := decodeYourJobs(p)
	if err != nil {
		return err
	}
	j.count(func(s *JobsStats) { s.YourJobsReceived += int64(len(jobs)) })
	more, durable, err := j.broker.ImportYourJobs(from, jobs)
	if err == nil {
		j.NeedJobs(more)
		err = durable.Wait()
	}
	if err != nil {
		// Not queued here (or not durably): the sender's at-least-once
		// copies requeue after their RETRY.
		j.log.Warn("replication: YOURJOBS", "from", from, "jobs", len(jobs), "err", err)
	}
	return nil
}
