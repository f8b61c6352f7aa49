// Package queue is the broker core. Broker applies the job lifecycle (add,
// get, ack, nack, enqueue, dequeue, working, delete, expire, requeue,
// pause) through package storage, and keeps beside the store the little
// that must be in memory: the head of each queue, the blocked GETJOB
// clients and the timer wheel of the near future. Its methods speak jobs,
// not RESP; package server maps commands onto them.
//
// # Who owns what
//
// Package storage owns the job state: the state machine (which transitions
// are valid) and every job's state, queue position and schedule, in the
// index and the AOF. The broker owns the in-memory views derived from them
// — heads, waiters, wheel — and is the only caller that changes a job's
// state, position or events, always under Broker.mu, so the views agree
// with the index. Others reach the store directly, without Broker.mu: the
// store's own checkpoint and package gc's collector write records (MOVE,
// SNAP, TOMB, META) that change where a body is and what a replay needs,
// never a job's state, position or events, so the views stay true; reads
// that need no view (SHOW, QLEN, QPEEK, JSCAN, a pause state) and package
// server's INFO, metrics and disk guard read the store directly.
//
// # Memory holds only heads and the near future
//
//   - Head: per queue, up to HeadSize of its oldest entries (ctime, then id).
//     Every entry in memory sorts before every entry that is only on disk,
//     so the first entry of a non-empty head is the queue's oldest job. New
//     jobs join the head only while it holds the whole queue; a requeued job
//     keeps its ctime and slots back in order. A head that runs low is
//     refilled from the store's queue index (Store.QueueHead, which leaves
//     the jobs it read from Pebble in the store's job cache, so delivering
//     and acking them reads nothing more).
//   - Wheel: a hierarchical timer wheel with every schedule event (delay,
//     retry, ttl) that sorts at or before the loader's cursor; the rest stay
//     on disk. The loader moves the cursor up to now + Horizon, or less when
//     more than MaxTimers events would be in memory; an event that arrives
//     with a job when the wheel is full moves the cursor back before it
//     (it may then hold a few events after the cursor, which the loader's
//     Add of the same event replaces). A cursor moved back before events
//     already fired re-fires none: a fired event's op changed its job in
//     the same lock hold, so the schedule on disk no longer has it.
//   - Waiters: blocked GETJOB clients per queue, oldest first; each is
//     served one job by whoever queues one.
//
// So memory is O(queues × HeadSize + min(events inside the horizon,
// MaxTimers) + waiters), whatever the backlog on disk.
//
// # Consistency
//
// Every change is applied to the store (storage.Store.Apply) and to the
// heads, waiters and wheel under Broker.mu, so they never disagree with the
// index; the wait for durability (storage.Pending.Wait) happens after mu is
// released, and no result is returned before it — but for a GETJOB's
// deliveries of at-least-once jobs whose bodies were read already: their
// records are queued for the AOF and the jobs returned without waiting
// (finishReply; Disque logs no delivery at all). A crash before the record
// is written leaves such a job queued at the restart, to be delivered once
// more, which at-least-once allows; any later record of the job (ACKJOB,
// NACK, WORKING, a requeue) is applied after the delivery, so it follows it
// in the AOF and its wait covers the delivery's. An at-most-once job's
// delivery is fsynced before its GETJOB returns. A command that writes
// nothing because it found its jobs unknown or in the state it would give
// them (a second ACKJOB of a job whose first ACKJOB's fsync still runs)
// waits too, for everything applied before it (Store.AppliedPending): its
// reply reports that state, which must be durable; so does RemoteCollect's
// SETACK of an id not here that leaves no dummy ack (a search's GOTACK
// "not known"). The wheel holds a job's
// current events only (every change replaces them), so a timer event that
// fires is current. A batch with two ops of one job (a clustered requeue or
// ENQUEUE and its counter bump) sets the job's events once, from the last
// op, before the job is handed to a blocked GETJOB whose delivery sets them
// again. Delay and retry events are still checked against the
// job before they act, while a TTL event (whose due, Etime, never changes)
// deletes its job unread.
//
// Timers fire in chunks of a few hundred events, each under its own hold of
// Broker.mu, so a mass expiry (a million jobs due in the same millisecond)
// delays other commands by one chunk, not by the whole expiry; events not
// fired yet stay in the wheel meanwhile (Wheel.AdvanceLimit).
//
// GETJOB delivers in chunks the same way: at most getChunk jobs per hold
// of Broker.mu, sized from the last hold like Tick's, the round-robin
// over its queues carried from one chunk to the next; and one GETJOB
// delivers at most MaxGetCount jobs and stops before a job that would take
// its reply past MaxGetBytes (a first job is always taken), so neither its
// lock holds nor its reply grow with COUNT.
//
// GETJOB reads the bodies of the jobs it is about to deliver before it
// records their deliveries, under Broker.mu: a job whose body cannot be
// read (a damaged AOF) is left queued and undelivered — dropped from its
// head and passed over by refills, counted in Stats.JobsUnreadable and
// logged (rate-limited) — and the rest of the batch is delivered. Those are
// reads of durable records, almost always from the page cache (a cold one
// is one pread per run of neighbouring bodies), so the lock is seldom held
// for I/O. A body not yet durable
// (a job taken moments after its ADD) is read after the delivery's wait
// instead, outside the lock: reading it under the lock would wait for the
// AOF write (for its fsync, under appendfsync always). Every body read
// follows a body that the segment collector moved since the job was read
// (storage.Store.Bodies), so a collection never fails a reader.
//
// A store that failed (an AOF write or fsync error) takes no changes until
// it is reopened under a new broker: timers stand still, and GETJOB hands
// out only durable at-least-once jobs, without a record (so they are
// delivered again after the reopen, which at-least-once allows).
//
// # The cluster seam
//
// Options.Cluster (cluster.go; package replication implements it, a lone
// node's is the default and behaves as a node alone always did) is the
// broker's only way to other nodes, and the broker calls it only with no
// lock of its own held: not Broker.mu, not the add combiner's round. Its
// counts (KnownNodes, ReachablePeers) are read before an add round takes
// Broker.mu.
//
// ADDJOB is two-phase when REPLICATE n > 1 without ASYNC: the job is
// applied in state wait-repl (no queue, its TTL timer only), and once the
// combiner's round is over the first of its calls hands all the round's
// such jobs to Cluster.Replicate in one call (so pipelined ADDJOBs share
// REPLJOB messages as they share a group commit) — while the round's batch
// is still being written, so that the replicas' durable writes overlap
// this node's; the batch is waited for after (a crash before it is
// durable leaves copies of a job never answered, which requeue after
// RETRY: never an answered job lost). Then, under Broker.mu again, each
// confirmed job gets its nodes
// (storage's NODES record: wait-repl → active) and is queued, or left for
// its DELAY. With a cluster that is a SyncPlanner (replication's), the
// nodes its first REPLJOBs go to are chosen before the round takes
// Broker.mu and the job is stored in wait-repl with them: confirmed by
// those, it is queued by its QUEUE record alone (no NODES). One not
// confirmed by min(ms-timeout, TTL) fails its ADDJOB with ErrReplTimeout
// and is deleted here — or, if a copy was sent, acked here with its node
// list and handed to Cluster.Acked, whose collection (retried, resumed
// after a restart) deletes every copy and then it: a copy left alive
// would be requeued, a failed job delivered. Fewer than n−1 reachable
// peers at the start is ErrNoRepl, and nothing is stored. An ASYNC job's node list must be stored before a
// consumer can see it: queued while its list said no other node held it,
// it could be taken and acked and its copies never collected. With a
// cluster that is an AsyncPlanner (replication's), its nodes are chosen
// before the round takes Broker.mu, the job is stored queued (or delayed)
// with them in the round's one commit, and its copies are sent (SendAsync)
// once the round is applied, not waited for; a planner that is a
// PlanMarker gets with each job (Replication.Plan) the mark it gave
// after the plan and before that commit. Otherwise it is applied in
// wait-repl, its copies are sent after the batch is durable
// (ReplicateAsync), and it is queued with the nodes they went to (NODES),
// then answered.
//
// External replication (external.go): a request with AddRequest.External
// (the server sets it when the node is leaving or short of memory or disk)
// keeps nothing in this node's store, not even a wait-repl entry. Its id
// is made here (storage.NewJobID, this node's prefix) and the job handed,
// outside every broker lock, to the cluster's ExternalCluster: REPLICATE
// other nodes must confirm a copy, and one of them queues it (ENQUEUE,
// arriving through RemoteEnqueue); a timeout is ErrReplTimeout as usual.
// A required one that too few peers can take fails (a *NoReplError, an
// ErrNoRepl); a preferred one takes the usual path. PAUSE-in and MAXLEN are
// checked against this node's queue, as in Disque. A crash before the reply
// may leave copies on the nodes reached, which requeue after RETRY: never
// an acknowledged job lost, at worst an unacknowledged one delivered.
//
// ADDJOB … QUEUE-RANDOMLY (ExternalQueueRandomly, set by the server from
// the option) takes the same path on purpose: the job is to be queued on
// another node that holds a copy, so none is kept here and ENQUEUE goes to
// one of the REPLICATE other nodes at random; it is required (too few
// peers: a *NoReplError saying QUEUE-RANDOMLY), except on a node alone
// (KnownNodes 1), which queues it itself. A pressure the server measured
// (leaving, memory, disk) outranks it. Its default REPLICATE is
// DefaultReplicateElsewhere, min(3, other nodes known).
//
// Memory pressure (external_memory.go): SweepIdleQueues forgets empty
// idle queues at once (the server calls it over maxmemory, with a 2 s
// idle time instead of the minute of the timers' sweep); RegisteredQueues
// counts the queues with jobs and the empty ones still known; FlushAll
// forgets every queue nobody waits on.
//
// In a cluster ACKJOB acks (instead of deleting) a job other nodes may
// hold and hands it to Cluster.Acked, which collects the copies and then
// deletes it here; an unknown at-least-once id leaves a dummy ack.
// FASTACK deletes a job only this node holds; one held elsewhere it acks
// (a placeholder: a late REPLJOB does not bring it back) and an unknown
// at-least-once id leaves a dummy ack, and both go to Cluster.FastAcked,
// which deletes the copies (DELJOB retried until each holder answered)
// and then the placeholder; a restart resumes it as an ACKJOB's
// collection. The messages of
// other nodes arrive through ReplicaAdd (REPLJOB: an idempotent, durable
// copy, active and not queued; ReplicaApply is the same with the wait for
// durability left to the caller), RemoteSetAck (SETACK: an unknown id
// leaves a dummy ack; RemoteSetAckKnown, for a dummy ack's search, leaves
// nothing), RemoteDelJob (DELJOB) and RemoteFastDel (FASTDEL: a DELJOB
// that leaves a dummy ack for an unknown at-least-once id the sender
// counts this node a holder of, as SETACK does, and keeps a dummy ack it
// finds) (remote.go); RemoteCollect applies
// the SETACKs and DELJOBs of one link read as one batch, in order, the
// durability left to the caller (an ack a later DELJOB of the batch
// deletes is not written; a SETACK op with Pair whose copy here names
// only this node and Pair is a delete instead of an ack), and
// DeleteCollected deletes jobs whose
// collection ended without waiting: their ack here is durable already
// (remote_collect.go).
//
// About one queued copy (remote_queueing.go). Every holder of a job runs
// its own requeue timer (RETRY ± 500 ms). While other nodes are known
// (Clustered, read by Tick outside the lock), each retry event in the wheel
// has a wheel-only companion, eventWillQueue, WillQueueAdvance (500 ms)
// earlier: if the job is then still active, due at that retry and held
// elsewhere (its nodes name another node), Tick hands it to
// Cluster.WillQueue. A requeue of such a job is handed to Cluster.Queued
// with BumpDeliveries, and counts an additional delivery here even on a
// copy never delivered here (Batch.Postpone in the same batch), as every
// receiver does; NACK hands its jobs over with BumpNacks, ENQUEUE with
// BumpDeliveries (counted here too) unless it is a delayed job's first
// queueing. WORKING hands its job to Cluster.Working. Tick collects these
// under Broker.mu and sends them once the chunk is durable and the lock
// released; the commands send after their batch. Incoming: RemoteWillQueue
// adds the sender to the job's nodes and returns the jobs queued here (the
// caller answers QUEUED) and those acked (it answers SETACK);
// RemoteQueued postpones each copy's requeue by its RETRY, bumps the
// counter, and dequeues a queued copy unless this node wins TieBreak
// against the sender; RemoteWorking postpones and always dequeues;
// RemotePause applies a broadcast pause state (BroadcastPause sends one,
// PAUSE … BCAST; the cluster versions them and sends them again to a node
// that was unreachable, so every node converges on the last one). None of them calls the cluster. So after a RETRY with no
// ack about one copy is queued: the node that queues first makes the others
// postpone, simultaneous ones are settled by the tie-break (the greatest
// keeps its copy, and it is never dequeued by a smaller one, so one stays),
// and a holder that dies leaves the others' timers running.
//
// Federation (federation.go, federation_remote.go). A GETJOB that finds
// one of its queues empty here plans NEEDJOBS for it under Broker.mu (the
// queue's federation state: Disque's pacing, its sources and import rate,
// kept in its queueState, so bounded by the queues known and dropped with
// the queue by the sweep; time is an argument) and hands them to
// Cluster.NeedJobs once the lock is released; so do Tick, at most every
// 25 ms, for the queues blocked clients wait on (recorded when they
// block), and RemoteYourJobs, which returns them, when the jobs it queued
// were all taken by waiting clients at once (ImportYourJobs returns them
// before the import's durability wait, which it leaves to the caller). A queue paused in or out
// asks nothing, and a GETJOB with GetRequest.Leaving asks nothing and
// fails with ErrLeaving where it would block. RemoteNeedJobs is the
// giver: from a queue non-empty, not paused out and not importing (its
// import rate 0), it delivers up to the count asked (at most half a queue
// shorter than twice the count, at least 1) in one hold, as GETJOB
// would — so a RETRY 0 job's delivery is fsynced — not counted as
// deliveries, adds the asker to each at-least-once job's nodes in the
// delivery's own record (storage.Batch.DeliverMoved: one record a job),
// waits for durability, reads the bodies not yet durable,
// then deletes the at-most-once ones (already unrequeueable: delivered)
// and returns them all; an at-least-once one stays active here with its
// requeue timer. RemoteNeedJobsFirst marks First the jobs this node
// minted after the FirstGive mark and never sent anywhere, which
// ImportYourJobs then adds with storage.Batch.AddReplicaFirst (no index
// lookup when the store can prove the id new: federation_first.go). RemoteYourJobs queues what arrives, in one batch and
// one durability wait: a new job is added (active, its ctime, TTL,
// RETRY, counters and nodes, this node among them; an at-most-once one
// with this node alone) and queued; a known active at-least-once copy
// learns the nodes and counters and is queued; anything else (queued,
// acked, at-most-once already here) is left as it is, so an at-most-once
// job is queued once. A consumer is served an imported job only after
// its add, which precedes its delivery in the log, is durable.
//
// # Time
//
// Options.Now is the only clock. Run reads it to drive the timers; Tick
// takes time as an argument so tests control it. A job's ctime (its place
// in its queue) comes from it too, but never goes back: New seeds the ctime
// clock with the highest ctime the store has seen (Store.MaxCtime), so jobs
// added after a restart under a clock stepped back still sort after the
// backlog.
//
// # Concurrency
//
// Broker's methods are safe for concurrent use. Lock order: the add
// combiner's round, then Broker.mu, then the store's locks (LOCKS.md at the
// repository root has them all). Broker.mu is held for what the store does
// under its own lock — index reads, and a write-buffer flush that may wait
// in a Pebble write stall — and for the body reads above, never for a
// durability wait. Head and Wheel are not safe for concurrent use;
// the broker guards them. Concurrent AddJobs calls are merged: the calls
// waiting while one round is applied become the next round, one store batch
// of up to 1024 jobs (add.go, addCombiner), and a call that finds no round
// running yields once (runtime.Gosched) before it leads one, so the adds
// other connections are about to make join it; a call returns only once its own
// jobs are durable, so the merge changes batching, never what a client is
// told.
package queue
