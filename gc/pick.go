package gc

import (
	"cmp"
	"slices"

	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// Policy is what pick weighs.
type Policy struct {
	// MinLiveRatio: a segment whose live bodies are less than this share of
	// its bytes is worth rewriting. 1 or more rewrites every segment with a
	// live body (a full collection).
	MinLiveRatio float64
	// MaxMoveBytes bounds the live bytes one collection copies; the first
	// pick is always taken, however large. Zero or negative: no bound.
	MaxMoveBytes int64
	// Previous, if not nil, is each segment's live bytes at the previous
	// collection, and only segments that held still since are taken. A
	// segment that lost live bodies since (or was not sealed yet) is most
	// likely being drained — consumers taking a backlog in order empty its
	// segments one after the other — and will be dead without a copy:
	// rewriting it would copy bodies seconds before they are acked. Jobs
	// that stay (delayed ones, a slow queue) leave their segments still, and
	// those are taken at the next collection. A full collection
	// (MinLiveRatio 1) ignores it.
	Previous map[wal.LSN]int64
}

// liveBytes maps each segment to its live bytes: the Previous of the next
// pick.
func liveBytes(segs []storage.SegmentStat) map[wal.LSN]int64 {
	m := make(map[wal.LSN]int64, len(segs))
	for _, s := range segs {
		m[s.First] = s.LiveBytes
	}
	return m
}

// pick returns the first LSNs of the segments to rewrite, sparsest first
// (the most space back per byte copied), oldest first among equals. It
// considers only sealed segments that end at or before the durable
// checkpoint (so the next checkpoint can remove them once rewritten) and
// that still hold a live body or another record a replay needs (a dead one
// needs no rewrite: the checkpoint removes it).
func pick(segs []storage.SegmentStat, p Policy) []wal.LSN {
	var cands []storage.SegmentStat
	for _, s := range segs {
		if s.Active || !s.Checkpointed || s.LiveBodies == 0 && s.Held == 0 {
			continue
		}
		if p.MinLiveRatio < 1 && s.LiveRatio() >= p.MinLiveRatio {
			continue
		}
		if prev, seen := p.Previous[s.First]; p.MinLiveRatio < 1 && p.Previous != nil && (!seen || s.LiveBytes < prev) {
			continue
		}
		cands = append(cands, s)
	}
	slices.SortStableFunc(cands, func(a, b storage.SegmentStat) int {
		if c := cmp.Compare(a.LiveRatio(), b.LiveRatio()); c != 0 {
			return c
		}
		return cmp.Compare(a.First, b.First)
	})
	var out []wal.LSN
	var moved int64
	for _, s := range cands {
		if len(out) > 0 && p.MaxMoveBytes > 0 && moved+s.LiveBytes > p.MaxMoveBytes {
			break
		}
		out = append(out, s.First)
		moved += s.LiveBytes
	}
	return out
}
