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
// DELJOB received (every DELJOB is the end of its job: a collection, a
// FASTACK, a timed-out external replication) or its own collection's
// deletes — and drops a REPLJOB copy of one of them (JobsStats.
// LateCopiesDropped; no GOTJOB: nothing waits for an ended job's).
// The memory is bounded (maxGoneIDs, the oldest forgotten first) and not
// kept across a restart, which loses nothing: a restart breaks the links,
// and what was queued on them is dropped, not delivered late.

// maxGoneIDs bounds goneIDs: about 100 bytes an id.
const maxGoneIDs = 1 << 16

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
