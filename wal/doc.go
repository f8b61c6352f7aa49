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
// record's frame starts at file offset segmentHeaderSize + (x - first LSN).
// The end of a record is the LSN of the next one.
//
// # Segment files
//
// Segments are named by their first LSN in 16 lower-case hex digits, so that
// names sort lexically in log order:
//
//	0000000000000000.wal   LSNs [0, 67108873)
//	0000000004000009.wal   LSNs [67108873, ...)
//
// Each file starts with a 16-byte header, then whole record frames:
//
//	+----------------+----------------+
//	| magic (8)      | first LSN (8)  |   "dqwal\x00\x00\x01", big-endian
//	+----------------+----------------+
//	| frame | frame | frame | ...     |
//
// A new segment is made crash-safely: the header is written to NAME.tmp,
// fsynced, renamed to NAME, and the directory is fsynced. Stale .tmp files are
// removed on Open. Before a new segment is made the previous one is fsynced,
// so only the last segment can ever hold unsynced (and so possibly torn) data.
//
// # Record frames
//
//	+-------------+-------------+---------+----------------------+
//	| length (4)  | crc32c (4)  | type(1) | payload (length)     |
//	+-------------+-------------+---------+----------------------+
//
// length is the payload length, little-endian. The CRC (Castagnoli) covers the
// length, the type and the payload, so a corrupted length is caught too. Type 0
// is reserved: a zeroed region never decodes as a record.
//
// # Recovery
//
// Open verifies that segments are contiguous — except for gaps that end at or
// before Options.Checkpoint: segments the owner removed with RemoveSegments
// because nothing in them is needed (storage removes a segment whose bodies
// are all dead once its checkpoint has passed it) — and reads the last
// segment from the checkpoint (or its start) to its end. A short, torn or bad-CRC record at the tail of the last segment ends the
// log: the segment is truncated there and its original is kept beside it as
// NAME.broken. A bad record that is followed by a valid one is not a torn
// write but damage — unless it holds a whole zeroed 512-byte sector, which
// is how unsynced pages written back out of order look after a crash (the
// rule of etcd's WAL) — and Open refuses with an error (ErrCorrupt) naming
// the segment and offset; so does damage found in any other segment, by
// Replay, Read or Verify. Open does not read segments before the last, nor
// the checkpointed part of the last: recovery cost follows the replayed
// tail, not the size of the log. Verify reads every record. Open fsyncs the last segment before appending to it, so
// what it recovered from the page cache after a process crash is durable
// before anything is built on it.
//
// # Durability
//
// Append hands records to a single writer goroutine. Concurrent appends
// coalesce: the writer takes everything queued, issues one write per segment
// touched and, under SyncAlways, one fsync for all of them (group commit).
// Append returns once its records are written (SyncEverySec, SyncNever) or
// written and fsynced (SyncAlways). SyncEverySec fsyncs once a second, from
// its own goroutine through its own handle on the segment, so appends go on
// while the disk syncs; SyncNever leaves it to the OS. Sync and WaitSynced
// make any LSN durable on demand, whatever the policy.
//
// A failed write or fsync poisons the log: every later call returns the same
// error (ErrPoisoned wrapping the cause), because after a failed fsync the
// state of the file is unknown. Close and reopen to recover what was durable.
//
// # Concurrency
//
// All methods of Log are safe for concurrent use. Enqueue never performs I/O,
// so callers may hold their own locks around it to fix the order of records;
// Wait, Append and Sync block and must not be called under such locks if the
// writer could need them (it needs none of the caller's).
package wal
