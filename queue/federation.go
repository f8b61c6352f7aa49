package queue

import (
	"errors"
	"math"
	"slices"

	"github.com/diskque/diskque/storage"
)

// Federation (CLUSTER.md "Federation"): a GETJOB that finds a queue empty
// here asks other nodes for jobs of it (NEEDJOBS), and they move some of
// theirs here (YOURJOBS). This file is the asker's side: the pacing of
// NEEDJOBS and the import statistics, kept per queue in its queueState (so
// bounded by the queues known and dropped with the queue by the sweep).
// federation_remote.go has the incoming NEEDJOBS and YOURJOBS.
//
// Pacing is Disque's (queue.c, needJobsForQueue), with time an argument:
//   - a broadcast NEEDJOBS for 1 job to every reachable node at most every
//     2 s, doubling at each broadcast up to 30 s, back to 2 s when a node
//     not yet known as a source sends jobs;
//   - a NEEDJOBS for count jobs to the sources (nodes that sent jobs of the
//     queue in the last 5 s) at most every 25 ms, doubling up to 2 s, back
//     to 25 ms at every job imported; at once when a delivery or an import
//     leaves an importing queue empty (reachedZero);
//   - count is the import rate (jobs/s over the last 1-2 s, 0 after 5 s
//     without an import) divided among the sources, clamped 5..100.

// NEEDJOBS pacing and sizes (Disque's NEEDJOBS_* constants), in ms.
const (
	needJobsMinCount = 5
	needJobsMaxCount = 100
	needJobsBcastMin = 2000
	needJobsBcastMax = 30_000
	needJobsAdhocMin = 25
	needJobsAdhocMax = 2000
	// importRateWindow: no import for this long, and the rate is 0.
	importRateWindow = 5000
	// sourceTTL: a node that sent no jobs of the queue for this long is no
	// longer one of its sources (Disque: 5 s).
	sourceTTL = 5000
	// maxSources bounds a queue's sources (the nodes of the cluster, but a
	// bound the messages cannot move).
	maxSources = 128
	// needJobsScanEvery is how often Tick looks at the queues with blocked
	// clients (Disque: its clients' cron); pacing does the rest.
	needJobsScanEvery = 25
)

// NeedJobsRequest is one NEEDJOBS for Cluster.NeedJobs.
type NeedJobsRequest struct {
	Queue string
	Count int
	// Nodes are the nodes to ask; nil asks every reachable node (a
	// broadcast, for 1 job: it discovers sources).
	Nodes []string
}

// ErrLeaving: a GETJOB that would block on a node that is leaving the
// cluster (GetRequest.Leaving): consumers should go to another node.
var ErrLeaving = errors.New("queue: this node is leaving the cluster")

// federation is one queue's NEEDJOBS pacing and import statistics. Not
// safe for concurrent use: Broker.mu guards it.
type federation struct {
	bcastTime, adhocTime       int64 // last NEEDJOBS of each kind, Unix ms
	bcastAttempt, adhocAttempt int   // since the last reset (the doubling)
	// sources: node → when it last sent jobs of the queue (Unix ms).
	sources map[string]int64
	// The import rate's two windows: jobs imported since curTime, and in
	// the window before it, which began at prevTime.
	curTime, prevTime   int64
	curCount, prevCount int64
}

func newFederation(now int64) *federation {
	return &federation{curTime: now, prevTime: now}
}

// importRate is the jobs imported per second lately (Disque's
// getQueueImportRate): 0 once importRateWindow passed without an import.
func (f *federation) importRate(now int64) int64 {
	if now-f.curTime > importRateWindow {
		return 0
	}
	elapsed := max(now-f.prevTime, 50) // never overestimate from a short window
	return int64(math.Ceil(float64(f.prevCount+f.curCount) * 1000 / float64(elapsed)))
}

// imported records n jobs received from node (YOURJOBS).
func (f *federation) imported(node string, n int, now int64) {
	if now-f.curTime > 1000 {
		f.prevTime, f.prevCount = f.curTime, f.curCount
		f.curTime, f.curCount = now, 0
	}
	f.curCount += int64(n)
	if f.sources == nil {
		f.sources = map[string]int64{}
	}
	if _, known := f.sources[node]; !known {
		if len(f.sources) >= maxSources {
			f.validSources(now) // purge before refusing
		}
		if len(f.sources) < maxSources {
			f.bcastAttempt = 0 // a new source: broadcasts start over at 2 s
			f.sources[node] = now
		}
	} else {
		f.sources[node] = now
	}
	f.adhocAttempt = 0
}

