package replication

import "github.com/diskque/diskque/queue"

// A two-holder job's other holder deletes at SETACK.
//
// Every job federation moved (giver and asker) and every REPLICATE 2 job
// has two holders. Its collection used to cost the holder that did not
// see the ACKJOB two store records: the ack written at SETACK (durable
// before the GOTACK), then the delete at the collector's DELJOB. When the
// SETACK says two nodes may hold the job (mayhave 2), no collection of
// the job runs here, and the copy here is unacked and names exactly this
// node and the sender, the holder writes the delete instead of the ack
// (queue.CollectOp.Pair): one record. The messages do not change: the
// GOTACK still says "known" (a durable delete promises more than a
// durable ack: this node never delivers the job again) and the collector
// still sends its DELJOB, which finds nothing here and writes nothing (the
// gone set marks the ids it deleted so, and that DELJOB skips the store,
// whose lookup would only find each id gone: jobs_gone.go takePairs). So
// a peer of any version sees the protocol it knows, and nothing of the
// collector changes.
//
// What the acked record did between the SETACK and the DELJOB, and why
// the delete does it as well (Disque's rules: CLUSTER.md "Ack GC"):
//
//   - It kept the job from being queued again here: a deleted job is not
//     either, and the delete is durable before the GOTACK as the ack was.
//   - It answered another node's question about the job (a WILLQUEUE, a
//     QUEUED, a second SETACK) with "acked". Both node lists are these two
//     nodes, and each is a superset of the nodes its holder ever sent the
//     job to, so no third node holds a copy to ask; a repeated SETACK
//     from the collector (its GOTACK slow or lost) finds the id in the
//     gone set and is answered "not known" with no dummy ack left
//     (ackgc_batch.go), which counts as an answer all the same. (After a
//     restart here the set is empty: it leaves a dummy, which the
//     DELJOB clears — the path a crash after the delete took before.)
//   - It let this node start a collection of its own if the DELJOB did
//     not come (a held collection): that is for nodes the collector might
//     not know, and with lists of exactly these two there are none. The
//     collector's ack is durable and its collection resumes after a crash.
//   - It kept a late REPLJOB from bringing the job back? No, that is the
//     gone set (jobs_gone.go), which the deleted ids join here as a
//     DELJOB's do.
//
// The old path's DELJOB deleted the record just as finally one round trip
// later; this removes that round trip's window, nothing else.

// unpairCollected clears CollectOp.Pair of the SETACKs of jobs this node
// is collecting itself (an ACKJOB here too): those are acked, and the two
// collections end as they did.
func (j *Jobs) unpairCollected(ops []queue.CollectOp) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range ops {
		if ops[i].Pair != "" && j.acks.get(ops[i].ID) != nil {
			ops[i].Pair = ""
		}
	}
}

// unskipCollecting clears skip[k] (takePairs' answer for a DELJOB's ids)
// for the ids a collection of runs here: a client's ACKJOB (or FASTACK)
// here of a job already deleted at its pair's SETACK leaves a dummy ack,
// which the collector's DELJOB deletes (and endCollections then ends its
// collection) as before; skipping the store would end the collection and
// leave the dummy. (A DELJOB read before that ACKJOB's collection is
// recorded leaves the dummy to its collection, which deletes it.)
func (j *Jobs) unskipCollecting(ids []string, skip []bool) {
	if skip == nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	for k, id := range ids {
		if skip[k] && j.acks.get(id) != nil {
			skip[k] = false
		}
	}
}
