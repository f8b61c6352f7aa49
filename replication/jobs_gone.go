package replication

import (
	"slices"
	"sync"
)

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
	mu sync.Mutex
	// set maps an id to 0, or to 1 + the index in pairPeers of the
	// collector whose SETACK deleted the copy here as a pair's
	// (ackgc_pair.go) and whose DELJOB of it has not come yet
	// (takePairs).
	set  map[string]uint8
	ring []string
	next int
	// pairPeers: the collectors the marks name (a node's few peers; past
	// 255 of them an id goes unmarked, and its DELJOB takes the store's
	// path).
	pairPeers []string
}

// add remembers ids, forgetting the oldest past maxGoneIDs.
func (g *goneIDs) add(ids []string) {
	g.addMarked(ids, 0)
}

// addPairs remembers ids as add does, each marked as deleted here at
// from's SETACK as a pair's copy, so that from's DELJOB of it needs no
// lookup (takePairs). An id remembered already keeps its mark.
func (g *goneIDs) addPairs(from string, ids []string) {
	if len(ids) == 0 {
		return
	}
	g.mu.Lock()
	mark := uint8(0)
	if k := slices.Index(g.pairPeers, from); k >= 0 {
		mark = uint8(k + 1)
	} else if len(g.pairPeers) < 255 {
		g.pairPeers = append(g.pairPeers, from)
		mark = uint8(len(g.pairPeers))
	}
	g.mu.Unlock()
	g.addMarked(ids, mark)
}

func (g *goneIDs) addMarked(ids []string, mark uint8) {
	if len(ids) == 0 {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.set == nil {
		g.set = map[string]uint8{}
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
		g.set[id] = mark
	}
}

// takePairs reports which of ids (a DELJOB from from) carry from's mark
// (addPairs), clearing those marks: nil when none does. Such a copy was
// deleted here, durably, at from's SETACK, and nothing can have brought
// it back while its id is in the set: a REPLJOB of it is dropped, a
// SETACK of it leaves no dummy ack (ackgc_batch.go), and no node can give
// it (its only other holder, from, acked it before its SETACK). Only a
// client's ACKJOB or FASTACK here can: it leaves a dummy ack, with a
// collection of its own, and the caller sends the DELJOBs of ids
// collected here to the store still (Jobs.unskipCollecting). Otherwise the DELJOB has nothing
// to delete here, and its store op would only look the id up to find it
// gone. A second DELJOB of the id finds no mark and goes to the store, as
// every DELJOB did before.
func (g *goneIDs) takePairs(from string, ids []string) []bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	k := slices.Index(g.pairPeers, from)
	if k < 0 || len(g.set) == 0 {
		return nil
	}
	mark := uint8(k + 1)
	var taken []bool
	for i, id := range ids {
		if m, ok := g.set[id]; ok && m == mark {
			if taken == nil {
				taken = make([]bool, len(ids))
			}
			taken[i] = true
			g.set[id] = 0
		}
	}
	return taken
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
