// Package storage is diskque's job store: the AOF (package wal) as the only
// redo log, and a Pebble index derived from it. It speaks the job lifecycle —
// add, queue, deliver, requeue, nack, working, dequeue, ack, delete, pause —
// and answers the reads a broker needs: a job by id, a queue in order from a
// position, schedule events due before a time, and cursor scans of jobs and
// queues. Each operation is a Store method of its own (Add, Deliver, Ack, …:
// what a program or a test that embeds the store calls, example_test.go) and
// a Batch method, which the broker uses to apply many in one commit.
//
// # The log is the truth
//
// Every operation is one AOF record and its index writes, applied in the same
// order: under the store's lock the job is read, the transition checked, the
// record enqueued in the AOF (which fixes its LSN) and its writes put in the
// write buffer, which reaches Pebble as one batch that also sets
// meta/applied to the end LSN of the last record in it. Pebble
// runs without its own WAL, and it persists a memtable only after its
// FlushBegin hook has fsynced the AOF, so the index on disk is always a
// prefix of the operations whose records are durable. Open therefore replays
// exactly the records after meta/applied, through the same transition
// function that validated them live and the same write buffer: the index
// is a function of the log.
//
// Bodies stay in the AOF (value separation); the index holds the LSN of the
// ADD record that carries the body. Bodies of at least CompressThreshold
// bytes are s2-compressed when that saves space.
//
// Checkpoint flushes the index and removes every sealed AOF segment that
// ends before the flushed applied LSN and carries no live body — wherever it
// is in the log, so a job delayed for a month does not pin the churn written
// after it. The AOF then has gaps; Open tells the wal that gaps below the
// index's applied LSN are expected (wal.Options.Checkpoint) and checks that
// every segment the index says holds live bodies is present. Discard
// accounting (g/ keys: live bodies and bytes per segment, updated in the
// same batch as every add, ack, delete, expiry and move) says which segments
// are dead. RewriteSegment copies a sparse segment's live bodies forward as
// MOVE records, so a checkpoint can remove it (see segments.go; package gc
// decides when). A reader may hold a job read before its body moved and
// its segment went: Body and Bodies then read the job again and follow the
// body to where it is now (with one result per job: one unreadable body
// does not fail the others), so a collection never fails a read. A
// background loop checkpoints every CheckpointInterval and after
// CheckpointBytes of AOF, so a restart replays a short tail whatever the
// number of jobs. Close checkpoints, so a clean restart replays nothing,
// and checkpoints again while the segments a checkpoint removed still have
// the release of their deletion keys in the write buffer (a few rounds at
// most; Open releases what is left), so Check of a stopped directory finds
// no deletion waiting for a segment the AOF no longer has.
//
// # The AOF stays the truth
//
// Checkpoints remove segments from the middle of the AOF (above), so a
// replay of what it holds would miss their records. Before a segment goes,
// what a replay from the first segment needs of it is written forward
// (forward.go): a SNAP (a job's whole state) for a live job with history
// there, and a META (the node id, the highest ctime, the pause states); the
// collector's MOVE carries the job's whole state. What must stay keeps its
// segment (accounting.go): a body, a job's latest SNAP, a deletion whose
// job still has a creating record in an older segment (an h/ key) — until
// the collector copies it forward (MOVE, SNAP, TOMB; a deletion is taken
// over once). So the index can always be rebuilt from the AOF exactly
// (rebuild.go): Open does it when the index is missing, was a rebuild cut
// short, or is corrupt, and when asked (Options.Rebuild); a corrupt index
// is set aside as index.broken-<time>. Jobs remember their creating records
// (format 3) and the index its deletions still needed (format 4); of an
// older index, a rebuild is exact for what was written since.
//
// Open reads only the AOF tail the index has not applied. The sealed
// segments are read once after Open, in the background and at a bounded
// rate (verify.go: Options.VerifyRate), and damage found is logged and
// reported in Stats().Verify. Check verifies a directory offline: the AOF
// whole and the index against it (check.go).
//
// # Keyspace
//
// See keys.go: j/ jobs, q/ queue order (ctime, id; the value is the job,
// as j/ holds it, so deliveries read a queue's jobs in order), s/ schedule (due, kind,
// id), p/ pause states, c/ queued counts, g/ what each AOF segment still
// holds that is needed, h/ the deletions still needed per creator segment,
// r/ the resume set, n/ the interned node ids (format 6), m/ metadata (applied LSN, node id, format version, job count, and the highest
// ctime of any job added: Store.MaxCtime, so that ctimes never go back across a
// restart).
//
// Job values are format 3 (codec.go encodeJob): the id is left to the key
// and a node list that is just this store's node to a flag, which more than
// halves them (format 2), a job's creator LSNs follow where they are
// more than its body's record (format 3), and any other node list is
// node numbers (format 6, below). Open still reads format-1 and
// format-2 values (an index written before) and marks such an index format
// 4 (keys.go formatVersion), which older builds refuse.
//
// Live commits do not write Pebble directly: their index writes gather in a
// write buffer (write_buffer.go), an ordered map of each key's last write,
// given to Pebble as one batch in key order once it holds
// Options.WriteBufferSize bytes, at a checkpoint and at close. A key the
// buffer created and then deleted never reaches Pebble, so a job added,
// delivered and acked within one buffer costs Pebble nothing; what does
// reach it is one large sorted batch, whose memtable inserts are cheap.
// Deletions of keys Pebble holds that lie together within a queue's keys
// or the schedule (a consumed queue head and its jobs' TTL events) reach
// it as one range deletion per run, not a tombstone per key: the flush
// walks Pebble over each run and cuts it at every key there that stays —
// or, for a queue's keys that a head's refill read from Pebble since the
// last flush, cuts it at the keys that refill read and that stay, without
// a walk (read_spans.go: Pebble changes only at a flush, so every flush
// forgets what refills read) — and writes the ranges before the batch's
// other writes, so a range never deletes a key that stays or one the same
// flush writes (write_buffer.go deletionRuns; Stats.RangedDeletions).
// Whether a key is new to the index (so that deleting it needs no
// tombstone) is derived from the job's state before the write, and the
// buffer refuses a claim it can see is wrong; under invariants (race
// builds, or the diskque_invariants tag) it also checks Pebble before it
// drops a new key without a tombstone, and fails the store with
// ErrIndexInvariant rather than let an old value come back. The one write
// that skips the lookup, Batch.AddNew, makes the job's id itself, so it
// cannot be handed an id that exists. Reads see the buffer over Pebble,
// and a range deletion (FLUSHALL) hides the Pebble keys it covers from the
// moment it is buffered, not only once it is flushed. Job keys, random
// and only looked up in the hot path, and schedule keys, only scanned by
// the timer loader minutes apart and mostly dead within one buffer (a
// delivered job's retry event, an acked job's TTL event), sit beside the
// buffer's btree in one map by job id — one entry holds a job's job key
// and its schedule keys, so an operation's writes of them probe the map
// once — and are sorted when a flush, a JSCAN or the loader needs them in
// order (schedule keys from the order they were written, nearly sorted);
// the deletions of keys Pebble holds sit in a map of their own, as a scan
// only needs them to hide Pebble's keys. Job and queue keys
// keep the job they encode, so reads through the buffer do not decode it
// (and a new job skips the job cache: the buffer holds it until Pebble
// does).
//
// The job cache (cache.go) holds the state of jobs recently written, and of
// jobs recently read from Pebble where the read is known to be current, so
// that the reads of a consumed backlog job make no Pebble point Get: a
// broker's queue-head refill (Store.QueueHead) caches the jobs its scan
// read from the queue keys' values, so their delivery and then their ack
// resolve them there; Store.Job caches a job it read from Pebble if no
// buffer flush happened since its look found the job in neither the cache
// nor the buffer and the buffer still knows nothing of it (so no write of
// the job came in between), so the operation that follows a read by id (a
// clustered ACKJOB's) reads it once, not twice. Stats.IndexGets counts the
// Pebble point reads that are left. A GETJOB's deliveries of the jobs
// QueuedJobs just returned (Batch.DeliverQueued) do not look them up even
// there while the store has applied nothing since that read (WriteMark).
//
// The derived counters and the applied LSN go only with a buffer flush, so
// the index in Pebble is always the state after a prefix of the AOF, and
// recovery is unchanged: the buffer is lost in a crash and the replay of the
// AOF tail rebuilds it.
//
// Pebble charges its memtables to its block cache, so the store sizes that
// cache for two memtables beside Options.CacheSize.
//
// DiskWrites counts every byte the store gives its files — the AOF's
// records (by LSN, queued and written) and the index's files (counted as
// Pebble writes them, through the fence's files) — so that a caller that
// reads free disk space now and then (a server's min-free-disk) can tell
// how much of it the store has used since.
//
// # Cluster copies
//
// A job replicated from another node is an ordinary job here (SHOW, JSCAN,
// TTL expiry and a restart treat it as any other), added by
// Batch.AddReplica, which is idempotent: an id already known (the same
// REPLJOB again, or an acked job) makes it a no-op that succeeds, and its
// Pending waits for everything applied before it, so a copy is durable per
// the fsync policy (fsynced under wal.SyncAlways) before the node answers
// GOTJOB, whether this REPLJOB or an earlier one wrote it.
// Batch.AddReplicaFirst is AddReplica for the first REPLJOB of a job its
// origin sent this node, stamped with this store's incarnation
// (Store.ReplicaIncarnation, random per Open): it skips the Pebble lookup
// of the id (a miss, a third of a replica's CPU) when the stamp is this
// incarnation and the id is not in an exact in-memory set of the ids
// present that another kind of add left in this incarnation (dummy acks,
// federation imports, resends) or that were in the resume set at Open
// (replica_first.go says why that is enough, and bounds the set). A dummy ack
// (Batch.AckUnknown: state acked, no queue, no body, only a TTL) records an
// ack for an id never seen, so a late REPLJOB cannot resurrect the job. A
// NODES record (Batch.SetNodes) replaces a job's node list, in any state:
// the origin of a replicated job records the nodes it sent it to. A
// DELIVER record may carry a node list too (Batch.DeliverMoved: the
// delivery of a job federation moves to another node, which joins its
// nodes in the same record); its plain layout, the id and qtime alone, is
// what every AOF before it holds and still replays, and a build older
// than the layout refuses an AOF that holds the longer one (a malformed
// record), never applies it in part. Node
// ids are interned (format 6, nodenames.go): the index numbers every node
// id it has seen (n/ keys, never reused, rebuilt with the index from the
// log, whose records still spell ids out) and a value lists the numbers,
// so a job with three nodes has a value of about 47 bytes, against 167
// spelled out (storage BenchmarkReplicaBytes). SetNodeID gives an empty
// store a new node id (CLUSTER RESET HARD). Batch.Postpone is Working for
// another node's QUEUED or WORKING: the WORKING record then also carries the
// nacks and additional deliveries that node added to its copy, so every
// copy's counters agree. These records are format 5
// (keys.go formatVersion): an older build refuses the index once Open has
// marked it.
//
// The resume set (format 6, resume.go): an r/ key for every job that is
// acked or in wait-repl, written with the job's other keys, so that a
// clustered node's restart finds the jobs whose ack GC or end it must
// resume (Store.ScanResumable) without reading its backlog. An older
// index gets its set in the batch that marks it format 6 (one scan of its
// jobs, once); opened read-only it is not upgraded, and ScanResumable
// scans every job.
//
// # Invariants
//
//   - A job has a q/ key if and only if its state is queued, and the key's
//     value is the job exactly as its j/ key holds it (or empty, in an index
//     written before this was so: then it is simply not used).
//   - A job has an r/ key if and only if its state is acked or wait-repl
//     (in an index of format 6: Open writes the keys of an older one).
//   - Every node number a value lists is in the n/ table (flushed with
//     or before the value), and a number names one id for the index's
//     life.
//   - A job has one s/ key per time it is waiting for: AwakeTime (delay),
//     QueueTime (retry, only while active: a queued job is not requeued)
//     and Etime (ttl), and no others.
//   - The index on disk never reflects a record that is not durable in the
//     AOF; after an AOF failure — or an I/O error on the index's own files,
//     or a fatal error from Pebble (ErrIndexFailed) — the index is fenced
//     (Pebble's attempts to create files block until Close, so its retries
//     do not spin: fence.go) and the store refuses every operation with
//     ErrFailed until it is reopened. Pebble's errors are logged at WARN,
//     rate-limited (pebble_events.go); Pebble's Fatalf fails the store and
//     never ends the process. A corrupt index file (a block whose checksum
//     does not match) fails the store with ErrIndexCorrupt, naming the file
//     and its key range; the read that met it returns that error, the
//     others go on.
//   - An at-most-once job's delivery is fsynced before Deliver returns.
//   - A store that Open finds with less free space than
//     Options.ReadOnlyBelow (and an index to read) writes nothing: Pebble
//     opens read-only, the AOF's tail is replayed into the write buffer
//     alone, and the store is failed from the start with ErrNoSpace — it
//     reads, and refuses every write — until it is reopened once
//     RoomToWrite reports room. (On a full disk a writable Pebble fails at
//     Open writing its MANIFEST.)
//
// # Concurrency
//
// A Store is safe for concurrent use. Operations serialise only for the
// in-memory part of a commit and then wait for the AOF together, so
// concurrent operations share one write and, under wal.SyncAlways, one fsync.
// The fsync policy may change while the store runs (SetSync).
// Reads take the commit lock to see the write buffer: a point read holds it
// for the buffer and the job cache and reads Pebble after releasing it; a
// scan (queue order, schedule, jobs) holds it for the whole merge of the
// buffer with its Pebble iterator, which is why scans return bounded pages.
// Close may run while reads do (a server swapping a failed store for a
// reopened one): reads that reach Pebble or the AOF past the commit lock
// hold a shared lock that Close takes exclusively before it closes them, and
// every read and operation after Close returns ErrClosed (Stats and
// IndexMetrics, which return no error, return what is in memory and empty
// metrics).
//
// The commit lock is held for the index's I/O, not for durability: the
// Pebble reads and scan merges above, and a write-buffer flush (a memtable
// insert). It is never held across a wait for a memtable flush or a
// compaction: the store does the index's write back-pressure itself
// (backpressure.go), before it takes the commit lock, and Pebble's own
// write stalls are out of reach. While a flush runs, at most MemTableSize
// more (estimated memtable bytes) goes to Pebble, and while L0 has 36
// sublevels nothing does: writers (Commit, Apply, the checkpoint) wait —
// reads do not — and go on when the flush or a compaction ends, when the
// store fails (a flush that failed never ends: they return ErrFailed) or
// when Close begins. Memory stays at about two memtables plus one write
// buffer flush, as with Pebble's thresholds. Each such wait is a write stall:
// counted with its length (Stats.IndexStalls, IndexStallTime; INFO's
// index_write_stalls) and, from a second long, logged at WARN with its
// cause when it ends. The store owns the job state
// machine and every change to it goes through the commit lock, whoever
// applies it: package queue's broker for the lifecycle, the checkpoint and
// package gc's collector for the records that move bodies and carry state
// forward. LOCKS.md at the repository root lists every lock, the order, and
// what each is held across.
//
// # In memory
//
// Options{FS: vfs.NewMem()} keeps the whole store in memory: Disque's
// appendonly-no behaviour, and the way to embed a real store in tests.
package storage
