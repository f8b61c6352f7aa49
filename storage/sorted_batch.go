package storage

import (
	"bytes"
	"slices"

	"github.com/cockroachdb/pebble/v2"
)

// indexWriter is what the index-writing code (write, putJob, flushAll)
// needs of a batch: *pebble.Batch, used by replay, whose reads must see the
// batch's own writes, and *sortedBatch, used by live commits.
type indexWriter interface {
	Set(key, value []byte, _ *pebble.WriteOptions) error
	Delete(key []byte, _ *pebble.WriteOptions) error
	DeleteRange(start, end []byte, _ *pebble.WriteOptions) error
}

// sortedBatch buffers a commit's index writes and hands them to a Pebble
// batch in key order, keeping only the last write of a key.
//
// Why: a Pebble batch is applied to the memtable one key at a time, in batch
// order, and each insert walks the skiplist from the top unless the key falls
// next to the previous insert (arenaskl's Inserter keeps that splice). A job
// writes keys in three far-apart families (j/, q/, s/), so in job order every
// insert is a full walk through a memtable of hundreds of thousands of keys,
// mostly cache misses; in key order a batch's queue-order and schedule keys
// land next to each other and the walks shrink to a step. A key written
// twice in one commit (a job added and delivered in the same batch, say) is
// written once.
//
// Range deletions order the writes around them (a point write after a range
// deletion must not be covered by it), so each one is a barrier: the writes
// before it are sorted and emitted, then it.
type sortedBatch struct {
	arena []byte
	ents  []sortedEntry
}

type sortedEntry struct {
	kind           pebble.InternalKeyKind
	keyOff, keyEnd uint32
	valOff, valEnd uint32 // a range deletion's end key
}

func (b *sortedBatch) reset() {
	b.arena = b.arena[:0]
	clear(b.ents) // keep no references
	b.ents = b.ents[:0]
}

func (b *sortedBatch) add(kind pebble.InternalKeyKind, key, value []byte) {
	e := sortedEntry{kind: kind, keyOff: uint32(len(b.arena))}
	b.arena = append(b.arena, key...)
	e.keyEnd = uint32(len(b.arena))
	e.valOff = e.keyEnd
	b.arena = append(b.arena, value...)
	e.valEnd = uint32(len(b.arena))
	b.ents = append(b.ents, e)
}

// Set records a point write.
func (b *sortedBatch) Set(key, value []byte, _ *pebble.WriteOptions) error {
	b.add(pebble.InternalKeyKindSet, key, value)
	return nil
}

// Delete records a point deletion.
func (b *sortedBatch) Delete(key []byte, _ *pebble.WriteOptions) error {
	b.add(pebble.InternalKeyKindDelete, key, nil)
	return nil
}

// DeleteRange records a range deletion of [start, end).
func (b *sortedBatch) DeleteRange(start, end []byte, _ *pebble.WriteOptions) error {
	b.add(pebble.InternalKeyKindRangeDelete, start, end)
	return nil
}

func (b *sortedBatch) key(e *sortedEntry) []byte   { return b.arena[e.keyOff:e.keyEnd] }
func (b *sortedBatch) value(e *sortedEntry) []byte { return b.arena[e.valOff:e.valEnd] }

// emit writes the buffered writes into pb: between range deletions in key
// order, the last write of each key only.
func (b *sortedBatch) emit(pb *pebble.Batch) error {
	ents := b.ents
	for len(ents) > 0 {
		n := slices.IndexFunc(ents, func(e sortedEntry) bool { return e.kind == pebble.InternalKeyKindRangeDelete })
		if n < 0 {
			n = len(ents)
		}
		if err := b.emitPoints(pb, ents[:n]); err != nil {
			return err
		}
		if n == len(ents) {
			break
		}
		e := &ents[n]
		if err := pb.DeleteRange(b.key(e), b.value(e), nil); err != nil {
			return err
		}
		ents = ents[n+1:]
	}
	return nil
}

func (b *sortedBatch) emitPoints(pb *pebble.Batch, ents []sortedEntry) error {
	// Stable: of two writes of a key, the later stays later.
	slices.SortStableFunc(ents, func(x, y sortedEntry) int { return bytes.Compare(b.key(&x), b.key(&y)) })
	for i := range ents {
		e := &ents[i]
		if i+1 < len(ents) && bytes.Equal(b.key(e), b.key(&ents[i+1])) {
			continue // overwritten later in this batch
		}
		var err error
		if e.kind == pebble.InternalKeyKindSet {
			err = pb.Set(b.key(e), b.value(e), nil)
		} else {
			err = pb.Delete(b.key(e), nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}
