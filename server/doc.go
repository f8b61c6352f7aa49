// Package server speaks Disque's client protocol (RESP2 over TCP, inline
// commands too) on top of a queue.Broker. It parses arguments, formats
// replies and maps errors; no job logic lives here. The repository's
// COMPATIBILITY.md is the contract: reply shapes and error strings match
// Disque's word for word, because existing Disque clients parse them, and
// it lists where diskque differs and why.
//
// Commands are dispatched through one table (mux.go), one handler per
// command, files by family: cmd_job.go (ADDJOB, GETJOB, ACKJOB, …),
// cmd_queue.go (QLEN, QPEEK, PAUSE), cmd_admin.go (PING, INFO, DEBUG, …),
// cmd_cluster.go (CLUSTER, HELLO, INFO's Cluster section), cmd_globalqlen.go
// (GLOBALQLEN: QLEN here plus the other nodes' answers, through the
// Cluster's optional QueueLenAsker, waited for at most
// GlobalQueueLenTimeout with no lock held). Errors from the
// broker become RESP errors in one place, errors.go.
//
// Cluster (cmd_cluster.go): the server keeps no cluster state. The daemon
// gives it membership (a Cluster: *replication.Membership) and the job
// transport (a Bus: replication.Transport) with SetCluster; CLUSTER and
// HELLO ask them, with Disque's replies and error strings (cluster.c).
// Until SetCluster a server is a node alone: CLUSTER NODES and HELLO list
// itself, CLUSTER INFO counts no reachable node, CLUSTER MEET is refused,
// CLUSTER RESET flushes the jobs. HELLO priorities: 1 reachable, 5 no
// link, 10 suspected, 100 failed or leaving; a peer's link (also CLUSTER
// NODES' connected) is its bus link or, since the bus dials only when it
// has a message, gossip hearing from it. CLUSTER RESET HARD takes a new
// id in membership, and in the store too once the Cluster implements
// NodeIDResetter. CLUSTER MEET's Cluster call is a network join, made from
// the command's goroutine with no lock held; a join that failed but goes
// on in the background (an error with InBackground() true, Disque's
// handshake) answers +OK, as Disque's MEET does, and is logged.
//
// A pipeline of ADDJOBs read together is committed as one store batch:
// one AOF write and one index batch serve them all, and their replies go
// out in order once the batch is durable.
//
// Until SetBroker is called (the store is still replaying its AOF) every
// command but those marked whileLoading (PING, INFO, QUIT, HELLO, AUTH,
// TIME, CLIENT, COMMAND, …) gets -LOADING — after waiting up to
// Options.LoadingWait for the broker (the daemon waits 5 s: a replay after
// a crash takes milliseconds, and Disque's clients, its test suite among
// them, send their next command as soon as PING answers). PING waits too
// (and then answers PONG, loading or not), so that its answer means ready.
//
// Security: with Options.RequirePass set, a connection must AUTH before
// anything but AUTH and QUIT (-NOAUTH); passwords are compared in constant
// time. A server listening on a non-loopback address without a password
// refuses non-loopback clients (-DENIED), like Redis's protected mode.
// Limits: MaxClients connections, MaxJobSize bytes of ADDJOB body (checked
// before the job reaches the broker, also inside a pipeline), MinFreeDisk
// (-NOSPACE) and MaxMemory (-OOM), measured in the background (guard.go):
// they refuse only new jobs, and lift by themselves. Free disk is read every
// GuardInterval and, between readings, reduced by what the store wrote since
// (storage.DiskWrites); every ADDJOB (every pipelined batch) reserves its
// bytes against that estimate before its record is queued (diskguard.go),
// so no producer, however fast, writes past the reserve between readings.
// MaxMemory bounds the Go heap's live bytes plus the request bodies being
// read (INFO used_memory), not RSS; while over it the guard forces a
// collection (at most once a second, backing off to 16 s while that frees
// nothing), so -OOM lifts as soon as memory is freed. Pebble's block cache and memtables, allocated
// outside the Go heap and sized by configuration, are not counted.
// In a cluster the pressure makes ADDJOB replicate externally instead
// (pressure.go, queue/external.go): over 75 % of maxmemory or under twice
// min-free-disk when REPLICATE other nodes are reachable, and always over
// maxmemory, under min-free-disk or while LEAVING; -OOM and -NOSPACE are
// left for a node with no reachable peer. Over maxmemory the guard also
// evicts, every GuardInterval, the empty queues idle for 2 s (Disque's
// cron does so under memory pressure; INFO registered_queues counts the
// queues the broker knows, empty ones included, as Disque's does).
//
// Request bodies (reqmem.go): a bulk string of 64 KiB or more is read by
// the server itself into a buffer of its size, not by redcon (which would
// double its buffer and keep it), and is charged, from when its length is
// announced until its command has run, to one budget for all clients:
// Options.RequestBudget, by default maxmemory / 2 (512 MiB without
// maxmemory), never less than one body of max-job-size. A body that does not
// fit waits unread (TCP holds its client back) for Options.BodyWait (10 s),
// then is read and dropped and its command gets "-OOM request bodies being
// read use the memory allowed for them (N bytes), try later"; the connection
// goes on. INFO shows used_memory_requests, used_memory_requests_budget and
// request_bodies_waiting. Smaller arguments are buffered by redcon.
//
// Input is bounded before
// redcon buffers it (inputlimit.go): a request announcing a bulk string
// longer than max-job-size + 1 MiB, more than 1,048,576 arguments or an
// inline line over 64 KiB gets Redis's protocol error and the connection is
// closed; before AUTH (with a password set) the limits are Redis's 10
// arguments and 16 KiB. (Commands pipelined in the same read as AUTH are
// still held to the small limits.) On the way out, a pipeline's replies are
// written out once they hold 1 MiB of job bodies instead of at the end of
// the pipeline, so a consumer that asks for much and reads slowly blocks
// its own connection, with at most that much plus one reply buffered for
// it, and nobody else's. Otherwise a pipeline's replies go out in one
// write after its last command — a blocking GETJOB included when it finds
// a job at once: only a GETJOB that does block (queue.GetRequest.OnBlock)
// first writes the replies buffered before it and watches the socket for
// the client's hang-up (watch.go), so that a client gone while it waits is
// not served a job. One reply is bounded too: GETJOB delivers at most
// queue.MaxGetCount jobs and about queue.MaxGetBytes (a larger COUNT gets
// fewer), and a JSCAN reply lists at most jscanMaxItems jobs and, with
// REPLY all, about jscanMaxBytes — BUSYLOOP included, which then returns a
// cursor to go on from (cmd_scan.go); a first job always fits.
//
// A store that failed (an AOF write or fsync error) answers writes with
// -IOERR, one fixed text (errors.go; the store logs the error, with its
// paths, once), INFO shows aof_last_write_status:err and aof_state:failed
// (also for a store opened read-only), and it still serves reads, and
// GETJOB hands out durable at-least-once jobs without recording the
// delivery (queue: deliverWhileFailedLocked);
// the daemon reopens it once the disk works again (cmd/diskque-server
// node.go), and commands caught by that swap get -LOADING. SetBroker returns
// a drain that waits for every command still running on the broker it
// replaced, so the daemon closes a store only once nothing uses it.
//
// A handler that panics (a bug) is recovered at the command boundary
// (mux.go run): its stack is logged at ERROR, the command gets
// "-ERR internal error", and the connection and every other client carry
// on — unless the handler had already written part of its reply, which
// cannot be taken back: then that connection is closed.
//
// Configuration: the daemon owns its directives and config file and hands
// the server a Config (Options.Config). CONFIG GET glob lists matching
// directives as name, value pairs; CONFIG SET changes what can change at run
// time — the daemon applies requirepass, maxclients, max-job-size,
// min-free-disk, maxmemory (measured at once: the next ADDJOB sees it) and
// the slowlog settings through the Server's setters (SetRequirePass, …), and
// appendfsync to its store; appendonly is kept for the next start, and
// SetPersistence tells INFO Persistence both (aof_fsync,
// aof_enabled_after_restart); the rest are refused with "needs a restart";
// CONFIG REWRITE saves the config file;
// CONFIG RESETSTAT zeroes the server's own INFO Stats counters (the
// broker's job counters stay).
//
// QSCAN and JSCAN (cmd_scan.go) keep no state per scan: a cursor is a
// decimal position below 2^53 in the scan's order (queue-name hash, job
// id), so that clients that read it as a JavaScript number send it back
// intact; an item present for the whole scan is returned exactly once. An
// argument that is neither an option nor a cursor gets Disque's "ERR
// invalid cursor or option name", a second cursor "ERR syntax error".
//
// SLOWLOG GET [n] | LEN | RESET: execute times every command and keeps
// those slower than slowlog-log-slower-than (default 10ms; negative: off),
// at most slowlog-max-len (default 128), as Redis does: id, Unix time,
// duration in µs, the arguments (at most 32, each cut at 128 bytes), the
// client's address and name. A GETJOB that may block is not logged: waiting
// for jobs is not slowness.
//
// INFO has a Storage section of its own between Disque's Stats and CPU:
// AOF segments, aof_bytes, live bodies and bytes and their ratio,
// applied_lsn, the Pebble index's size, L0 files, memtable bytes and block
// cache hit rate, and the segment collector's gc_* counters (collections,
// segments rewritten and removed, bodies and bytes moved, bytes reclaimed).
// gc_skipped_for_space and gc_last_skip_reason tell the collections that
// min-free-disk kept from starting, cut or stopped (SetCollector gives the
// collector the disk's room above it), and BGREWRITEAOF answers -NOSPACE
// when a full collection would cross it.
// BGREWRITEAOF starts a full collection (package gc) and replies at once;
// Persistence's aof_rewrite_in_progress follows it. CPU stays last, as in Disque, because disqueue-node
// drops the last line of the last section (cmdInfo says how): it loses
// used_cpu_user_children, as it does with Disque, and no Storage field.
//
// MONITOR (monitor.go): the client gets a Redis-format line for every
// command the other clients run, AUTH's arguments redacted and admin
// commands left out, as Redis does. Lines are queued on a per-monitor buffer
// sent by the monitor's own goroutine; a monitor whose unsent output passes
// MonitorBufferLimit is disconnected, so a slow one stalls nobody. With no
// monitor, the command path pays one atomic load.
//
// Metrics: MetricsHandler serves Prometheus metrics (the daemon mounts it
// at /metrics on its opt-in metrics-addr): diskque_commands_processed_total
// and the diskque_command_duration_seconds histogram by command — labels
// are the command table's names, "unknown" for anything else, so clients
// cannot grow them — and figures read at scrape time: registered and
// queued jobs, the lengths of the 20 longest queues (diskque_queue_length,
// bounded for the same reason), AOF segments and bytes, bytes ever written
// and fsyncs, the index's size, the collector's segments removed, bytes
// reclaimed, bodies and bytes moved and collections, blocked and connected
// clients.
//
// A Server is safe for concurrent use; each connection is served by its own
// goroutine. Server.mu, client.mu, monMu and a monitor's mu are leaves
// (slowlog.mu takes client.mu); no server lock is held while a command
// runs on the broker. INFO, metrics and the disk guard read the store
// directly, through the broker reference that keeps it open. LOCKS.md at
// the repository root lists every lock and its order.
package server
