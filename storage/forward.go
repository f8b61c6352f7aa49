package storage

import (
	"errors"
	"fmt"
	"slices"

	"github.com/diskque/diskque/wal"
)

// Keeping the AOF the truth. The index is derived from the AOF, but a
// checkpoint removes segments from the middle of the AOF once no live body
// is in them (removeDeadSegments). A replay of what is left from the first
// segment — the rebuild of a lost or corrupt index — must still give the
// index exactly, so before a segment goes, whatever a replay would miss
// from it is written forward, at the end of the AOF:
//
//   - a live job with a record in the segment after its latest full state
//     (its ADD, or a MOVE or SNAP: the job's creators) gets a SNAP, its
//     whole state, which a replay takes whatever it had for the job;
//   - a deletion (a DEL, or a TOMB written forward earlier) whose job has a
//     creator still in the AOF outside the segments going now gets a TOMB:
//     without it, a replay would create the job from that record and keep
//     it. A deletion logs the job's creators for this (Job.creatorLSNs);
//   - a node id, pause or META record gets a META: the node id and every
//     queue's pause state.
//
// Segments are removed oldest first, and every record a deletion refers to
// comes before it, so removing several dead segments at once needs nothing
// forward for what they hold between them. The forward records are durable
// before the segments are removed. Records of jobs acked, expired or
// deleted with their whole history in the segments going need nothing.
// DEBUG FLUSHALL leaves every older segment dead, so they go with it.
//
// A job of an index written before format 3 knows only its body's record as
// a creator: a rebuild of such a store is exact for what was written since.

// forward writes forward what a replay from the first segment would miss
// once the segments dead are removed (see above), and waits until it is
// durable.
func (s *Store) forward(dead []wal.LSN) error {
	going := make(map[wal.LSN]bool, len(dead))
	for _, d := range dead {
		going[d] = true
	}
	// last is, per job, the LSN of its last record in the segments going;
	// gone: a deletion of it is there, after its other records there.
	type seen struct {
		last     wal.LSN
		deleted  bool
		creators []wal.LSN // of the deletion
	}
	jobs := map[string]*seen{}
	meta := false
	for _, first := range dead {
		err := s.log.ScanSegment(first, func(lsn wal.LSN, r wal.Record) error {
			id, err := recordJobID(r)
			if err != nil {
				return fmt.Errorf("storage: forward: record at lsn %d: %w", lsn, err)
			}
			if id == "" {
				meta = meta || r.Type == recNode || r.Type == recPause || r.Type == recMeta
				return nil
			}
			j := jobs[id]
			if j == nil {
				j = &seen{}
				jobs[id] = j
			}
			j.last = lsn
			j.deleted = r.Type == recDel || r.Type == recTomb
			if j.deleted {
				o, err := decodeOp(r.Type, r.Payload)
				if err != nil {
					return fmt.Errorf("storage: forward: record at lsn %d: %w", lsn, err)
				}
				j.creators = o.creators
			}
			return nil
		})
		if errors.Is(err, wal.ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
	}
	var ops []*op
	ids := make([]string, 0, len(jobs))
	for id := range jobs {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		j := jobs[id]
		if j.deleted {
			// Still needed while a creator is in the AOF and not going now.
			var keep []wal.LSN
			for _, c := range j.creators {
				if seg, ok := s.log.SegmentOf(c); ok && !going[seg] {
					keep = append(keep, c)
				}
			}
			if len(keep) > 0 {
				ops = append(ops, &op{typ: recTomb, id: id, creators: keep})
			}
			continue
		}
		cur, err := s.job(id) // the checkpoint holds the pin
		if errors.Is(err, ErrNotFound) {
			continue // its whole life was in the segments going
		}
		if err != nil {
			return err
		}
		// Its latest creator that stays (its body's record at least: a
		// live body's segment is not dead): a replay starts from it, so
		// any record of the job after it that goes must be made up for.
		survivor := wal.LSN(0)
		for _, c := range cur.creators() {
			if seg, ok := s.log.SegmentOf(c); ok && !going[seg] {
				survivor = max(survivor, c)
			}
		}
		if j.last > survivor {
			ops = append(ops, &op{typ: recSnap, id: id})
		}
	}
	if meta {
		ops = append(ops, &op{typ: recMeta})
	}
	var snaps, tombs int64
	for _, o := range ops {
		switch o.typ {
		case recSnap:
			snaps++
		case recTomb:
			tombs++
		}
	}
	if len(ops) == 0 {
		return nil
	}
	for len(ops) > 0 {
		n := min(len(ops), rewriteBatchJobs)
		res := make([]Result, n)
		p := s.apply(ops[:n], res)
		for i, r := range res {
			// A job deleted since the scan needs no SNAP; a TOMB of a job
			// that exists again cannot be (ids are unique) and is skipped.
			if r.Err != nil && !errors.Is(r.Err, ErrNotFound) && !errors.Is(r.Err, ErrExists) {
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
	s.collected.Tombs += tombs
	s.mu.Unlock()
	return s.log.WaitSynced(end)
}

// recordJobID returns the id of the job a record concerns ("" for the
// node's and the queues' records) without decoding a body.
func recordJobID(r wal.Record) (string, error) {
	switch r.Type {
	case recNode, recPause, recFlush, recMeta:
		return "", nil
	case recAdd, recMoveFull, recSnap:
		if len(r.Payload) < 1+JobIDLen {
			return "", ErrBadRecord
		}
		return string(r.Payload[1 : 1+JobIDLen]), nil
	}
	if len(r.Payload) < JobIDLen {
		return "", ErrBadRecord
	}
	return string(r.Payload[:JobIDLen]), nil
}
