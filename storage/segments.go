package storage

import (
	"context"
	"errors"
	"fmt"

	"github.com/diskque/diskque/wal"
)

// The mechanisms of segment collection. Policy — which segment, when — is
// package gc's; storage offers what must be atomic with the index:
//
//   - Stats().Segments: each segment's size and the bodies in it still
//     referenced by jobs (discard accounting: every ack, delete or expiry
//     subtracts its body from its segment's live count, in the same batch).
//   - RewriteSegment: copy a segment's live bodies forward, one MOVE record
//     per job, each applied only if the job's body is still where it was
//     read, so a body acked meanwhile is never resurrected.
//   - Checkpoint: removes every sealed segment with no live body that ends
//     at or before the checkpoint it has just made durable, wherever the
//     segment is in the log (see removeDeadSegments).
//
// A crash anywhere in a rewrite is safe. MOVE records are ordinary AOF
// records, replayed like any other; until a checkpoint passes them the
// source segment is still live in the durable index and is kept, and after
// it the index points at the copies.

// SegmentStat describes one AOF segment.
type SegmentStat struct {
	First wal.LSN
	Name  string // the file name
	// Size is the bytes of records in it.
	Size int64
	// LiveBodies and LiveBytes count the job bodies in it that jobs still
	// reference, and their stored (possibly compressed) bytes; Held the
	// other records in it that a replay still needs — job states and
	// deletions (accounting.go) — which a rewrite copies forward too.
	LiveBodies, LiveBytes, Held int64
	// Active: the segment being appended to. It cannot be rewritten.
	Active bool
	// Checkpointed: it ends at or before the durable checkpoint, so once it
	// holds no live body the next checkpoint removes it.
	Checkpointed bool
}

// moveOverhead is about what a MOVE record adds to the body it carries:
// the frame header (9 bytes), the job id (40), the source LSN, flags and
// body-size varints.
const moveOverhead = 64

// LiveRatio is the share of the segment's bytes a rewrite would copy: each
// live body and the MOVE record around it, at most 1. A segment whose jobs
// are all alive is near 1 whatever their size — an ADD record's job header
// is larger than a MOVE's — so only a segment that lost jobs looks sparse.
// (Body bytes alone would make a segment of live 100-byte jobs look 40%
// live, and the collector would copy it for nothing.)
func (s SegmentStat) LiveRatio() float64 {
	if s.Size <= 0 {
		return 0
	}
	return min(1, float64(s.LiveBytes+s.LiveOverhead())/float64(s.Size))
}

// LiveOverhead is what the MOVE records of the live bodies would add to
// their bytes in a rewrite.
func (s SegmentStat) LiveOverhead() int64 { return (s.LiveBodies + s.Held) * moveOverhead }

// rewriteDiskOverhead bounds what a rewrite writes to disk for each record
// it copies beside the body: the MOVE (or SNAP, TOMB) record with the job's
// whole state, and the job's index key and value written anew, which reach
// the disk at the next flush. Generous, as a reservation should be.
const rewriteDiskOverhead = 256

// RewriteDiskBytes bounds the bytes a rewrite of the segment would write:
// what a collection must have room for before it starts.
func (s SegmentStat) RewriteDiskBytes() int64 {
	return s.LiveBytes + (s.LiveBodies+s.Held)*rewriteDiskOverhead
}

// CollectStats counts what segment collection has done since Open.
type CollectStats struct {
	// SegmentsRemoved and BytesReclaimed count dead segments removed by
	// checkpoints, and their sizes.
	SegmentsRemoved, BytesReclaimed int64
	// SegmentsRewritten counts RewriteSegment calls that completed;
	// BodiesMoved and BytesMoved the live bodies they copied forward.
	SegmentsRewritten, BodiesMoved, BytesMoved int64
	// OrderDeletes counts deletes of queue-order and schedule keys: the
	// tombstones every queue refill and timer load scans over until a
	// compaction drops them. IndexCompactions counts CompactOrderIndex runs.
	OrderDeletes, IndexCompactions int64
	// MisplacedBodies counts jobs found referencing a body in a removed
	// segment when their accounting changed: damage, logged when found.
	MisplacedBodies int64
	// Snaps counts the job states written forward before segments holding
	// their history were removed (forward.go).
	Snaps int64
}

