package replication

import (
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// Federation's first gives (queue/federation_first.go says what a giver
// vouches for and why the asker may then skip its index lookup).
//
//   - A node tells each peer its store's incarnation, in a GOTJOB of no
//     ids (version 2, which every build with incarnations reads), when
//     the peer is seen up (first, or again: the ack loop's AskReturning)
//     and with each NEEDJOBS it sends the peer, at most every
//     fedIncRefresh per peer. Told as the cluster forms, a giver holds
//     the mark before its producers add the jobs a drain then moves.
//     A peer whose store opens again loses the marks it held; it tells
//     this node its new incarnation when it sees it up, and a new
//     incarnation heard (replacing one known, or the first heard after
//     this node told its own) is answered with this node's at once
//     (gotJobs): a restart quicker than the ack loop's look at the
//     links, which sees the peer up all along, is not missed.
//     An origin's GOTJOBs always carry ids, so an empty one also says
//     the asker reads YOURJOBS version 2.
//   - A giver keeps, per asker, the incarnation of its latest empty
//     GOTJOB and the broker's ctime mark read just before it was
//     recorded, with the store it was read from; a GOTJOB of another
//     incarnation drops it (the asker restarted: a stamp of the old one
//     would be refused anyway). A NEEDJOBS answered while the mark is
//     held, by the same store, marks the jobs the broker can vouch for.
//
// The first NEEDJOBS to a node may be answered before its GOTJOB is
// handled (NEEDJOBS are taken first): those jobs take the lookup, as
// every job did before.

// fedIncRefresh is how often, at most, an asker tells a node its
// incarnation (ms).
const fedIncRefresh = 1000

// fedMark is what a giver learned of an asker (see above).
type fedMark struct {
	inc   uint64
	after uint64
	st    *storage.Store // the store the mark was read from
}

// tellIncarnation sends this node's store incarnation, in an empty
// GOTJOB, to each of nodes not told within fedIncRefresh, or to each of
// them if again (they heard it before a new open: see above).
func (j *Jobs) tellIncarnation(nodes []string, again bool) {
	if j.broker == nil {
		return
	}
	inc := j.broker.Store().ReplicaIncarnation()
	if inc == 0 {
		return
	}
	self := j.self()
	now := j.nowMillis()
	var tell []string
	j.mu.Lock()
	for _, n := range nodes {
		if n == self {
			continue
		}
		if at, ok := j.fedIncSent[n]; ok && !again && now-at < fedIncRefresh && now >= at {
			continue
		}
		if len(j.fedIncSent) >= 4*maxNeedJobsPending {
			clear(j.fedIncSent) // bounded by the nodes; forget and tell again
		}
		j.fedIncSent[n] = now
		tell = append(tell, n)
	}
	j.mu.Unlock()
	if len(tell) == 0 {
		return
	}
	msg := encodeGotJobs(nil, inc)
	for _, n := range tell {
		j.send(n, MsgGotJob, msg)
	}
}

// fedMarkFor is the mark an empty GOTJOB of incarnation gives (zero for
// any other GOTJOB), read before Jobs.mu is taken.
func (j *Jobs) fedMarkFor(ids []string, incarnation uint64) fedMark {
	if len(ids) != 0 || incarnation == 0 || j.broker == nil {
		return fedMark{}
	}
	return fedMark{inc: incarnation, after: j.broker.CtimeMark(), st: j.broker.Store()}
}

// learnFedMarkLocked records what a GOTJOB from an asker says (under
// j.mu): a new incarnation drops the mark held; an empty GOTJOB of it
// sets one, unless one of that incarnation and store is held already
// (the older mark is as true, and covers more jobs).
func (j *Jobs) learnFedMarkLocked(from string, incarnation uint64, m fedMark) {
	old, held := j.fedFirst[from]
	if held && old.inc != incarnation {
		delete(j.fedFirst, from)
		held = false
	}
	if m.inc == 0 || held && old.st == m.st {
		return
	}
	if len(j.fedFirst) >= 4*maxNeedJobsPending {
		return // bounded by the nodes: more would be a flood
	}
	j.fedFirst[from] = m
}

// firstGive is the mark a give to asker may use: none unless held and
// read from the store the broker has now.
func (j *Jobs) firstGive(asker string) queue.FirstGive {
	st := j.broker.Store()
	j.mu.Lock()
	m, ok := j.fedFirst[asker]
	j.mu.Unlock()
	if !ok || m.st != st {
		return queue.FirstGive{}
	}
	return queue.FirstGive{Incarnation: m.inc, After: m.after}
}
