package replication

import "sync"

// Ended jobs a late REPLJOB must not bring back.
//
// An ASYNC job is queued at its origin's commit, before its REPLJOBs go,
// and a REPLJOB may wait on a stalled link (a partition the TCP
// connection survives) while the job is consumed, acked and collected
// through the other nodes: a SETACK from another holder leaves a dummy
// ack here, this node answers, and the collector's DELJOB deletes it.
// The REPLJOB that arrives then found nothing and stored a live copy of
// the acked job, requeued at its RETRY and delivered again (found by
// review, TestLateAsyncReplJobAfterCollection). A synchronous job cannot
// meet this: it is queued only once its REPLJOBs were confirmed.
//
// So a node remembers the ids it deleted because their job ended — a
// DELJOB or FASTDEL received (every one is the end of its job: a
// collection, a FASTACK, a timed-out external replication), its own
// collection's deletes, a FASTACK's here — and drops a REPLJOB copy of one
// of them (JobsStats.
// LateCopiesDropped; no GOTJOB: nothing waits for an ended job's). The
// same set answers FASTDEL's resends: an id in it needs no dummy ack
// (jobs_fastack.go delJobs), and so are a SETACK's for a job ended here
// (a pair's delete at SETACK whose SETACK came again: ackgc_pair.go,
// ackgc_batch.go), which leaves no dummy ack either.
// The memory is bounded (maxGoneIDs, the oldest forgotten first) and not
// kept across a restart, which loses nothing: what a peer queued for this
// node while it restarted is either dropped or carried by the redial, in
// the order it was sent and at most DownQueueTimeout late (doc.go), so a
// copy sent before its job ended still arrives before the message from
// the same peer that ends it; and the node that ended a job sends no copy
// of it afterwards.

// maxGoneIDs bounds goneIDs: about 100 bytes an id, 13 MB in all. An id
// forgotten costs nothing while its copies are sent at once; a FASTDEL
// resent for it leaves a dummy ack, collected as any.
const maxGoneIDs = 1 << 17

// goneIDs is the set of ended ids, oldest first in ring (its own lock,
// never taken with Jobs.mu held).
type goneIDs struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring []string
	next int
}

// add remembers ids, forgetting the oldest past maxGoneIDs.
func (g *goneIDs) add(ids []string) {
	if len(ids) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.set == nil {
		g.set = map[string]struct{}{}
	}
	for _, id := range ids {
		if _, ok := g.set[id]; ok {
			continue
		}
		if len(g.ring) < maxGoneIDs {
			g.ring = append(g.ring, id)
		} else {
			delete(g.set, g.ring[g.next])
			g.ring[g.next] = id
			g.next = (g.next + 1) % maxGoneIDs
		}
		g.set[id] = struct{}{}
	}
}

// has reports whether id is remembered as ended.
func (g *goneIDs) has(id string) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	_, ok := g.set[id]
	return ok
}

// dropGone returns jobs and heads without the copies of ended ids, and
// how many it dropped.
func (g *goneIDs) dropGone(jobs []replJob, heads []replHeader) ([]replJob, []replHeader, int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if len(g.set) == 0 {
		return jobs, heads, 0
	}
	var kj []replJob
	var kh []replHeader
	dropped := 0
	for i, r := range jobs {
		if _, ok := g.set[r.Job.ID]; ok {
			if dropped == 0 {
				kj, kh = append(kj, jobs[:i]...), append(kh, heads[:i]...)
			}
			dropped++
			continue
		}
		if dropped > 0 {
			kj, kh = append(kj, r), append(kh, heads[i])
		}
	}
	if dropped == 0 {
		return jobs, heads, 0
	}
	return kj, kh, dropped
}