// validSources drops the sources silent for sourceTTL and returns the
// others, sorted.
func (f *federation) validSources(now int64) []string {
	var out []string
	for n, last := range f.sources {
		if now-last > sourceTTL {
			delete(f.sources, n)
			continue
		}
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// plan returns the NEEDJOBS to send now for queue (Disque's
// needJobsForQueue): reachedZero says a delivery or an import just left
// the queue empty (only an importing queue asks then), otherwise clients
// wait on the empty queue.
func (f *federation) plan(queue string, now int64, reachedZero bool) []NeedJobsRequest {
	rate := f.importRate(now)
	if reachedZero && rate == 0 {
		return nil
	}
	sources := f.validSources(now)
	count := int64(needJobsMinCount)
	if len(sources) > 0 {
		count = rate / int64(len(sources))
	}
	count = min(max(count, needJobsMinCount), needJobsMaxCount)
	var out []NeedJobsRequest
	if now-f.bcastTime > int64(min(needJobsBcastMin<<min(f.bcastAttempt, 5), needJobsBcastMax)) {
		f.bcastTime = now
		f.bcastAttempt++
		out = append(out, NeedJobsRequest{Queue: queue, Count: 1})
	}
	if len(sources) > 0 && (reachedZero || now-f.adhocTime > int64(min(needJobsAdhocMin<<min(f.adhocAttempt, 7), needJobsAdhocMax))) {
		f.adhocTime = now
		f.adhocAttempt++
		out = append(out, NeedJobsRequest{Queue: queue, Count: int(count), Nodes: sources})
	}
	return out
}

// fedLocked returns q's federation state, creating it.
func (q *queueState) fedLocked(now int64) *federation {
	if q.fed == nil {
		q.fed = newFederation(now)
	}
	return q.fed
}

// mayImportLocked reports whether this node may ask for jobs of the queue:
// in a cluster, and the queue not paused (paused in, it takes no jobs;
// paused out, it would hold jobs it cannot give out).
func (b *Broker) mayImportLocked(name string) bool {
	return b.inCluster && b.st.PauseState(name) == storage.PauseNone
}

// needJobsAfterGetLocked plans the NEEDJOBS a GETJOB calls for (Disque's
// getjobCommand): for each of its queues empty now, clients waiting if it
// delivered nothing (the GETJOB is about to block, or gave up under
// NOHANG) and reached-zero otherwise. A leaving node asks nothing.
func (b *Broker) needJobsAfterGetLocked(names []string, delivered []Delivered, leaving bool, now int64) []NeedJobsRequest {
	if leaving || !b.inCluster {
		return nil
	}
	var out []NeedJobsRequest
	for i, name := range names {
		if slices.Contains(names[:i], name) || b.st.QueueLen(name) > 0 || !b.mayImportLocked(name) {
			continue
		}
		from := slices.ContainsFunc(delivered, func(d Delivered) bool { return d.Queue == name })
		out = append(out, b.queueLocked(name, now).fedLocked(now).plan(name, now, from)...)
	}
	return out
}

// noteWaitingLocked remembers that clients block on q, for Tick's NEEDJOBS
// (needJobsForWaitersLocked).
func (b *Broker) noteWaitingLocked(q *queueState) {
	if b.fedWaiting == nil {
		b.fedWaiting = map[*queueState]struct{}{}
	}
	b.fedWaiting[q] = struct{}{}
}

// needJobsForWaitersLocked plans, at most every needJobsScanEvery, the
// NEEDJOBS of the queues with blocked clients that are empty here (Disque's
// clientsCronSendNeedJobs): blocked GETJOBs keep asking while they wait,
// at the pace above. Queues nobody waits on any longer are forgotten here.
func (b *Broker) needJobsForWaitersLocked(now int64) []NeedJobsRequest {
	if len(b.fedWaiting) == 0 || now-b.fedScan < needJobsScanEvery {
		return nil
	}
	b.fedScan = now
	var out []NeedJobsRequest
	for q := range b.fedWaiting {
		live := slices.ContainsFunc(q.waiters, func(w *waiter) bool { return !w.done })
		if !live || b.queues[q.name] != q {
			delete(b.fedWaiting, q)
			continue
		}
		if !b.inCluster || q.head.Len() > 0 || b.st.QueueLen(q.name) > 0 || !b.mayImportLocked(q.name) {
			continue
		}
		out = append(out, q.fedLocked(now).plan(q.name, now, false)...)
	}
	return out
}

// sendNeedJobs hands the requests to the cluster; the caller holds no
// broker lock.
func (b *Broker) sendNeedJobs(reqs []NeedJobsRequest) {
	if len(reqs) > 0 {
		b.cluster.NeedJobs(reqs)
	}
}

// ImportRate is the queue's import rate (jobs/s received from other nodes
// lately: QSTAT import-rate, QSCAN IMPORTRATE); 0 for a queue unknown.
func (b *Broker) ImportRate(name string) int64 {
	now := b.nowMillis()
	b.mu.Lock()
	defer b.mu.Unlock()
	if q := b.queues[name]; q != nil && q.fed != nil {
		return q.fed.importRate(now)
	}
	return 0
}
