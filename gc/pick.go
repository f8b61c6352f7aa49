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
}

// pick returns the first LSNs of the segments to rewrite, sparsest first
// (the most space back per byte copied), oldest first among equals. It
// considers only sealed segments that end at or before the durable
// checkpoint (so the next checkpoint can remove them once rewritten) and
// that still hold a live body (a dead one needs no rewrite: the checkpoint
// removes it).
func pick(segs []storage.SegmentStat, p Policy) []wal.LSN {
	var cands []storage.SegmentStat
	for _, s := range segs {
		if s.Active || !s.Checkpointed || s.LiveBodies == 0 {
			continue
		}
		if p.MinLiveRatio < 1 && s.LiveRatio() >= p.MinLiveRatio {
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
