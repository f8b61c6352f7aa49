package storage

import (
	"errors"
	"fmt"
	"slices"

	"github.com/diskque/diskque/wal"
)

// Keeping the AOF the truth. The index is derived from the AOF, but a
// checkpoint removes segments from the middle of the AOF once nothing in
// them is needed (accounting.go: no live body, no job anchored there, no
// deletion waiting for an older segment). A replay of what is left from the
// first segment — the rebuild of a lost or corrupt index — must still give
// the index exactly, so before segments go, what a replay would miss from
// them is written forward, at the end of the AOF:
//
//   - a live job with a record there after its latest creator that stays
//     (its ADD, or a MOVE or SNAP: records that carry its whole state) gets
//     a SNAP, its whole state, which a replay takes whatever it had for the
//     job; the job is anchored at the SNAP from then on, which keeps that
//     segment until the job dies or the collector anchors it anew;
//   - a META, always: the node id, the highest ctime and every queue's
//     pause state (the node id and pause records, and the ADDs that held
//     the highest ctime, may be among what goes).
//
// Deletions need nothing: a segment holding one whose job still has a
// creator in an older segment that stays is not dead (the collector copies
// such deletions forward as TOMBs when it empties the segment). Segments
// are removed oldest first, and a job's creators come before its deletion,
// so removing several dead segments at once needs nothing between them.
// The forward records are durable before the segments are removed, and in
// the index the checkpoint flushes. DEBUG FLUSHALL leaves every older
// segment dead, so they go with it.
//
// A store written before format 3 did not log its deletions' creators or
// anchor its jobs, and its collector's MOVE carried no job state; one
// written before format 4 counted the deletions still needed without keys
// and could copy one forward twice, letting a segment go while a deletion
// in it was needed (Open gives the holds a format-3 index counted their
// keys: upgradeIndex). Its rebuild is exact for what was written since, but a job it deleted before
// may come back while that job's ADD is still in the AOF, and a job whose
// body it moved before format 3 is lost once that job's ADD is gone.

