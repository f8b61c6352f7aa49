package storage

import (
	"encoding/binary"
	"slices"
	"strings"
)

// A flush turns neighbouring deletions of a queue's keys into one range
// deletion only after walking Pebble over them for keys that stay
// (runsWithin): a tenth of a consuming server's flush. But the keys a
// consumer deletes are the head a refill (Store.QueueHead) has just read
// from Pebble, in order, and Pebble changes only when the buffer is
// flushed: so while no flush came between, the Pebble keys in the span a
// refill scanned are exactly the ones it read plus the ones the buffer's
// deletions hid from it, and the runs can be cut from that list instead.
// Keys the buffer writes inside the span since (a NACKed job queued again
// at its old ctime) are emitted after the ranges and stay. A flush writes
// such keys into Pebble, so it forgets every span (reset): a span from
// before it would cover them (TestDeletionRunsAfterAFlushWalkPebble).

// readSpan is what refills read of one queue's keys from Pebble since the
// buffer's last flush: every Pebble key strictly after from (fromStart:
// from the queue's first key) up to and including to (toEnd: to the
// queue's end) but those the buffer's deletions hid, in keys, in order.
type readSpan struct {
	from, to         QueuePos
	fromStart, toEnd bool
	keys             []QueuePos
}

// maxSpanKeys bounds a span's keys (24 bytes each): a queue refilled over
// and over within one buffer (a long pause between flushes) forgets its
// span rather than grow it without end; its deletions are walked then.
const maxSpanKeys = 1 << 17

// noteRead records a refill's scan of queue (its key prefix, prefix)
// strictly after after (the zero QueuePos: from the start): the Pebble
// keys it read (fromPebble, in order), the last entry it returned (last,
// from Pebble or the buffer) and whether it reached the queue's end.
func (w *writeBuffer) noteRead(prefix []byte, after QueuePos, fromPebble []QueuePos, last QueuePos, ended bool) {
	if w.spans == nil {
		w.spans = map[string]*readSpan{}
	}
	if !ended && last == (QueuePos{}) {
		return // read nothing and stopped: no span
	}
	sp := w.spans[string(prefix)]
	switch {
	case sp != nil && !sp.toEnd && after != (QueuePos{}) && after == sp.to:
		// Goes on where the last one stopped.
		sp.keys = append(sp.keys, fromPebble...)
	default:
		sp = &readSpan{from: after, fromStart: after == (QueuePos{}), keys: slices.Clone(fromPebble)}
		w.spans[string(prefix)] = sp
	}
	if len(sp.keys) > maxSpanKeys {
		delete(w.spans, string(prefix))
		return
	}
	sp.to, sp.toEnd = last, ended
}

// spanRuns is deletionRuns for one queue's deletions, dels (in key order,
// all of the family fam), using that queue's span if it has one: the
// deletions inside it are cut at the span's keys that are not being
// deleted, without a walk; the ones before and after it are walked
// (runsWithin) as without a span.
func (w *writeBuffer) spanRuns(fam string, dels []*bufEntry) (points []*bufEntry, ranges [][2][]byte, err error) {
	sp := w.spans[fam]
	if sp == nil {
		return w.runsWithin(dels)
	}
	n := len(fam)
	for _, d := range dels {
		if len(d.key) != n+8+JobIDLen {
			return w.runsWithin(dels) // not a queue key's layout: walk
		}
	}
	// dels[a:b] are inside the span.
	a := 0
	if !sp.fromStart {
		a, _ = slices.BinarySearchFunc(dels, sp.from, func(d *bufEntry, p QueuePos) int {
			if c := cmpDelPos(d, n, p); c != 0 {
				return c
			}
			return -1 // from itself is outside: the span starts after it
		})
	}
	b := len(dels)
	if !sp.toEnd {
		b, _ = slices.BinarySearchFunc(dels, sp.to, func(d *bufEntry, p QueuePos) int {
			if c := cmpDelPos(d, n, p); c != 0 {
				return c
			}
			return -1 // to itself is inside
		})
	}
	b = max(a, b)
	walk := func(ds []*bufEntry) error {
		if len(ds) < minDeletionRun {
			points = append(points, ds...)
			return nil
		}
		p, r, err := w.runsWithin(ds)
		points, ranges = append(points, p...), append(ranges, r...)
		return err
	}
	if err := walk(dels[:a]); err != nil {
		return nil, nil, err
	}
	p, r := spanCut(dels[a:b], n, sp.keys)
	points, ranges = append(points, p...), append(ranges, r...)
	w.spanRunsUsed++
	if err := walk(dels[b:]); err != nil {
		return nil, nil, err
	}
	return points, ranges, nil
}

// spanCut splits dels (in key order, inside a span whose Pebble keys are
// keys) into runs cut at every key of keys that is not deleted: the runs
// of at least minDeletionRun deletions become ranges, the rest points.
// A deletion that is not among keys is of a key Pebble does not hold (or
// one the span's scan saw hidden by the buffer's deletion): deleting it
// inside a range is harmless.
func spanCut(dels []*bufEntry, n int, keys []QueuePos) (points []*bufEntry, ranges [][2][]byte) {
	if len(dels) == 0 {
		return nil, nil
	}
	var r deletionRuns
	k := 0 // r.start..k is the run so far
	cut := func() { r.cut(dels, k) }
	i, _ := slices.BinarySearchFunc(keys, dels[0], func(p QueuePos, d *bufEntry) int { return -cmpDelPos(d, n, p) })
	for _, p := range keys[i:] {
		for k < len(dels) && cmpDelPos(dels[k], n, p) < 0 {
			k++
		}
		if k == len(dels) {
			break
		}
		if cmpDelPos(dels[k], n, p) == 0 {
			k++
			continue
		}
		cut() // Pebble holds p and it stays: no range may cover it
	}
	r.cut(dels, len(dels))
	return r.points, r.ranges
}

// cmpDelPos compares the queue key d (of a family n bytes long) with the
// position p, as their keys compare.
func cmpDelPos(d *bufEntry, n int, p QueuePos) int {
	ctime := binary.BigEndian.Uint64(unsafeBytes(d.key[n : n+8]))
	switch {
	case ctime < p.Ctime:
		return -1
	case ctime > p.Ctime:
		return 1
	}
	return strings.Compare(d.key[n+8:], p.ID)
}
