// Package replication is the cluster: membership and failure detection on
// hashicorp/memberlist, the cluster bus (one port, PortMux, carrying
// memberlist's gossip and the persistent job links of a Transport), and
// Disque's job protocol on top of it (the team's cluster contract, kept
// beside the repository).
//
// # Ports
//
// A node listens on its client port and on one bus port. The first byte of
// each connection to the bus port names its protocol (KindBus,
// KindGossipStream, KindGossipPacket); PortMux hands it to the handler for
// that byte and closes connections that name none.
//
// # Transport
//
// Job messages travel over a Transport: per peer, one ordered link, best
// effort (a message for a peer that is down is dropped; the protocol
// retries what matters). The TCP transport and MemNetwork, the in-memory
// one used by in-process clusters, pass one test suite.
//
// # Job protocol
//
// Jobs (jobs.go, ackgc.go, jobs_handle.go) is Disque's job protocol over a
// Transport and implements queue.Cluster for the broker. Its payloads are
// in codec.go (versioned; decoding is bounded by the payload, and a
// malformed one is dropped, logged and counted, never a panic).
//
//   - Replicate: REPLJOB to Repl−1 reachable nodes (Peers, membership)
//     chosen at random, one message per node carrying every job of the
//     broker's add batch it gets; each job's node list is the origin and
//     the nodes it was sent to. Every 50 ms while a job is short, one more
//     node, and the REPLJOB again to the nodes that did not answer (so a
//     node whose link came back gets it). A receiver stores the copy
//     (queue.Broker.ReplicaAdd: idempotent, active, not queued, durable
//     per its fsync policy) and answers GOTJOB. At the job's deadline,
//     DELJOB to every node it was sent to.
//   - ReplicateAsync: the same REPLJOB flagged no-reply, not waited for.
//   - Acked: SETACK to every holder not yet confirmed (a dummy ack: to
//     every known node), again after 1 s doubling to 180 s (± 500 ms)
//     until all answered GOTACK; then DELJOB to all and the job is deleted
//     here. A receiver acks the job (a queued copy leaves its queue; an
//     unknown id leaves a dummy ack) and answers GOTACK with whether it
//     knew it; a dummy ack that reaches a node that knows the job leaves
//     the collection to it and goes; one that nobody knows stays until its
//     TTL and is no longer retried. Start resumes the collection of every
//     acked job on disk, and deletes the jobs a restart left in wait-repl
//     (their ADDJOB was never answered; DELJOB to every node).
//   - FastAcked: DELJOB to the job's holders (every node for an id unknown
//     here), no confirmation.
//
// Jobs.mu is a leaf: it is never held across a broker call, a Send or a
// wait. The broker never calls Jobs under its own locks, and Jobs calls the
// broker only from Replicate's caller, the links' handlers and the
// ack-retry loop. Not built yet: WILLQUEUE/QUEUED, WORKING, NACK/ENQUEUE
// and PAUSE broadcasts, NEEDJOBS/YOURJOBS, external replication.
package replication