// RewriteResult tells what one RewriteSegment did.
type RewriteResult struct {
	// Moved and MovedBytes count the bodies copied forward and their
	// stored bytes; Forwarded the job states (SNAP) and deletions (TOMB)
	// copied forward (accounting.go); Skipped the bodies found dead (their
	// job acked, deleted or expired) while the segment was read.
	Moved, MovedBytes, Forwarded, Skipped int64
}

// rewriteBatchBytes bounds the bodies one rewrite batch moves, so the commit
// lock is held briefly and the AOF's group commit interleaves client writes.
const (
	rewriteBatchBytes = 1 << 20
	rewriteBatchJobs  = 128
)

// RewriteSegment copies the live bodies of the sealed segment that starts at
// first to the end of the AOF, one MOVE record per job, in small batches
// committed like any operation (under the fsync policy). When it returns
// nil no job references a body in that segment any more (new bodies only
// ever go to the end of the log), and the next Checkpoint, which makes the
// moves durable in the index, removes it. Callers run one rewrite at a time
// (package gc's Collector).
//
// A canceled ctx stops it between batches with ctx's error: what was moved
// is safe, and the segment stays until a later rewrite finishes the job.
func (s *Store) RewriteSegment(ctx context.Context, first wal.LSN) (RewriteResult, error) {
	return s.RewriteSegmentWithin(ctx, first, nil)
}

