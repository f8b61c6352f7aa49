package storage

import (
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/cockroachdb/pebble/v2"
	"github.com/diskque/diskque/wal"
)

// Per-segment accounting: what keeps an AOF segment from being removed.
// A sealed segment is dead — a checkpoint removes it — when nothing in it
// is needed any more:
//
//   - no live body: a job's body is read from its record (bodies, bytes);
//   - no anchor: a live job whose latest full-state record (a SNAP, see
//     Job.creatorLSNs) lies here and is not its body's record — a replay
//     from the first segment starts the job from it (anchors);
//   - no hold: a deletion here whose job still has a record that could
//     create it in an older segment the AOF keeps — a replay would bring the
//     job back without it (holds, per segment of such a record).
//
// Each hold is an h/ key, <creator segment><deletion LSN>, so that a
// deletion is taken over once: the collector copies a held deletion
// forward as a TOMB, which moves its keys to the TOMB's LSN, and a TOMB of
// a deletion whose keys are gone (copied already, by a rewrite cut short
// and run again, or twice in one) is refused before it is logged. Removing
// a segment drops the holds on it with one range deletion. The collector
// rewrites a sparse segment by copying all three forward (MOVE for bodies,
// SNAP for anchors, TOMB for deletions), after which it is dead. A
// segment's counts are persisted in its g/ key with every buffer flush, so
// they are the index's, as exact as the rest of it, and the replay derives
// keys and counts as the live store did.

// segmentLive is what one AOF segment still holds that is needed.
type segmentLive struct {
	bodies int64
	bytes  int64
	// anchors counts the live jobs anchored here (SNAP records).
	anchors int64
	// holds counts, per segment holding a creator of the deleted job, the
	// deletions here that are still needed. Never shared between copies.
	holds map[wal.LSN]int64
}

func (l segmentLive) empty() bool { return l.bodies == 0 && l.anchors == 0 && len(l.holds) == 0 }

// held is how many records beside bodies keep the segment: its anchors and
// holds.
func (l segmentLive) held() int64 {
	n := l.anchors
	for _, c := range l.holds {
		n += c
	}
	return n
}

func (l segmentLive) clone() segmentLive {
	l.holds = maps.Clone(l.holds)
	return l
}

// encode appends the segment's g/ value: bodies, bytes, then (when any)
// anchors and the holds (count, then creator segment and count each).
func (l segmentLive) encode(dst []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(l.bodies))
	dst = binary.AppendUvarint(dst, uint64(l.bytes))
	if l.anchors == 0 && len(l.holds) == 0 {
		return dst
	}
	dst = binary.AppendUvarint(dst, uint64(l.anchors))
	dst = binary.AppendUvarint(dst, uint64(len(l.holds)))
	for _, c := range slices.Sorted(maps.Keys(l.holds)) {
		dst = binary.AppendUvarint(dst, uint64(c))
		dst = binary.AppendUvarint(dst, uint64(l.holds[c]))
	}
	return dst
}

func decodeSegmentLive(v []byte) (segmentLive, error) {
	d := decoder{b: v}
	l := segmentLive{bodies: int64(d.uvarint()), bytes: int64(d.uvarint())}
	if d.err == nil && len(d.b) > 0 {
		l.anchors = int64(d.uvarint())
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			d.fail("too many holds")
		}
		for i := uint64(0); i < n && d.err == nil; i++ {
			if l.holds == nil {
				l.holds = map[wal.LSN]int64{}
			}
			c := wal.LSN(d.uvarint())
			l.holds[c] = int64(d.uvarint())
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.fail("trailing bytes")
	}
	if d.err != nil {
		return segmentLive{}, fmt.Errorf("storage: malformed segment accounting: %v", d.err)
	}
	return l, nil
}

// changeSegment applies fn to the accounting of seg and marks it dirty.
func (s *Store) changeSegment(seg wal.LSN, fn func(*segmentLive)) {
	l := s.segments[seg]
	fn(&l)
	if len(l.holds) == 0 {
		l.holds = nil
	}
	if l.empty() {
		delete(s.segments, seg)
	} else {
		s.segments[seg] = l
	}
	s.dirtySegments[seg] = struct{}{}
}

// anchorOf returns the LSN of the job's anchor, its latest creator when
// that is not its body's record (a SNAP), or 0.
func anchorOf(j *Job) wal.LSN {
	if j == nil || len(j.creatorLSNs) == 0 {
		return 0
	}
	if last := j.creatorLSNs[len(j.creatorLSNs)-1]; last != j.BodyLSN {
		return last
	}
	return 0
}

