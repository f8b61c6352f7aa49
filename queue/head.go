package queue

import (
	"slices"

	"github.com/diskque/diskque/storage"
)

// Head is the in-memory front of one queue: its oldest entries, in
// (ctime, id) order, at most Cap of them.
//
// Invariant: every entry in memory sorts before every entry that is only on
// disk. So the oldest job of the queue is always Head's first entry whenever
// Head is not empty, and refilling reads the disk from the position after
// Head's last entry. Complete says that memory holds the whole queue; only
// then may a new entry that sorts last be kept in memory.
//
// A Head is not safe for concurrent use.
type Head struct {
	cap      int
	entries  []storage.QueuePos // sorted; entries[start:] are live
	start    int
	complete bool
}

// NewHead returns the head of a queue that is empty on disk too (complete).
func NewHead(capacity int) *Head {
	return &Head{cap: max(capacity, 1), complete: true}
}

// NewIncompleteHead returns an empty head of a queue that may have entries on
// disk: the first Pop finds it empty and the caller refills it.
func NewIncompleteHead(capacity int) *Head {
	return &Head{cap: max(capacity, 1)}
}

// Len is the number of entries in memory.
func (h *Head) Len() int { return len(h.entries) - h.start }

// Complete reports whether memory holds every queued entry of the queue.
func (h *Head) Complete() bool { return h.complete }

// Peek returns the oldest entry in memory.
func (h *Head) Peek() (storage.QueuePos, bool) {
	if h.Len() == 0 {
		return storage.QueuePos{}, false
	}
	return h.entries[h.start], true
}

// Pop removes and returns the oldest entry in memory.
func (h *Head) Pop() (storage.QueuePos, bool) {
	p, ok := h.Peek()
	if ok {
		h.entries[h.start] = storage.QueuePos{}
		h.start++
		if h.start == len(h.entries) {
			h.entries, h.start = h.entries[:0], 0
		}
	}
	return p, ok
}

// Last returns the newest entry in memory: refills read after it.
func (h *Head) Last() (storage.QueuePos, bool) {
	if h.Len() == 0 {
		return storage.QueuePos{}, false
	}
	return h.entries[len(h.entries)-1], true
}

// Insert adds an entry that was just queued (a new job, a requeue, a nack).
// It is kept in memory if it sorts before the part of the queue that is only
// on disk; otherwise it stays on disk only and a refill will find it. It
// reports whether the entry is in memory.
func (h *Head) Insert(p storage.QueuePos) bool {
	if h.complete {
		h.insertSorted(p)
		h.trim()
		return h.contains(p)
	}
	last, ok := h.Last()
	if !ok || !less(p, last) {
		// Disk-only entries may sort between last and p: p must stay there.
		return false
	}
	h.insertSorted(p)
	h.trim()
	return h.contains(p)
}

// Remove drops an entry (dequeued, acked, deleted, expired). It reports
// whether the entry was in memory.
func (h *Head) Remove(p storage.QueuePos) bool {
	live := h.entries[h.start:]
	i, found := slices.BinarySearchFunc(live, p, storage.QueuePos.Compare)
	if !found {
		return false
	}
	h.entries = slices.Delete(h.entries, h.start+i, h.start+i+1)
	return true
}

// NeedsRefill reports whether the caller should read more entries from disk:
// memory runs low while the disk holds more.
func (h *Head) NeedsRefill() bool { return !h.complete && h.Len() < h.cap/2+1 }

// Refill appends entries read from disk strictly after Last (or from the
// start of the queue when Head is empty), in order. exhausted says the read
// reached the end of the queue on disk, which makes Head complete.
func (h *Head) Refill(entries []storage.QueuePos, exhausted bool) {
	if h.start > 0 {
		h.entries = append(h.entries[:0], h.entries[h.start:]...)
		h.start = 0
	}
	for _, e := range entries {
		if last, ok := h.Last(); ok && !less(last, e) {
			continue // already in memory (inserted while the read ran)
		}
		h.entries = append(h.entries, e)
	}
	h.complete = exhausted
	h.trim()
}

// Entries returns the entries in memory, oldest first (for QPEEK and tests).
func (h *Head) Entries() []storage.QueuePos {
	return slices.Clone(h.entries[h.start:])
}

func (h *Head) insertSorted(p storage.QueuePos) {
	live := h.entries[h.start:]
	i, found := slices.BinarySearchFunc(live, p, storage.QueuePos.Compare)
	if found {
		return
	}
	h.entries = slices.Insert(h.entries, h.start+i, p)
}

// trim keeps at most cap entries, dropping the newest (still on disk).
func (h *Head) trim() {
	if n := h.Len(); n > h.cap {
		clear(h.entries[h.start+h.cap:])
		h.entries = h.entries[:h.start+h.cap]
		h.complete = false
	}
}

func (h *Head) contains(p storage.QueuePos) bool {
	_, found := slices.BinarySearchFunc(h.entries[h.start:], p, storage.QueuePos.Compare)
	return found
}

func less(a, b storage.QueuePos) bool { return a.Compare(b) < 0 }