// RewriteSegmentWithin is RewriteSegment asking allow, before each batch,
// whether it may write that batch's bytes (bodies and overhead, as
// SegmentStat.RewriteDiskBytes counts them): an error from allow stops it
// there, with that error and what was moved safe, as a canceled ctx does.
// A collector keeps a rewrite off a nearly full disk with it. A nil allow
// allows everything.
func (s *Store) RewriteSegmentWithin(ctx context.Context, first wal.LSN, allow func(bytes int64) error) (RewriteResult, error) {
	var res RewriteResult
	if err := s.pin(); err != nil {
		return res, err
	}
	defer s.unpin()
	var ops []*op
	var batchBytes int
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		if allow != nil {
			n := int64(0)
			for _, o := range ops {
				n += int64(len(o.body)) + rewriteDiskOverhead
			}
			if err := allow(n); err != nil {
				return err
			}
		}
		out := make([]Result, len(ops))
		p := s.apply(ops, out)
		if err := p.Wait(); err != nil {
			return err
		}
		for i, r := range out {
			switch {
			case r.Err == nil && ops[i].typ == recMoveFull:
				res.Moved++
				res.MovedBytes += int64(len(ops[i].body))
			case r.Err == nil:
				res.Forwarded++
			case errors.Is(r.Err, ErrNotFound) || errors.Is(r.Err, ErrWrongState) || errors.Is(r.Err, ErrExists):
				res.Skipped++ // changed between the check below and the commit
			default:
				return r.Err
			}
		}
		clear(ops)
		ops, batchBytes = ops[:0], 0
		if testHookRewriteBatch != nil {
			testHookRewriteBatch()
		}
		return nil
	}
	flushIfFull := func() error {
		if batchBytes >= rewriteBatchBytes || len(ops) >= rewriteBatchJobs {
			return flush()
		}
		return nil
	}
	s.mu.Lock()
	held := len(s.segments[first].holds) > 0
	s.mu.Unlock()
	err := s.log.ScanSegment(first, func(lsn wal.LSN, r wal.Record) error {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch r.Type {
		case recAdd, recMove, recMoveFull:
		case recSnap:
			// A live job anchored here is anchored anew at the end.
			id, err := recordJobID(r)
			if err != nil {
				return fmt.Errorf("storage: rewrite: record at lsn %d: %w", lsn, err)
			}
			if j, err := s.job(id); err == nil && anchorOf(j) == lsn {
				ops = append(ops, &op{typ: recSnap, id: id})
			}
			return flushIfFull()
		case recDel, recTomb:
			// A deletion still needed goes on at the end (a TOMB).
			if !held {
				return nil
			}
			o, err := decodeOp(r.Type, r.Payload)
			if err != nil {
				return fmt.Errorf("storage: rewrite: record at lsn %d: %w", lsn, err)
			}
			var keep []wal.LSN
			for _, c := range o.creators {
				if seg, ok := s.log.SegmentOf(c); ok && seg != first {
					keep = append(keep, c)
				}
			}
			if len(keep) > 0 {
				ops = append(ops, &op{typ: recTomb, id: o.id, src: lsn, creators: keep})
			}
			return flushIfFull()
		default:
			return nil
		}
		id, err := recordJobID(r)
		if err != nil {
			return fmt.Errorf("storage: rewrite: record at lsn %d: %w", lsn, err)
		}
		// Check liveness before copying the body: most bodies of a segment
		// worth rewriting are dead. The commit checks again under the lock.
		j, err := s.job(id) // the rewrite holds the pin
		if errors.Is(err, ErrNotFound) {
			res.Skipped++
			return nil
		}
		if err != nil {
			return err
		}
		if j.BodyLSN != lsn {
			res.Skipped++
			return nil
		}
		o, err := decodeOp(r.Type, r.Payload)
		if err != nil {
			return fmt.Errorf("storage: rewrite: record at lsn %d: %w", lsn, err)
		}
		ops = append(ops, &op{typ: recMoveFull, id: id, src: lsn, body: o.body,
			compressed: o.compressed, bodySize: o.bodySize})
		batchBytes += len(o.body)
		return flushIfFull()
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return res, err
	}
	s.mu.Lock()
	s.collected.SegmentsRewritten++
	s.collected.BodiesMoved += res.Moved
	s.collected.BytesMoved += res.MovedBytes
	s.mu.Unlock()
	return res, nil
}

// testHookRewriteBatch, when set by a test, runs after each committed batch
// of moves: the crash tests clone the filesystem there.
var testHookRewriteBatch func()

// CompactOrderIndex compacts the index's queue-order and schedule keys (q/
// and s/) into its bottom level, dropping their tombstones. A queue is read
// from its oldest entry and the schedule from its earliest event, exactly
// where consumed and fired entries leave their tombstones: until they are
// compacted away, every refill and timer load steps over them. Job keys are
// left to Pebble's own heuristics: they are read by point lookups, which
// tombstones barely slow down.
func (s *Store) CompactOrderIndex(ctx context.Context) error {
	if err := s.pin(); err != nil {
		return err
	}
	defer s.unpin()
	// Compact first flushes the memtables it overlaps and waits for that
	// flush, which never ends once the index failed (fence.go): stop
	// waiting when the store fails or closes (Close waits for the pin).
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.failedCh:
		case <-s.ckptStop:
		case <-ctx.Done():
		}
		cancel()
	}()
	if err := s.db.Compact(ctx, []byte{prefixQueue}, []byte{prefixSchedule + 1}, false); err != nil {
		select {
		case <-s.ckptStop:
			return ErrClosed // Close began: it cancelled the wait
		default:
		}
		s.mu.Lock()
		uerr := s.usableLocked()
		s.mu.Unlock()
		if uerr != nil {
			return uerr
		}
		return fmt.Errorf("storage: compact the order index: %w", err)
	}
	s.mu.Lock()
	s.collected.IndexCompactions++
	s.mu.Unlock()
	return nil
}