// moveAnchor moves a job's anchor from the one old had to the one nj has.
func (s *Store) moveAnchor(old, nj *Job) {
	a0, a1 := anchorOf(old), anchorOf(nj)
	if a0 == a1 {
		return
	}
	for _, a := range []struct {
		lsn  wal.LSN
		sign int64
	}{{a0, -1}, {a1, +1}} {
		if a.lsn == 0 {
			continue
		}
		if seg, ok := s.log.SegmentOf(a.lsn); ok {
			s.changeSegment(seg, func(l *segmentLive) { l.anchors += a.sign })
		} else if !s.rebuilding {
			s.collected.MisplacedBodies++
		}
	}
}

// creatorSegments returns the distinct segments, other than skip, of the
// creators the AOF still holds, in order.
func (s *Store) creatorSegments(creators []wal.LSN, skip wal.LSN) []wal.LSN {
	var out []wal.LSN
	for _, c := range creators {
		if cs, ok := s.log.SegmentOf(c); ok && cs != skip && !slices.Contains(out, cs) {
			out = append(out, cs)
		}
	}
	slices.Sort(out)
	return out
}

// addHolds records that the deletion at lsn, of a job with these creators,
// is needed while the creators' segments (other than its own, which goes
// with it) are in the AOF: an h/ key per creator segment, counted in the
// deletion's segment. Called with mu held, live and in replay alike.
func (s *Store) addHolds(b *writeBuffer, lsn wal.LSN, creators []wal.LSN) error {
	at, ok := s.log.SegmentOf(lsn)
	if !ok {
		return nil
	}
	for _, cs := range s.creatorSegments(creators, at) {
		// A deletion's LSN is new: the index cannot hold its key.
		if err := b.Set(holdKey(cs, lsn), nil, true); err != nil {
			return err
		}
		s.changeSegment(at, func(l *segmentLive) {
			if l.holds == nil {
				l.holds = map[wal.LSN]int64{}
			}
			l.holds[cs]++
		})
	}
	return nil
}

// heldAt reports which creator segments the deletion at src is still
// needed for (the keys addHolds made that no TOMB took over yet). A
// deletion the collector already copied forward has none: copying it
// again would take over the hold of nothing. Called with mu held.
func (s *Store) heldAt(b *writeBuffer, src wal.LSN, creators []wal.LSN) ([]wal.LSN, error) {
	at, ok := s.log.SegmentOf(src)
	if !ok {
		return nil, nil
	}
	var out []wal.LSN
	for _, cs := range s.creatorSegments(creators, at) {
		has, err := s.hasKey(b, holdKey(cs, src))
		if err != nil {
			return nil, err
		}
		if has {
			out = append(out, cs)
		}
	}
	return out, nil
}

// takeHolds removes the holds of the deletion at src: a TOMB copied it
// forward and holds in its place. held is what heldAt found for it (a live
// TOMB's checkTomb), or nil to read it (a replayed one). Called with mu held.
func (s *Store) takeHolds(b *writeBuffer, src wal.LSN, creators, held []wal.LSN) error {
	if held == nil {
		var err error
		if held, err = s.heldAt(b, src, creators); err != nil || len(held) == 0 {
			return err
		}
	}
	at, _ := s.log.SegmentOf(src)
	for _, cs := range held {
		if err := b.Delete(holdKey(cs, src)); err != nil {
			return err
		}
		s.changeSegment(at, func(l *segmentLive) {
			if l.holds[cs]--; l.holds[cs] <= 0 {
				delete(l.holds, cs)
			}
		})
	}
	return nil
}

// hasKey reports whether the index as it stands (the write buffer over
// Pebble) holds key. Called with mu held.
func (s *Store) hasKey(b *writeBuffer, key []byte) (bool, error) {
	if e, ok := b.lookup(key); ok {
		return !e.del, nil
	}
	s.indexGets.Add(1)
	_, closer, err := s.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, s.indexErr(err)
	}
	closer.Close()
	return true, nil
}

// releaseHolds forgets the removed segments and the holds on them: their
// creators are gone, so the deletions that waited for them are no longer
// needed (one range deletion of their h/ keys per segment held on).
// Called with mu held.
func (s *Store) releaseHolds(removed []wal.LSN) error {
	gone := make(map[wal.LSN]bool, len(removed))
	for _, r := range removed {
		gone[r] = true
	}
	// The keys of the holds on a removed segment go, whether the deletion
	// holding stays or goes with it.
	heldOn := map[wal.LSN]bool{}
	for seg, l := range s.segments {
		changed := false
		for c := range l.holds {
			if gone[c] {
				delete(l.holds, c)
				heldOn[c], changed = true, true
			}
		}
		if changed {
			s.changeSegment(seg, func(*segmentLive) {})
		}
	}
	for _, r := range removed {
		if _, ok := s.segments[r]; ok {
			delete(s.segments, r)
			s.dirtySegments[r] = struct{}{}
		}
	}
	var errs []error
	for _, c := range slices.Sorted(maps.Keys(heldOn)) {
		p := holdPrefix(c)
		errs = append(errs, s.buf.DeleteRange(p, prefixEnd(p)))
	}
	return errors.Join(errs...)
}