// forward writes forward what a replay from the first segment would miss
// once the segments dead are removed (see above), and waits until it is
// durable.
func (s *Store) forward(dead []wal.LSN) error {
	going := make(map[wal.LSN]bool, len(dead))
	for _, d := range dead {
		going[d] = true
	}
	jobs, err := s.forwardScan(dead)
	if err != nil {
		return err
	}
	defer s.releaseForwardScan()
	var ops []*op
	ids := make([]string, 0, len(jobs))
	for id, j := range jobs {
		if !j.deleted {
			ids = append(ids, string(id[:]))
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		cur, err := s.job(id) // the checkpoint holds the pin
		if errors.Is(err, ErrNotFound) {
			continue // its whole life was in the segments going
		}
		if err != nil {
			return err
		}
		// Its latest creator that stays (its body's record or its anchor
		// at least: neither is in a dead segment): a replay starts from
		// it, so any record of the job after it that goes must be made up
		// for.
		survivor := wal.LSN(0)
		for _, c := range cur.creators() {
			if seg, ok := s.log.SegmentOf(c); ok && !going[seg] {
				survivor = max(survivor, c)
			}
		}
		if jobs[fwdKeyOf(id)].last > survivor {
			ops = append(ops, &op{typ: recSnap, id: id})
		}
	}
	// A META goes with every removal, not only of the node's and the pause
	// records: it carries the highest ctime, which the ADDs going may hold.
	ops = append(ops, &op{typ: recMeta})
	var snaps int64
	for len(ops) > 0 {
		n := min(len(ops), rewriteBatchJobs)
		res := make([]Result, n)
		s.waitForIndexRoomToClose()
		p := s.applyNow(ops[:n], res)
		for i, r := range res {
			switch {
			case r.Err == nil && ops[i].typ == recSnap:
				snaps++
			case r.Err == nil, errors.Is(r.Err, ErrNotFound):
				// A job deleted since the scan needs no SNAP.
			default:
				return fmt.Errorf("storage: forward %s: %w", ops[i].id, r.Err)
			}
		}
		if err := p.Wait(); err != nil {
			return err
		}
		ops = ops[n:]
	}
	s.mu.Lock()
	end := s.applied
	s.collected.Snaps += snaps
	s.mu.Unlock()
	// What forward wrote is the checkpoint's own: it is no reason for
	// another.
	select {
	case <-s.ckptKick:
	default:
	}
	return s.log.WaitSynced(end)
}

// fwdKey is a job id as a map key: an array, not a string, so that the
// scan below converts no id to a string (an allocation per record).
type fwdKey [JobIDLen]byte

func fwdKeyOf(id string) (k fwdKey) {
	copy(k[:], id)
	return k
}

// fwdSeen is, per job, the LSN of its last record in the segments going;
// deleted: that record is its DEL (a job of the id that lives now was added
// again after it, so it has no record there).
type fwdSeen struct {
	last    wal.LSN
	deleted bool
}

// forwardScan reads the segments dead and returns, per job with a record in
// them, its last one there. The map is the store's, cleared and refilled by
// every checkpoint (only the checkpoint calls this; kept up to
// maxKeptForwardJobs), so that a scan of a
// segment's tens of thousands of records allocates nothing per record once
// the map has grown to a checkpoint's size: the scan was 0.6 of the 11 µs of
// CPU a job cost under producers and consumers at once.
func (s *Store) forwardScan(dead []wal.LSN) (map[fwdKey]fwdSeen, error) {
	if s.fwdJobs == nil {
		s.fwdJobs = map[fwdKey]fwdSeen{}
	}
	jobs := s.fwdJobs
	clear(jobs)
	for _, first := range dead {
		err := s.log.ScanSegment(first, func(lsn wal.LSN, r wal.Record) error {
			id, err := recordJobIDBytes(r)
			if err != nil {
				return fmt.Errorf("storage: forward: record at lsn %d: %w", lsn, err)
			}
			if id == nil {
				return nil // node, pause, flush and meta records: the META
			}
			if r.Type == recTomb {
				// The copy of an earlier deletion: of an incarnation gone,
				// while a later one (added again) may have records here.
				return nil
			}
			jobs[fwdKey(id)] = fwdSeen{last: lsn, deleted: r.Type == recDel}
			return nil
		})
		if errors.Is(err, wal.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
	}
	return jobs, nil
}

// maxKeptForwardJobs bounds the map forwardScan keeps between checkpoints:
// a scan of a churned 64 MiB segment can grow it to hundreds of thousands
// of ids, tens of MB that clear does not give back, held for ever against
// the node's memory budget. Above the bound the next scan grows a new one;
// what the kept map saves is its growth, not the per-record allocations,
// which the array keys remove either way.
const maxKeptForwardJobs = 1 << 16

// releaseForwardScan drops forwardScan's map once a checkpoint is done
// with it, if it grew beyond maxKeptForwardJobs.
func (s *Store) releaseForwardScan() {
	if len(s.fwdJobs) > maxKeptForwardJobs {
		s.fwdJobs = nil
	}
}

// recordJobID returns the id of the job a record concerns ("" for the
// node's and the queues' records) without decoding a body.
func recordJobID(r wal.Record) (string, error) {
	id, err := recordJobIDBytes(r)
	return string(id), err
}

// recordJobIDBytes is recordJobID without the copy: the id aliases the
// payload (nil for the node's and the queues' records).
func recordJobIDBytes(r wal.Record) ([]byte, error) {
	switch r.Type {
	case recNode, recPause, recFlush, recMeta:
		return nil, nil
	case recAdd, recMoveFull, recSnap:
		if len(r.Payload) < 1+JobIDLen {
			return nil, ErrBadRecord
		}
		return r.Payload[1 : 1+JobIDLen], nil
	}
	if len(r.Payload) < JobIDLen {
		return nil, ErrBadRecord
	}
	return r.Payload[:JobIDLen], nil
}
