// Package gc keeps diskque's disk use following its live data rather than
// its history. A job queue is a churn machine — jobs are written, delivered,
// acked and forgotten while a few wait for months — so without collection the
// AOF would grow for ever.
//
// # What storage does, what gc decides
//
// Package storage owns the mechanisms that must be atomic with its index:
// discard accounting (each segment's live bodies and bytes, updated in the
// same batch as every ack, delete, expiry or move), removal of dead segments
// at every checkpoint (a sealed segment with no live body below the durable
// checkpoint goes, wherever it is in the log), RewriteSegment (a segment's
// live bodies copied forward as MOVE records) and CompactOrderIndex.
//
// This package holds the policy: pick, a pure function from segment
// statistics to the segments worth rewriting, and the Collector, which runs
// collections — in the background, and on demand for BGREWRITEAOF.
//
// # Invariants
//
//   - One collection at a time (the Collector is single-flight); a rewrite
//     never races another rewrite. Collector.run is held for a whole
//     collection (its rewrites, checkpoints and compaction) and is taken
//     before any store lock; the collector reaches the store directly,
//     without the broker's lock (LOCKS.md at the repository root).
//   - Only sealed segments that end at or before the durable checkpoint are
//     rewritten, so the checkpoint that follows a rewrite can remove them.
//   - Nothing live is lost at any step: a MOVE applies only if the job's
//     body is still where the collector read it, and a segment goes only once
//     the checkpoint that made the moves durable has passed it (storage's
//     crash tests cover crashes before, during and after a rewrite).
//   - Work per collection is bounded (MaxMoveBytes), so a background
//     collection never holds the disk for long; a full collection
//     (BGREWRITEAOF) rewrites every sealed segment with a live body.
//   - A collection never writes past the disk's room (SetRoom: a server's
//     min-free-disk). A rewrite writes its live bodies before the
//     checkpoint after it frees their segment, so on a nearly full disk it
//     is what would fill it: a full collection that would write more than
//     the room (counting the dead segments its first checkpoint removes)
//     does not start (ErrNoRoom); a background one takes only the picked
//     segments whose rewrites fit; and a rewrite asks before every batch,
//     stopping before one that would cross (others wrote meanwhile). Stats
//     counts these (SkippedForSpace) and says why (LastSkip).
//
// # Bound
//
// With MinLiveRatio r every sealed segment that is not being collected is
// at least r live — live meaning what a rewrite would keep: the live bodies
// and about 64 bytes of MOVE record around each (storage.SegmentStat
// LiveRatio) — so the AOF holds at most live/r bytes plus the active
// segment and the one being rewritten: with the default 0.5, twice the live
// bodies (and their record overhead) plus two segments. Dead segments wait
// for the next checkpoint (every minute or 64 MiB of AOF) to be removed.
//
// Segments still losing live bodies are not rewritten (Policy.Previous): a
// background collection takes only segments whose live bytes held still
// since the one before, because a queue being drained in order empties its
// segments by itself, seconds after a rewrite would have copied them. So
// the bound above holds one collection interval late for the segments
// sealed or drained within the last interval.
package gc
