package replication

import "github.com/diskque/diskque/queue"

// A two-copy job's holder deletes at SETACK. Every job federation moved
// (the giver and the receiver) and every REPLICATE 2 job has two holders,
// and its collection cost the other holder an ack written and made
// durable, a GOTACK, then a DELJOB read and its delete: two store
// batches and three messages per batch of jobs. When the SETACK says two
// nodes may hold the job (mayhave 2) and this node's copy names exactly
// this node and the sender as its holders, both sides know the same two
// nodes, and there is no third copy for anyone to collect: this node
// deletes its copy (Broker.RemoteCollect with CollectOp.Pair), answers
// GOTACK gotAckDeleted once the delete is durable, and the collector
// finishes with no DELJOB to it.
//
// Why that is safe (Disque's rules: ack.c, CLUSTER.md "Ack GC"):
//
//   - Never delivered again: a copy goes at its ack (it never returns to a
//     queue: the delete is durable before the GOTACK, as the ack would be)
//     and the sender's copy is acked durably before its SETACK; nobody
//     else has one, since both node lists — each a superset of the nodes
//     its holder ever sent the job to (nodes-delivered, a federated
//     giver's delivery record included) — are these two nodes.
//   - A crash of this node before the delete is durable: no GOTACK, the
//     copy is as it was (as with an ack not yet durable), and the next
//     SETACK round asks again. After it, before the GOTACK: the next
//     round finds no job and leaves a dummy ack answered "not known",
//     which the collector's DELJOB then clears, as before. A crash of the
//     collector: its ack is durable; its collection resumes at restart,
//     the same way.
//   - A late REPLJOB (does the delete need a dummy ack?): no. The job's
//     creator is one of the two holders, or an external one (leaving)
//     that kept no copy. The first's REPLJOBs to this node precede its
//     SETACK on the same ordered link. The second's copies were all sent
//     before the job could be delivered (synchronous: the ADDJOB answered
//     first) or once (ASYNC: a node that never got its copy answers the
//     SETACK "not known", leaving the dummy ack that turns the late one
//     away, as before; only a known copy is deleted here). A duplicate
//     held up in a link's queue past the collection resurrects the job
//     with or without this: the old path's DELJOB, one round trip later,
//     deleted the acked record just as finally, with no dummy left.
//   - A collection of this job running here (an ACKJOB here too): the
//     SETACK acks as before (unpairCollected), so the two collections
//     end as they did. One that starts between that check and the delete
//     ends as a DELJOB ends it (endCollections).
//
// A node of an earlier version sends mayhave 2 too and gets
// gotAckDeleted, which it rejects as malformed (codec.go): its next round
// finds the job gone, answered "not known", and its DELJOB clears the
// dummy ack that round left.

// unpairCollected clears CollectOp.Pair of the SETACKs of jobs this node
// is collecting itself: those are acked and their collections left to
// end as before.
func (j *Jobs) unpairCollected(ops []queue.CollectOp) {
	j.mu.Lock()
	defer j.mu.Unlock()
	for i := range ops {
		if ops[i].Pair != "" && j.acks.get(ops[i].ID) != nil {
			ops[i].Pair = ""
		}
	}
}
