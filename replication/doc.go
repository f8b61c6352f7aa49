// Package replication is the cluster: membership and failure detection on
// hashicorp/memberlist, the cluster bus (one port, PortMux, carrying
// memberlist's gossip and the persistent job links of a Transport), and
// Disque's job protocol on top of it (the team's cluster contract).
//
// # Ports
//
// A node listens on its client port and on one bus port. The first byte of
// each connection to the bus port names its protocol (KindBus,
// KindGossipStream, KindGossipPacket); PortMux hands it to the handler for
// that byte and closes connections that name none.
//
// Addresses. What peers are told (the bus address in the gossiped metadata
// and memberlist's, so the one they dial) is the address the bus port
// listens on, unless MembershipConfig.AdvertiseBus names another: a node
// behind NAT, a port forward or a fault proxy (the daemon's
// cluster-announce-ip and cluster-announce-bus-port). Nothing checks a
// connection's remote address against it: the handshake identifies a job
// link's peer by id, a packet connection names its sender's advertised
// address, memberlist's messages their own. Every connection this node
// dials (job links, gossip packets and streams, dial_source.go) leaves
// from TCPConfig.SourceAddr / MembershipConfig.SourceAddr when set (the
// daemon's bind-source-addr, or its bind when that is one IP), so a peer,
// or a proxy in front of one (internal/faultproxy), can tell nodes apart
// by the source of their connections.
//
// # Membership
//
// Membership (membership.go) is memberlist (SWIM) over the bus port: a
// custom memberlist Transport (gossip_transport.go) carries its streams as
// KindGossipStream connections and its packets over one persistent
// KindGossipPacket connection per peer, queued (bounded, dropped when full,
// never blocking memberlist's loops) and batched by a writer goroutine per
// peer. memberlist's node name is the 40-hex node id, its address the bus
// address; the node metadata it gossips (at most 512 bytes) is
// "dq1 <id> <client ip:port> <bus ip:port> <flags>", flags "leaving" and
// "reset". With cluster-secret set, memberlist encrypts gossip with
// SHA-256("diskque cluster gossip key v1\x00" + secret): a node with another
// secret, or none, cannot join (MEET fails; the refusal is logged at WARN).
//
// Flags. "fail" is memberlist's dead: the node stays listed, Failed, until
// FORGET or RESET (as in Disque), and is cleared when the node is alive
// again (same id, possibly a new address). "fail?" is diskque's own:
// memberlist does not expose its suspect state, so Membership pings every
// live peer each probe interval and a peer that answered nothing (no ack,
// no packet) for 7/8 of the node timeout is Suspect. A node that leaves
// memberlist while answering (Reset) is forgotten, not failed.
//
// Timings, from cluster-node-timeout T (membership_meta.go, timingsFor):
// ProbeInterval T/8, ProbeTimeout T/16, GossipInterval T/16 (20-200 ms),
// SuspicionMult 8 and SuspicionMaxTimeoutMult 1 (dead T after the failed
// probe), PushPullInterval T/2 (1-30 s), RetransmitMult 6, TCPTimeout T
// (1-10 s), Lifeguard's awareness at most ×2. A killed node is "fail?"
// about 7/8 T after its death and "fail" within about 1.2 T everywhere,
// inside the contract's 2 T; like Disque's PFAIL, neither comes before
// about T, so a node down for a moment still counts as reachable. memberlist reads its Config without locks and its tickers
// keep the timings they started with, so SetNodeTimeout recreates the
// memberlist instance (same id, same transport) and rejoins every known
// peer; the nodes are kept meanwhile. Failed peers are re-joined every T
// (1-10 s), so two nodes that restarted while the other was down find each
// other.
//
// The nodes file (nodes.conf in the data directory, nodesfile.go): our id
// and every known peer's id, client and bus addresses and flags, written
// with durable.WriteFile (temp file, fsync, rename, fsync of the directory)
// when the membership changes (at once, at most every 20 ms: until the
// write a kill -9 loses the change), on SaveConfig and on Close.
// NewMembership rejoins its peers without MEET. It is a cache: a
// damaged file, or one of another id, is logged and ignored (and
// rewritten); it never stops a start.
//
// FORGET removes a node and refuses memberlist's alive messages about it
// (an AliveDelegate) for ForgetBan (60 s); after that gossip may bring it
// back. RESET leaves memberlist (peers forget the node at once), starts a
// new instance that knows nobody, optionally under a new id, and refuses
// gossip about the old nodes for 2 s (what was already sent), or until a
// MEET.
//
// MEET joins at once; when that fails (nobody answers yet, or a wrong
// secret) the MeetError says Retrying and the bus address is tried again in
// the background, every second or every probe interval if longer, until the
// node timeout (at least 1 s) has passed or a node at that address is known
// — Disque's handshake, so CLUSTER MEET can answer +OK as Disque's does. A
// MEET given up is logged at WARN. RESET drops the pending ones.
//
// Concurrency: every method is safe for concurrent use. Lock order:
// Membership.listMu, then memberlist's own locks (its delegates run under
// them), then Membership.mu; no memberlist call is made under mu, and
// OnChange is called from one goroutine with no lock held.
//
// # Transport
//
// Job messages travel over a Transport: per peer, one ordered link, best
// effort (a message for a peer that is down is dropped; the protocol
// retries what matters). The TCP transport and MemNetwork, the in-memory
// one used by in-process clusters, pass one test suite.
//
// # TCP links (TCPTransport)
//
// Each direction of a peer pair has its own connection: the node that
// sends dials (SetPeer starts the link at once, and redials after a
// failure with a jittered backoff from BackoffMin, 100 ms, doubling to
// BackoffMax, 3 s; a link in backoff dials at once when the peer dials
// us, since it is up: after a restart its peers' answers wait no backoff),
// the node that receives accepts, on the KindBus byte of its PortMux. The
// dialler only writes frames and the acceptor only reads them after the
// handshake; the dialler also reads, to learn at once that the acceptor
// went away (any byte or EOF ends the link). Connected(id) is true while
// the sending link to id is handshaken and not broken. An acceptor keeps
// one reader per peer: a new link from the same node closes the old one
// and waits for its reader, so the Handler sees one peer's messages from
// one goroutine, in order. With a BatchHandler
// (TCPConfig.BatchHandler; MemNetwork.JoinBatch) the reader hands over,
// with each frame, the frames already whole in its read buffer — at most
// 256, no more once 1 MiB of payload is taken, never waiting for more —
// so a receiver can apply a run of them as one; a malformed frame among
// them ends the link after the good ones before it are delivered.
//
// The daemon's BatchHandler is Jobs.HandleBatchQueued (jobs_inbox.go):
// it handles a batch's NEEDJOBS at once and queues the rest for the
// sender's own handler goroutine, which runs HandleBatch on them in the
// order the links read them (every batch queued meanwhile as one), so the
// reader goes on reading while a handler waits for a durable write, and
// a NEEDJOBS never waits for one. A sender's inbox holds at most 4
// batches; its reader waits while it is full. A handler whose inbox is
// empty waits up to 2 s for the next batch before it ends (no goroutine
// per batch under load); Close ends it at once.
//
// Send copies the message onto the link's queue (never waiting for the
// network: it may be called under the broker's locks); the link's writer
// takes the whole queue at once, frames it into a 64 KiB bufio.Writer and
// flushes only when the queue is empty, so pipelined messages share write
// system calls. Payloads over CompressAbove (256 bytes) are s2-compressed
// when that makes them smaller.
//
// # Frames
//
//	0       4       8      9       10
//	+-------+-------+------+-------+----------------------+
//	| len   | crc   | type | flags | body (len bytes)     |
//	+-------+-------+------+-------+----------------------+
//
// len (big-endian uint32) is the body's length on the wire, at most
// MaxFrame; crc the CRC-32C of len, type, flags and body; type a MsgType
// (never 0); flags bit 0 an s2 block body, whose decoded length must also
// be at most MaxFrame; other flag bits are zero. The reader allocates at
// most MaxFrame for a body (and as much again for a compressed body's
// decoding). A frame that breaks any of these rules, or ends early, closes
// its link (logged, rate-limited); nothing else is affected.
//
// # Handshake
//
// Before any frame (tcptransport_handshake.go has the bytes): the dialler
// sends "DQB1", whether it has a secret, its node id and a 32-byte nonce;
// the acceptor answers with its id, its nonce and, with a secret, an
// HMAC-SHA256 over both nonces and both ids; the dialler checks it, and
// that the acceptor is the node it meant to reach, then sends its own HMAC
// (another label); the acceptor checks it and says OK. Either side refuses
// with a reason the other logs: secret on one side only, a proof that does
// not match (wrong cluster-secret), the wrong node. Refusals are logged on
// both sides with the remote address; the dialler backs off. The whole
// handshake has a deadline (HandshakeTimeout, 5 s). Without a secret the
// bus is open and NewTCPTransport logs so. The secret authenticates the
// peer at connect time; frames are neither encrypted nor signed, so the bus
// belongs on a private network.
//
// # What is dropped, and when
//
// A message is for the connection it was queued on, or for the next one
// if none is up, and only for a short while: it never waits for a peer
// across a lost connection. A message that arrives long after it was sent
// can undo what the protocol did meanwhile (the Jepsen checker's
// DeliveredAfterGone, seed 41: a REPLJOB queued for a killed node reached
// it 9 s later, after its job was acked and collected elsewhere, and the
// job was delivered again). So, each counted in Stats.Dropped:
//
//   - Send returns ErrLinkFull when the link's queue holds QueueBytes
//     (16 MiB) of payloads: the peer is slow or refusing us.
//   - What is queued when a connection breaks is dropped, as is the batch
//     being written (that one lost, not counted); nothing is carried over
//     to the next connection.
//   - What is queued when a connection attempt fails (no listener, a
//     refused or failed handshake; not one given up for a new address) is
//     dropped: the peer is not there.
//   - When a connection comes up, what was queued more than
//     DownQueueTimeout (1 s) before is dropped. The queue is kept at all
//     only for the first dial after SetPeer and the redial after a peer
//     restarts (50–100 ms of backoff and a handshake, well under a second
//     even on a loaded machine); 1 s is short beside every retry that
//     covers a drop (below) and beside the chain that makes a late message
//     stale (a copy's job replicated elsewhere, delivered, acked and
//     collected, its SETACK and DELJOB reaching this very peer over other
//     links), and it bounds how late any message is.
//   - RemovePeer and Close drop what is queued for the peers concerned.
//   - A write that does not finish within WriteTimeout (15 s: the peer
//     stopped reading) breaks the link, so its queue is dropped.
//
// MemNetwork agrees (transport suite: QueuedWhileDownDropped,
// QueuedOnBrokenLinkDropped): a message Sent to a peer that is down or cut
// off is dropped at once, and one still queued when its peer's transport
// closes or the pair is cut is dropped, not delivered to the next
// transport or after the Heal.
//
// Why dropping each message kind is safe (what covers the loss):
//
//   - REPLJOB: Replicate resends it every 50 ms, and to another node once
//     late, while the job is short of copies; once it has enough, a copy
//     that never arrived is one fewer holder, as if that node had been
//     down. GOTJOB: the REPLJOB resend asks again while the job is short.
//   - SETACK, GOTACK: the collection resends SETACK with backoff (ackgc.go)
//     until every holder answered, a holder that restarted included.
//   - DELJOB: a NOREPL copy's DELJOB is retried (deljob_retry_test.go);
//     for an acked copy, every holder of an acked copy (or of the dummy
//     ack a SETACK left) collects it itself (heldAcked, ackgc.go: its own
//     SETACK rounds, then DELJOB), so the lost DELJOB leaves nothing;
//     FASTACK's deletion (FASTDEL) is resent until answered (jobs_fastack.go).
//   - WILLQUEUE, QUEUED, WORKING: best effort, as in Disque: a lost one
//     can only make two holders queue a copy (at-least-once allows it) or
//     leave a counter low.
//   - NEEDJOBS: asked again at its pace (federation.go). YOURJOBS: the
//     jobs stay active on the giver, which requeues an at-least-once job
//     after its RETRY; an at-most-once one is lost, never delivered twice
//     (jobs_federation.go).
//   - ENQUEUE: the copies requeue at their RETRY; a REPLICATE 1 RETRY 0
//     job waits for its TTL (jobs_external.go).
//   - PAUSE: a broadcast state is versioned and sent again to every node
//     that becomes reachable with its link up (jobs_pause.go), so a node
//     that was down or cut off catches up; last writer wins.
//
// # Concurrency
//
// Every Transport method is safe for concurrent use. TCPTransport.mu guards
// its maps and each link's mu its queue; neither is held across I/O, and no
// lock is held while the Handler runs. The Handler may call Send, but not
// Close (Close waits for the Handler to return).
//
// # Job protocol
//
// Jobs (jobs.go, ackgc.go, jobs_handle.go, jobs_queueing.go) is Disque's
// job protocol over a Transport and implements queue.Cluster for the
// broker. Its payloads are in codec.go and jobs_queueing_codec.go
// (versioned; decoding is bounded by the payload, and a malformed one is
// dropped, logged and counted, never a panic).
//
//   - Replicate: REPLJOB to Repl−1 reachable nodes (Peers, membership)
//     whose bus link is up (Transport.Connected: Disque's "no link, no
//     party"), chosen at random, one message per node carrying every job
//     of the broker's add batch it gets; each job's node list is the
//     origin and the nodes it was sent to. Jobs is a queue.SyncPlanner:
//     SyncNodes chooses those first nodes before the origin stores the
//     job, so it is stored (wait-repl) with them, and once they confirmed
//     one QUEUE record queues it (a node added later is recorded by a
//     node-list record as before). Every 50 ms while a job is
//     short, the REPLJOB again to the nodes that did not answer (so a node
//     whose link came back gets it), and one more node once the answers
//     are late: after max(50 ms, twice the average REPLJOB round trip),
//     at most 1 s. The start's NOREPL check counts reachable nodes, linked
//     or not. The first REPLJOBs of a job (those of its one Replicate
//     call's first send, before anyone but the origin knew its id; not a
//     resend, not a node added later) are marked first and
//     stamped with the incarnation of the receiver's store that its last
//     GOTJOB carried: the receiver then stores the copy without its index
//     lookup when its store can prove the id is not there
//     (storage.Batch.AddReplicaFirst; no incarnation known yet, or a
//     stale one after the receiver restarted: the usual lookup). An
//     ASYNC job's one REPLJOB to each node (SendAsync) is marked too, but
//     only with an incarnation learned before the job was stored (its
//     id may leave the origin from its commit on, before the REPLJOB:
//     the job is queued then): queue.PlanMarker's mark, read before the
//     round's commit, against the one each incarnation was learned at.
//     An origin whose jobs are all ASYNC gets no GOTJOB otherwise, so
//     SendAsync's REPLJOB to a node asks for one (no no-reply flag) every
//     second, and every 50 ms while the node's incarnation is unknown:
//     nothing waits for that GOTJOB, it only carries the incarnation. A
//     Transport delivers a message at most once, so a first REPLJOB is
//     never applied twice. A receiver stores the copy
//     (queue.Broker.ReplicaApply: idempotent, active, not queued; a copy
//     it has learns the nodes of a longer list) on the link, in order, and
//     a per-sender confirmer waits for their durability per its fsync
//     policy and answers GOTJOB for every REPLJOB applied meanwhile in one
//     message (the link goes on applying: the REPLJOBs share the AOF
//     write; Close waits for the confirmers). Consecutive REPLJOBs a link
//     read together (HandleBatch, run by the daemon's BatchHandler) are applied
//     as one ReplicaApply: one store commit, one entry for the confirmer;
//     a malformed one among them is dropped alone, a refused copy gets no
//     GOTJOB alone. No GOTJOB is sent for a copy before its durability
//     wait returned. While JobsConfig.RefuseCopies gives a reason (the
//     daemon's: leaving, or memory or disk short), every REPLJOB is
//     dropped unapplied and unanswered, as Disque drops them when leaving
//     or over its memory warning level: the origin's next round goes to
//     another node. At the job's deadline the
//     broker acks a job sent anywhere (its node list recorded) and Acked
//     collects it: SETACK until every node it was sent to confirmed, then
//     DELJOB, retried and resumed after a restart like any ack — one
//     DELJOB, lost, left a copy to be requeued, delivering a job its
//     client was told failed (Disque sends one DELJOB). An external
//     replication, stored nowhere here, still sends one DELJOB.
//   - ReplicateAsync: the same REPLJOB flagged no-reply, not waited for;
//     the origin queues the job once it has recorded where they went.
//     Jobs is also a queue.AsyncPlanner: AsyncNodes chooses an ASYNC job's
//     nodes before the origin stores it, queued with them in one commit,
//     and SendAsync sends the no-reply REPLJOBs after (marked first as
//     said under Replicate). The job may be consumed, acked and collected
//     through the other nodes while a REPLJOB waits on a stalled link: a
//     node remembers the ids it deleted as ended (a DELJOB received, its
//     own collection's deletes; at most 65,536, in memory) and drops a
//     late REPLJOB copy of one, which would be a live copy of an acked
//     job (jobs_gone.go).
//   - Acked: SETACK to every holder not yet confirmed (a dummy ack: to
//     every known node), again after 1 s doubling to 180 s (± 500 ms)
//     until all answered GOTACK; then DELJOB to all and the job is deleted
//     here. Each SETACK says how many nodes the sender knows may hold the
//     job (mayhave; 0 for a dummy ack). A receiver acks the job (a queued
//     copy leaves its queue; an unknown id leaves a dummy ack, but not for
//     a dummy ack's search, mayhave 0, which nobody would collect) and
//     answers GOTACK with whether it knew it — unless it knows more holders than
//     mayhave: then it collects the job itself, and answers only a dummy
//     ack's SETACK (as Disque). A dummy ack that reaches a node that knows
//     the job leaves the collection to it and goes; so does one that every
//     node answered without knowing the job (no copy is left anywhere).
//     Every node holding an acked copy collects it (Disque's job cron,
//     tryJobGC): a copy acked by another node's SETACK, and a dummy ack a
//     holder's SETACK (mayhave > 0) left, get a collection of their own
//     whose first round waits the retry period (1 s ± 500 ms, then the
//     backoff), so a DELJOB lost to a partition or a kill leaves the copy
//     only until then; a GOTACK "not known" counts as confirmed. A
//     DELJOB for a job being collected here ends that collection: with no
//     message if it has sent no round yet (the common case: one SETACK
//     and one DELJOB per holder in all), else with DELJOB to its targets
//     (clearing the dummy acks its SETACKs left). One small entry per
//     acked job held; a round sends each target its ids in messages of
//     at most 4096, SETACK and DELJOB alike. A run of SETACKs (GOTACKs,
//     DELJOBs) of one sender read together is handled as one message, cut
//     before an id seen again (jobs_handle_runs.go): one durable write and
//     one GOTACK for the run. A target no
//     longer known (forgotten) counts as confirmed at the next round.
//     A node that comes back is asked at once (ackgc_return.go): when a
//     peer is up again (reachable and linked) after it was not, every
//     collection that has run a round, still waits on its answer and is
//     not due within 1 s sends it alone its SETACK then, in messages of
//     at most 4096, at most once per 10 s per peer; the collections'
//     schedules (the other targets' backoff) do not change.
//     What one link read brings is handled together (ackgc_batch.go):
//     its SETACKs and DELJOBs, in their order, as one store batch
//     (queue.Broker.RemoteCollect), with one durability wait before the
//     one GOTACK that answers all its SETACKs; an ack whose job a DELJOB
//     of the same read deletes is not written (the delete, durable
//     before the GOTACK, promises the same). A SETACK that says two
//     nodes may hold the job (mayhave 2), for an unacked copy here that
//     names exactly this node and the sender, deletes the copy instead of
//     acking it (ackgc_pair.go: one record, not an ack and later a
//     delete; the GOTACK says known and the sender's DELJOB finds
//     nothing, so the messages are those of any version); the gone set
//     marks such ids, and the sender's DELJOB of a marked id skips the
//     store (jobs_gone.go takePairs: no lookup of a job known gone). Its GOTACKs are one: the
//     jobs they finish go in one DELJOB per holder and one delete here.
//     No delete of the collection is waited for, the collector's
//     (Broker.DeleteCollected) or a DELJOB's: each follows an ack durable
//     on that node (a crash that forgets the delete leaves an acked job,
//     whose collection resumes, never one queued again), or it is
//     FASTACK's or a timed-out replication's DELJOB, which can be lost on
//     the way as well.
//     Start resumes the collection of every acked job on disk, and
//     deletes the jobs a restart left in wait-repl (their ADDJOB was never
//     answered), each leaving a dummy ack collected from every node (an
//     at-most-once one: DELJOB to every node, its copies never requeue).
//     It finds them in the store's resume set (storage.Store.ScanResumable),
//     not by reading every job, so a restart's time before serving does not
//     grow with the backlog (1M copies: 0.7 ms against 7.9 s,
//     BenchmarkResumeBacklog).
//   - FastAcked (jobs_fastack.go): the deletion of the copies of jobs
//     FASTACK acked here (an acked placeholder, or a dummy ack for an id
//     unknown here) runs in the collections' table: FASTDEL (DELJOB
//     that wants an answer) to every holder (every node for an unknown
//     id) that has not answered, 1 s doubling to 180 s (± 500 ms); a
//     receiver deletes its copy as for DELJOB and, once durable, answers
//     GOTACK. A receiver the FASTDEL counts a holder of (mayhave > 0)
//     that does not have the job leaves a dummy ack instead, as for
//     SETACK (Broker.RemoteFastDel): its copy may still be on the way
//     (a REPLJOB queued on a link being redialled), and queued after the
//     deletion it would be delivered again; the dummy is collected as a
//     SETACK's (heldAcked). A dummy ack a FASTDEL finds (left by an
//     earlier one whose GOTACK was lost, or by a SETACK) stays, for the
//     same reason. Once all answered (or were forgotten) the placeholder is
//     deleted here, with no further message. One FASTDEL and one GOTACK
//     per holder when none is lost. A restart resumes the placeholder as
//     an ACKJOB's collection (an acked job on disk). A job already being
//     collected keeps its collection.
//   - Every collection (ACKJOB's, a holder's, FASTACK's) ends with no
//     message at its job's TTL (ackgc_expiry.go), when the broker deletes
//     the job: rounds to a node that stays down do not go on until a
//     restart.
//   - WillQueue, Queued, Working (jobs_queueing.go): WILLQUEUE, QUEUED
//     (each job with the counter to bump: none, nacks, additional
//     deliveries) and WORKING to each job's other holders (its nodes), at
//     most 4096 ids a message. A receiver hands them to the broker
//     (RemoteWillQueue, RemoteQueued, RemoteWorking), which decides (queue's
//     doc "About one queued copy"); Jobs answers a WILLQUEUE for a job
//     queued here with QUEUED to its holders, and any of the three for a
//     job acked here with SETACK to the sender, which joins the job's
//     collection.
//   - Paused (jobs_pause.go): PAUSE (the queue's state, a version — a
//     hybrid timestamp — and the origin's id) to every known node; a
//     receiver applies it (RemotePause) only if it is newer (version,
//     then origin id) than the one it keeps for the queue, and sends it
//     on to nobody. Every node keeps the newest broadcast state of each
//     queue a broadcast set (only those), in a file beside the store
//     (JobsConfig.PauseFile, written after the store has the state), and
//     sends them all to each node that becomes reachable with its link up
//     (each ack-retry tick: a node back from a failure, a link back, its
//     own start). Of two concurrent conflicting broadcasts every node
//     ends with the later by hybrid clock. A local PAUSE or a FLUSHALL
//     leaves the versions alone: the local state stands until
//     a newer broadcast. An unversioned PAUSE (an older node) is applied
//     as before. The book is bounded (jobs_pause_forget.go): a node that
//     holds a version tells its origin (PAUSEHAVE); an origin drops an
//     own unpaused entry a minute old once every known node holds it and
//     tells them to drop it too (PAUSEFORGET), and answers a copy of an
//     entry it forgot, sent again by a node that missed that, with
//     PAUSEFORGET again (one that finds a paused entry unpauses the queue:
//     only unpaused states are forgotten, so a newer one was): the book
//     holds the paused queues, and the unpaused ones until every known
//     node has heard.
//   - External replication (jobs_external.go, queue.ExternalCluster):
//     ReplicateExternal is Replicate with Repl *other* nodes to confirm
//     and the copies' node list without this node; once confirmed, ENQUEUE
//     (ids and the DELAY left, ms) to one confirming node at random.
//     ReplicateExternalAsync sends no-reply REPLJOBs and the ENQUEUE at
//     once, on the same ordered link as that node's copy. The receiver
//     queues a copy that is active and undelivered
//     (queue.Broker.RemoteEnqueue). A lost ENQUEUE leaves the copies to
//     requeue at their RETRY.
//   - Federation (jobs_federation.go, jobs_federation_codec.go,
//     queue.Cluster.NeedJobs): NEEDJOBS (queue, count) to the nodes the
//     broker names, or to every reachable node (leaving ones included:
//     that is how a leaving node is drained) for a broadcast; none from a
//     node that is leaving. A receiver answers them off the link's
//     goroutine, one goroutine per asker at a time (a NEEDJOBS repeated
//     meanwhile is answered once), so they wait neither for nor behind the
//     asker's SETACKs and DELJOBs, and only while its link back to the
//     asker is up: queue.Broker.RemoteNeedJobs takes the jobs
//     (durably) and one YOURJOBS carries them, with their counters and
//     node lists, to the asker, which queues them
//     (queue.Broker.ImportYourJobs) and sends at once the NEEDJOBS that
//     returns, before it waits for the import's durability. A NEEDJOBS
//     does not wait behind the messages read with it or before it
//     (needJobsFirst, HandleBatchQueued). A lost YOURJOBS leaves the giver's at-least-once copies to
//     requeue after their RETRY; an at-most-once job is then lost, never
//     delivered twice. A node tells each peer its store incarnation in a
//     GOTJOB of no ids when it sees the peer up and with its NEEDJOBS (at
//     most every second per peer); a giver that holds it marks first, in
//     a version-2 YOURJOBS, the jobs it minted after learning it and
//     never sent anywhere, which the asker stores without its index
//     lookup (jobs_federation_first.go, queue/federation_first.go).
//   - GLOBALQLEN (jobs_qlen.go, PeersQueueLen): QUEUELEN (a request id
//     and a queue name) to every other node that is reachable, leaving
//     ones included, with its link up; each answers QUEUELENANSWER (the
//     id and its QLEN, from the store's counter, on the link's
//     goroutine). The asker sums the answers until all came or the
//     timeout passed (the server's: 1 s), leaving out the nodes that did
//     not answer; an answer for no waiting ask, or from a node not asked,
//     is dropped. The types are 40 and 41, apart from the protocol's
//     others: an older node ignores them (and is left out).
//
// Jobs.mu is a leaf: it is never held across a broker call, a Send or a
// wait. The broker never calls Jobs under its own locks, and Jobs calls the
// broker only from Replicate's caller, the links' handlers and the
// ack-retry loop.
package replication
