// Package wal is diskque's append-only file (AOF): a segmented, checksummed,
// group-committed log of job state changes. It is the only redo log of the
// broker; the Pebble index in package storage is rebuilt from it.
//
// # Addresses
//
// A record's address is its LSN: the byte offset of its frame in the logical
// log, the concatenation of every segment's records. LSNs therefore grow with
// every append, and one number both orders records and locates them: the
// segment holding LSN x is the last one whose first LSN is <= x, and the
// record's frame starts at file offset header size + (x - first LSN). The
// end of a record is the LSN of the next one, or of the sync mark before it.
//
// # Segment files
//
// Segments are named by their first LSN in 16 lower-case hex digits, so that
// names sort lexically in log order:
//
//	0000000000000000.wal   LSNs [0, 67108873)
//	0000000004000009.wal   LSNs [67108873, ...)
//
// Each file starts with a 24-byte header, then whole record frames:
//
//	+----------------+----------------+----------------+
//	| magic (8)      | first LSN (8)  | salt (8)       |   "dqwal\x00\x00\x02", big-endian
//	+----------------+----------------+----------------+
//	| frame | frame | frame | ...                      |
//
// The salt is random per segment. A new segment is made crash-safely: the
// header is written to NAME.tmp, fsynced, renamed to NAME, and the directory
// is fsynced. Stale .tmp files are removed once Open has decided to open
// the log (a refused Open leaves them). Before
// a new segment is made the previous one is fsynced, so only the last
// segment can ever hold unsynced (and so possibly torn) data.
//
// # Record frames
//
//	+-------------+------------+---------+--------------+--------------------+
//	| hdr crc (4) | length (4) | type(1) | body crc (4) | payload (length)   |
//	+-------------+------------+---------+--------------+--------------------+
//
// The header's integers are little-endian; the checksums are CRC-32C. The body crc covers
// the payload; the header crc covers the segment's salt, the frame's LSN
// (neither stored in the frame) and the 9 bytes after it. So a frame is
// valid only at its own place in its own segment: after damage, recovery
// can search the bytes that follow for the next valid frame (every offset,
// the cheap header check first), and no job body, nor a frame of another
// log, can pose as one. Type 0 is reserved (zeroed bytes never decode) and
// type 255 (MarkType) is the log's own.
//
// # Sync marks
//
// After every fsync, the next records appended are preceded by a mark: a
// type-255 frame whose 8-byte payload (big-endian) is the LSN the fsync made
// durable — unless those records roll the log (the roll fsyncs the segment
// the mark would end). The everysec loop writes a mark of its own after its
// fsync when no record follows to carry one, and so does Close after its
// final fsync. No reader returns marks (Replay, ScanSegment and Verify skip
// them; Read and ReadEach refuse them with ErrCorrupt, as they do the filler
// frames of a repair). They cost 21 bytes per fsync.
//
// # Recovery
//
// Open verifies that segments are contiguous — except for gaps that end at or
// before Options.Checkpoint: segments the owner removed with RemoveSegments
// because nothing in them is needed (storage removes a segment whose bodies
// are all dead once its checkpoint has passed it) — and reads the last
// segment from the checkpoint (or its start) to its end. Open does not read
// segments before the last, nor the checkpointed part of the last: recovery
// cost follows the replayed tail, not the size of the log (Verify reads
// every record; storage verifies sealed segments in the background). Only
// when the tail is damaged does Open read, and then rewrite, the whole last
// segment.
//
// Only what was written after the last completed fsync can be torn by a
// crash — in any pattern, since pages reach the disk out of order — and
// everything before it is durable, so damage there is corruption. At the
// first frame of the last segment that does not decode, Open searches on
// for valid frames to the end of the file, and takes the highest durable
// LSN that the checkpoint or any valid sync mark states:
//
//   - damage at or past it is a torn tail: the segment is cut there, its
//     original kept as NAME.broken, with a warning saying how much was cut;
//   - damage below it is corruption: Open refuses with a DamageError naming
//     the segment, the offset, the durable end and the valid records that
//     follow, and changes nothing on disk.
//
// A mark is written after the fsync it states, and is itself durable only
// with the next one: damage in what the last fsync before a crash made
// durable — whose mark may be lost with the crash — is taken for a torn
// tail. That window is one group commit under SyncAlways, and under
// SyncEverySec what was written between the last two background fsyncs.
// Damage found where Open starts reading (the checkpoint) makes it read the
// segment from its start, so that damage that began before the checkpoint is
// reported where it begins, and a checkpoint that a repair's filler covers
// is no damage. A last segment that ends before the
// checkpoint (its end was lost) is refused too. Every check that can refuse
// comes before the first change to the directory: a refused Open leaves it
// exactly as it was. Options.ReadOnly opens a log without changing anything
// at all. Open fsyncs the last segment before appending to it, so what it
// recovered from the page cache after a process crash is durable before
// anything is built on it.
//
// # Format 1
//
// Segments written before format 2 (a 16-byte header, then flat
// len(4)|crc(4)|type(1) frames, no salt, no marks) are still read. Their
// recovery follows the old rules: the checkpoint bounds the durable part, a
// bad frame that a valid one follows is damage unless it holds a whole
// zeroed 512-byte sector (the mark of unsynced pages written back out of
// order, as etcd's WAL decides). A log whose last segment is of format 1 is
// opened by sealing that segment and starting a new one of format 2.
//
// # Durability
//
// Append hands records to a single writer goroutine. Concurrent appends
// coalesce: the writer takes everything queued, issues one write per segment
// touched and, under SyncAlways, one fsync for all of them (group commit).
// Woken by a record, the writer first yields (runtime.Gosched) so that the
// goroutines already runnable queue theirs before it takes them: clients at
// pipeline 1 whose commands arrived together share one write instead of
// one each.
// Append returns once its records are written (SyncEverySec, SyncNever) or
// written and fsynced (SyncAlways). SyncEverySec fsyncs once a second, from
// its own goroutine through its own handle on the segment, so appends go on
// while the disk syncs — and sooner once half of Options.MaxUnsynced (16
// MiB) was written since the last fsync; SyncNever leaves it to the OS —
// but under every policy the writer fsyncs itself once MaxUnsynced bytes
// were written since the last fsync. Sync and WaitSynced make any LSN durable on
// demand, whatever the policy.
//
// SetSync switches the policy of a running log (CONFIG SET appendfsync).
// Each flush of the writer follows the policy in effect when it starts, and
// a record is acknowledged by the rule of the flush that wrote it. A switch
// to SyncAlways, and one away from SyncEverySec, first fsyncs everything
// appended: after the switch to always every acknowledged record is
// durable, and a switch away from everysec does not drop the fsync it owed.
//
// A failed write or fsync poisons the log: every later call returns the same
// error (ErrPoisoned wrapping the cause), because after a failed fsync the
// state of the file is unknown — Linux may drop the dirty pages and still
// serve them from its cache ("fsyncgate"), so bytes a reopen reads back may
// be on no disk. The log therefore keeps in memory what it wrote since its
// last successful fsync (at most MaxUnsynced bytes), and after a failed
// fsync Unsynced returns it — no later fsync, on any handle, is trusted —:
// an Open given it (Options.Rewrite) cuts the segment back to its durable
// end and writes those bytes again, deciding on the result before it writes
// it, so nothing a client was told is lost. Under SyncAlways no write
// after the last fsync was acknowledged, and they are only cut off.
//
// # Concurrency
//
// Readers may hold an LSN while its segment is removed under them (storage
// removes segments whose bodies all died, and the collector moves live bodies
// out first): reads then return ErrNotFound, never ErrCorrupt, and a removed
// segment's file is never held open; reads after Close return ErrClosed.
// ReadEach gives each record of a batched read its own outcome.
//
// All methods of Log are safe for concurrent use. Enqueue never performs I/O,
// so callers may hold their own locks around it to fix the order of records;
// but it blocks while more than Options.MaxPending bytes wait for the
// writer (back-pressure), and the caller's lock is held that long.
// Wait, Append and Sync block and must not be called under such locks if the
// writer could need them (it needs none of the caller's). Reads hold the
// reader cache's shared lock across their pread. LOCKS.md at the
// repository root lists every lock and its order.
package wal