// cloneSegments is a deep copy of the accounting, for a checkpoint to
// decide on outside mu.
func (s *Store) cloneSegments() map[wal.LSN]segmentLive {
	out := make(map[wal.LSN]segmentLive, len(s.segments))
	for k, v := range s.segments {
		out[k] = v.clone()
	}
	return out
}

// deadSegments returns the sealed segments that end at or before checkpoint
// and held, as of live, nothing needed: no body, no anchor, and no deletion
// waiting for a segment that stays (a creator in a segment dead too goes
// first: segments are removed oldest first, and a job's creators come
// before its deletion). Once the checkpoint is durable nothing will replay
// them and nothing will read them; wherever they are in the log, so a
// long-delayed job at the front does not pin the churn behind it.
func (s *Store) deadSegments(checkpoint wal.LSN, live map[wal.LSN]segmentLive) []wal.LSN {
	segs := s.log.Segments()
	var dead []wal.LSN
	isDead, present := map[wal.LSN]bool{}, map[wal.LSN]bool{}
	for _, seg := range segs {
		present[seg.First] = true
	}
	for _, seg := range segs[:len(segs)-1] {
		l := live[seg.First]
		if seg.First+wal.LSN(seg.Size) > checkpoint || l.bodies > 0 || l.anchors > 0 {
			continue
		}
		ok := true
		for c := range l.holds {
			if present[c] && !isDead[c] {
				ok = false
				break
			}
		}
		if ok {
			dead = append(dead, seg.First)
			isDead[seg.First] = true
		}
	}
	return dead
}

// upgradeIndex marks an index of an older format as format 4, in one batch
// with the h/ keys of the holds a format-3 index counted without them: so a
// crash leaves either the old index as it was or the new one whole. Each
// deletion (DEL or TOMB) the index has applied in a segment it counted
// holds for gets a key per creator segment of it that the segment's count
// named and the log still has, and the count becomes the number of keys.
// A deletion the collector had already copied forward gets keys too: that
// keeps its segment longer (until its creators go, or the collector copies
// it once more), never a deleted job coming back. Called by Open, after the
// log is open and before the replay.
func (s *Store) upgradeIndex() error {
	if s.upgradeFrom == 0 {
		return nil
	}
	b := s.db.NewBatch()
	defer b.Close()
	keys := 0
	for _, seg := range slices.Sorted(maps.Keys(s.legacyHolds)) {
		named := s.legacyHolds[seg]
		counts := map[wal.LSN]int64{}
		err := s.log.ScanSegment(seg, func(lsn wal.LSN, r wal.Record) error {
			if lsn >= s.applied || r.Type != recDel && r.Type != recTomb {
				return nil // the replay counts what the index has not applied
			}
			o, err := decodeOp(r.Type, r.Payload)
			if err != nil {
				return fmt.Errorf("storage: upgrade: record at lsn %d: %w", lsn, err)
			}
			for _, cs := range s.creatorSegments(o.creators, seg) {
				if named[cs] == 0 {
					continue
				}
				if err := b.Set(holdKey(cs, lsn), nil, nil); err != nil {
					return err
				}
				counts[cs]++
				keys++
			}
			return nil
		})
		if err != nil && !errors.Is(err, wal.ErrNotFound) {
			return err
		}
		l := s.segments[seg]
		if len(counts) > 0 {
			l.holds = counts
		}
		if l.empty() {
			// Removed with its creators, or no deletion of it is left.
			delete(s.segments, seg)
			err = b.Delete(segmentKey(uint64(seg)), nil)
		} else {
			s.segments[seg] = l
			err = b.Set(segmentKey(uint64(seg)), l.encode(nil), nil)
		}
		if err != nil {
			return err
		}
	}
	resumable := 0
	if s.upgradeFrom < 6 {
		// Format 6 keeps the resume set: written here once (resume.go).
		var err error
		if resumable, err = s.addResumeSet(b); err != nil {
			return err
		}
	}
	if err := b.Set(keyFormat, binary.AppendUvarint(nil, formatVersion), nil); err != nil {
		return err
	}
	if err := b.Commit(pebble.NoSync); err != nil {
		return s.indexErr(err)
	}
	s.opts.Logger.Info("storage: index upgraded", "from_format", s.upgradeFrom, "to_format", formatVersion,
		"segments_with_deletions", len(s.legacyHolds), "deletion_keys", keys, "resumable_jobs", resumable)
	s.upgradeFrom, s.legacyHolds = 0, nil
	return nil
}
