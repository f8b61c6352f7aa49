package storage

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"unsafe"

	"github.com/cockroachdb/pebble/v2"
	"github.com/google/btree"
)

// writeBuffer holds the index writes of live commits (and of the replay)
// that Pebble has not been given yet: an ordered map from key to its last write, which the
// store hands to Pebble as one batch (flushBufferLocked) when it has grown
// past Options.WriteBufferSize, at a checkpoint, and at close.
//
// Why: a job's index keys mostly live for milliseconds. Added, delivered
// and acked, a job writes and deletes its job key three times, its queue
// key, its ttl and its retry event — nine keys, each of them a memtable
// insert (the random job key the dearest, a full skiplist walk), flushed and
// compacted. In the buffer, the last write of a key replaces the earlier
// ones, and the deletion of a key the buffer itself created (fresh: absent
// from Pebble) removes it: a job whose whole life falls within one buffer
// never reaches Pebble at all. What does reach it arrives in key order, one
// large batch, whose inserts land next to each other.
//
// Crash safety is unchanged: the derived counters and the applied LSN are
// written only with a flush of the buffer, in the same Pebble batch, so the
// index on disk is always the state after some prefix of the AOF, and
// recovery replays the AOF after it as before. Reads see the buffer over
// Pebble (Store.getBuffered, Store.scanMerged). Guarded by Store.mu.
type writeBuffer struct {
	// t holds every key but the job keys and the schedule keys, which go
	// to ids (hashedKeys). Job keys are random (a btree insert is a dozen
	// comparisons, each a cache miss, the dearest part of a write into the
	// buffer) and only looked up in the hot path; schedule keys are only
	// scanned by the timer loader, minutes apart, and mostly live and die
	// within one buffer (a delivered job's retry event, an acked job's TTL
	// event), where a tree insert and delete each were a tenth of a
	// server's CPU under producers and consumers at once. The few scans
	// over either (JSCAN, the loader, each flush) sort them then.
	t     *btree.BTreeG[*bufEntry]
	jobs  hashedKeys
	sched hashedKeys
	// ids holds the entries of both families, job keys and schedule keys,
	// by the job id that ends them: one map entry per job, not one per
	// key. A job's ADD, delivery and ack each write its job key and one or
	// two schedule keys; as separate string-keyed entries each write was a
	// probe of a large map (a cache miss, and another to compare the key
	// in the arena) — a tenth of a server's CPU under producers and
	// consumers at once. The id is the map's key inline, and the keys of
	// one operation find their job's entry in last (lastID), not the map.
	// An id's idKeys and slot (112 bytes) are not counted in bytes, as the
	// per-key maps' slots before them were not: counted, they flushed the
	// buffer 12% more often under producers and consumers at once (0.57
	// flushes per 1,000 jobs of BenchmarkMixed100, against 0.51), more jobs
	// outlived their buffer, and that cost more than the probes saved.
	ids      map[idKey]*idKeys
	idSlab   []idKeys
	lastID   idKey
	lastKeys *idKeys // ids[lastID], or nil
	// dels holds the deletions of keys (other than job keys) that Pebble
	// may hold: tombstones only filter Pebble's keys in a scan, so they need
	// no order until a flush. A consumer's deletions (queue and schedule
	// keys of jobs long in the backlog) were a tenth of its CPU as tree
	// inserts. A key is in t or in dels, not both.
	dels map[string]*bufEntry
	// delOrder is dels' entries in the order they were made (with entries
	// since replaced or dropped, which sortedDels skips): a consumer deletes
	// a queue's head and the jobs' TTL events in nearly key order, which
	// sorts in about linear time, where the map's order sorted at random
	// was a tenth of a consuming server's CPU.
	delOrder []*bufEntry
	// bytes is the memory taken since the last flush: keys, values and
	// entries, counting what later writes replaced (the flush trigger).
	bytes int64
	// rangeDels are range deletions not yet given to Pebble; they come
	// before every entry (the entries they covered were dropped). Reads
	// treat the Pebble keys they cover as deleted (covered).
	rangeDels [][2][]byte
	probe     bufEntry
	// pebble is the index the buffer is flushed to, read by the invariants
	// check of Delete (nil: not checked).
	pebble pebble.Reader
	// Entries and their bytes come from slabs, dropped at each flush: the
	// buffer makes two objects per index write, not four.
	entries []bufEntry
	arena   []byte
	// flushes counts the buffer's flushes (Stats).
	flushes int64
	// rangedDeletions counts the deletions given to Pebble inside a range
	// (deletionRuns) rather than as point tombstones, and deletionRanges
	// those ranges (Stats).
	rangedDeletions, deletionRanges int64
	// spans are what refills read of each queue's keys from Pebble since
	// the last flush, by the queue's key prefix (read_spans.go); emptied
	// by every flush and range deletion. spanRunsUsed counts the runs cut
	// from a span instead of a walk (tests).
	spans        map[string]*readSpan
	spanRunsUsed int64
}

type bufEntry struct {
	key   string // in the arena
	value []byte // in the arena
	del   bool
	// fresh: the key is not in Pebble (the buffer created it), so deleting
	// it needs no tombstone. The writer says so (it knows from the job's
	// state before the write); the buffer refuses a claim it can see is
	// wrong (Set) and, under invariants, checks Pebble before it drops a
	// fresh key without a tombstone (Delete).
	fresh bool
	// gone: a later write of the key replaced this entry, or the entry
	// was dropped (a hashed family's order skips it).
	gone bool
	// job is value decoded, when the writer gave it (SetJob). Jobs are
	// never changed once stored, so readers may share it.
	job *Job
}

// idKey is a job id as a map key, held in the map's slot.
type idKey [JobIDLen]byte

// idKeys is what the buffer holds of one job id's hashed keys: the last
// write of its job key (nil: none) and of each of its schedule keys (a
// job has two or three: its TTL event, a delay or retry event, and a
// deletion of a former one that Pebble holds).
type idKeys struct {
	job   *bufEntry
	sched []*bufEntry // in inl unless it outgrew it
	inl   [3]*bufEntry
}

func (k *idKeys) empty() bool { return k.job == nil && len(k.sched) == 0 }

// bufEntryOverhead approximates an entry's memory beyond its key and value:
// the struct and the tree's slot.
const bufEntryOverhead = 56

const (
	bufSlabEntries = 1024
	bufArenaBlock  = 256 << 10
)

func newWriteBuffer() *writeBuffer {
	return &writeBuffer{
		t:     btree.NewG(32, func(a, b *bufEntry) bool { return a.key < b.key }),
		jobs:  hashedKeys{prefix: prefixJob, keyLen: 1 + JobIDLen},
		sched: hashedKeys{prefix: prefixSchedule, keyLen: 1 + 8 + 1 + JobIDLen, sched: true, ordered: true},
		dels:  map[string]*bufEntry{},
		ids:   map[idKey]*idKeys{},
	}
}

// hashedKeys is one family of keys the buffer keeps by job id rather than
// in its tree: every key starting with prefix, with its last write (a value
// or a deletion). A key of the family keyLen long ends with a job id and is
// held in the buffer's ids; any other (none the store writes) in odd. A key
// of the family is there and nowhere else in the buffer.
type hashedKeys struct {
	prefix byte
	keyLen int
	// sched: the family is the schedule's (several keys per id), not the
	// jobs' (one).
	sched bool
	// n counts the family's entries.
	n   int
	odd map[string]*bufEntry
	// ordered: the family's keys are mostly written in key order (the
	// schedule: due times), so order (every entry made, in the order made,
	// with those since replaced or dropped, marked gone) sorts in about
	// linear time; for random keys (jobs) it is not kept.
	ordered bool
	order   []*bufEntry
	// sortedCache is the family in key order, built by sorted; nil once a
	// key is written again.
	sortedCache []*bufEntry
}

// hashed returns the family of hashed keys key belongs to, or nil (a key
// of the tree).
func (w *writeBuffer) hashed(key []byte) *hashedKeys {
	if len(key) == 0 {
		return nil
	}
	switch key[0] {
	case prefixJob:
		return &w.jobs
	case prefixSchedule:
		return &w.sched
	}
	return nil
}

// keysOf returns the id's entry of ids for key (of a family, keyLen long),
// made if create and there is none; nil if there is none.
func (w *writeBuffer) keysOf(key string, create bool) *idKeys {
	var id idKey
	copy(id[:], key[len(key)-JobIDLen:])
	if w.lastKeys != nil && w.lastID == id {
		return w.lastKeys
	}
	k := w.ids[id]
	if k == nil {
		if !create {
			return nil
		}
		if len(w.idSlab) == cap(w.idSlab) {
			w.idSlab = make([]idKeys, 0, bufSlabEntries)
		}
		w.idSlab = append(w.idSlab, idKeys{})
		k = &w.idSlab[len(w.idSlab)-1]
		k.sched = k.inl[:0]
		w.ids[id] = k
	}
	w.lastID, w.lastKeys = id, k
	return k
}

// get returns the family's entry for key.
func (w *writeBuffer) get(h *hashedKeys, key string) (*bufEntry, bool) {
	if len(key) != h.keyLen {
		e, ok := h.odd[key]
		return e, ok
	}
	k := w.keysOf(key, false)
	if k == nil {
		return nil, false
	}
	if !h.sched {
		return k.job, k.job != nil
	}
	for _, e := range k.sched {
		if e.key == key {
			return e, true
		}
	}
	return nil, false
}

// put makes e the family's entry for its key, replacing the one it had.
func (w *writeBuffer) put(h *hashedKeys, e *bufEntry) {
	h.sortedCache = nil
	if h.ordered {
		h.order = append(h.order, e)
	}
	if len(e.key) != h.keyLen {
		if h.odd == nil {
			h.odd = map[string]*bufEntry{}
		}
		if old, ok := h.odd[e.key]; ok {
			old.gone = true
		} else {
			h.n++
		}
		h.odd[e.key] = e
		return
	}
	k := w.keysOf(e.key, true)
	if !h.sched {
		if k.job != nil {
			k.job.gone = true
		} else {
			h.n++
		}
		k.job = e
		return
	}
	for i, old := range k.sched {
		if old.key == e.key {
			old.gone = true
			k.sched[i] = e
			return
		}
	}
	k.sched = append(k.sched, e)
	h.n++
}

// drop removes the family's entry for key, if any.
func (w *writeBuffer) drop(h *hashedKeys, key string) {
	h.sortedCache = nil
	if len(key) != h.keyLen {
		if old, ok := h.odd[key]; ok {
			old.gone = true
			delete(h.odd, key)
			h.n--
		}
		return
	}
	k := w.keysOf(key, false)
	if k == nil {
		return
	}
	if !h.sched {
		if k.job != nil {
			k.job.gone = true
			k.job = nil
			h.n--
		}
	} else {
		for i, old := range k.sched {
			if old.key == key {
				old.gone = true
				k.sched = slices.Delete(k.sched, i, i+1)
				h.n--
				break
			}
		}
	}
	if k.empty() {
		w.forgetID(key)
	}
}

// forgetID removes the entry of ids of the id that ends key (it holds
// nothing more).
func (w *writeBuffer) forgetID(key string) {
	var id idKey
	copy(id[:], key[len(key)-JobIDLen:])
	delete(w.ids, id)
	if w.lastID == id {
		w.lastKeys = nil
	}
}

// each calls fn for every entry of the family (in no order).
func (w *writeBuffer) each(h *hashedKeys, fn func(*bufEntry)) {
	for _, k := range w.ids {
		if !h.sched {
			if k.job != nil {
				fn(k.job)
			}
			continue
		}
		for _, e := range k.sched {
			fn(e)
		}
	}
	for _, e := range h.odd {
		fn(e)
	}
}

// sorted returns the family's entries in key order.
func (w *writeBuffer) sorted(h *hashedKeys) []*bufEntry {
	if h.sortedCache != nil || h.n == 0 {
		return h.sortedCache
	}
	es := make([]*bufEntry, 0, h.n)
	if !h.ordered {
		w.each(h, func(e *bufEntry) { es = append(es, e) })
	} else {
		for _, e := range h.order {
			if !e.gone { // not replaced or dropped since
				es = append(es, e)
			}
		}
	}
	sortEntries(es)
	h.sortedCache = es
	return es
}

// within reports whether the family may hold keys in [lower, upper)
// (upper "": no bound).
func (h *hashedKeys) within(lower, upper string) bool {
	return h.n > 0 && (upper == "" || upper > string([]byte{h.prefix})) && lower < string([]byte{h.prefix + 1})
}

func (h *hashedKeys) reset() {
	h.n = 0
	h.odd = nil
	clear(h.order)
	h.order = h.order[:0]
	h.sortedCache = nil
}

// isJobKey says whether key is a job key (the buffer's jobs map).
func isJobKey(key []byte) bool { return len(key) > 0 && key[0] == prefixJob }

// alloc returns a copy of b, in the arena unless b is large.
func (w *writeBuffer) alloc(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	if len(b) > bufArenaBlock/8 {
		return bytes.Clone(b)
	}
	if cap(w.arena)-len(w.arena) < len(b) {
		w.arena = make([]byte, 0, bufArenaBlock)
	}
	n := len(w.arena)
	w.arena = append(w.arena, b...)
	return w.arena[n:len(w.arena):len(w.arena)]
}

func (w *writeBuffer) newEntry(key, value []byte, del, fresh bool) *bufEntry {
	if len(w.entries) == cap(w.entries) {
		w.entries = make([]bufEntry, 0, bufSlabEntries)
	}
	w.entries = append(w.entries, bufEntry{key: unsafeString(w.alloc(key)), value: w.alloc(value), del: del, fresh: fresh})
	w.bytes += int64(len(key)+len(value)) + bufEntryOverhead
	return &w.entries[len(w.entries)-1]
}

// decode returns the job e's value encodes.
func (e *bufEntry) decode(id string, names *nodeNames) (*Job, error) {
	if e.job != nil {
		return e.job, nil
	}
	return decodeJob(id, e.value, names)
}

// rangeDeleted is what lookup returns for a key the buffer holds no entry
// for but a pending range deletion covers. Shared: never modified.
var rangeDeleted = &bufEntry{del: true}

// lookup returns the buffer's entry for key: its last write, or a deletion
// (rangeDeleted for a key a pending range deletion covers); false when the
// buffer knows nothing of it (read Pebble then).
func (w *writeBuffer) lookup(key []byte) (*bufEntry, bool) {
	if h := w.hashed(key); h != nil {
		e, ok := w.get(h, unsafeString(key))
		if !ok && w.covered(key) {
			return rangeDeleted, true
		}
		return e, ok
	}
	w.probe.key = unsafeString(key) // only for the lookup: not kept
	e, ok := w.t.Get(&w.probe)
	w.probe.key = ""
	if !ok {
		e, ok = w.dels[unsafeString(key)]
	}
	if !ok && w.covered(key) {
		return rangeDeleted, true
	}
	return e, ok
}

// ErrIndexInvariant is returned (and fails the store) when a write into
// the index would break one of its invariants: a key claimed new (fresh)
// that the index already holds, whose deletion would then leave no
// tombstone and bring the old value back. It is always a bug in the
// store's own code; nothing is written.
var ErrIndexInvariant = errors.New("storage: index invariant violated")

// Set records a write of key. fresh claims that the index does not hold
// key (so deleting it later needs no tombstone); a claim the buffer can see
// is wrong — it holds a live entry for key — is refused with
// ErrIndexInvariant, leaving the buffer as it was. An entry the key already
// had keeps its freshness: the key is in Pebble if it was when the entry
// was made.
func (w *writeBuffer) Set(key, value []byte, fresh bool) error {
	return w.SetJob(key, value, fresh, nil)
}

// SetJob is Set keeping j, the job value encodes, beside it.
func (w *writeBuffer) SetJob(key, value []byte, fresh bool, j *Job) error {
	if h := w.hashed(key); h != nil {
		old, ok := w.get(h, unsafeString(key))
		if ok && fresh && !old.del {
			return freshClaimError(key)
		}
		e := w.newEntry(key, value, false, fresh)
		e.job = j
		if ok {
			e.fresh = old.fresh
		}
		w.put(h, e)
		return nil
	}
	e := w.newEntry(key, value, false, fresh)
	e.job = j
	if old, ok := w.t.ReplaceOrInsert(e); ok {
		// The tree holds live entries only (deletions go to dels or drop
		// the entry), so the key exists.
		if fresh {
			w.t.ReplaceOrInsert(old)
			return freshClaimError(key)
		}
		e.fresh = old.fresh
	} else if old, ok := w.dels[e.key]; ok {
		e.fresh = old.fresh // false: Pebble holds the key
		delete(w.dels, e.key)
	}
	return nil
}

func freshClaimError(key []byte) error {
	return fmt.Errorf("%w: key %q written as new, but the write buffer holds it", ErrIndexInvariant, key)
}

// Delete records the deletion of key; a key the buffer created goes
// without a trace. Under invariants it first checks that Pebble does not
// hold such a key (or that a pending range deletion covers it): otherwise
// the key was wrongly written as fresh, and dropping it would bring
// Pebble's value back, so it fails with ErrIndexInvariant instead.
func (w *writeBuffer) Delete(key []byte) error {
	e := w.newEntry(key, nil, true, false)
	if h := w.hashed(key); h != nil {
		if old, ok := w.get(h, e.key); ok && old.fresh {
			if err := w.checkNotInPebble(key); err != nil {
				return err
			}
			w.drop(h, e.key)
		} else {
			w.put(h, e)
		}
		return nil
	}
	if old, ok := w.t.Delete(e); ok && old.fresh {
		if err := w.checkNotInPebble(key); err != nil {
			w.t.ReplaceOrInsert(old)
			return err
		}
		return nil
	}
	w.dels[e.key] = e
	w.delOrder = append(w.delOrder, e)
	return nil
}

// sortedDels returns the entries of dels in key order.
func (w *writeBuffer) sortedDels() []*bufEntry {
	es := make([]*bufEntry, 0, len(w.dels))
	for _, e := range w.delOrder {
		if w.dels[e.key] == e { // not replaced or dropped since
			es = append(es, e)
		}
	}
	sortEntries(es)
	return es
}

// checkNotInPebble is Delete's invariants check of a fresh key (a no-op
// unless invariants are on and the buffer knows its Pebble).
func (w *writeBuffer) checkNotInPebble(key []byte) error {
	if !invariants || w.pebble == nil || w.covered(key) {
		return nil
	}
	_, closer, err := w.pebble.Get(key)
	switch {
	case errors.Is(err, pebble.ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("storage: invariants check of key %q: %w", key, err)
	}
	closer.Close()
	return fmt.Errorf("%w: key %q was written as new, but the index holds it: deleting it without a tombstone would bring it back",
		ErrIndexInvariant, key)
}

// deleted reports whether key (of the tree) is deleted by the buffer:
// a deletion of it, or a pending range deletion over it.
func (w *writeBuffer) deleted(key []byte) bool {
	_, ok := w.dels[unsafeString(key)]
	return ok || w.covered(key)
}

// covered reports whether a pending range deletion covers key.
func (w *writeBuffer) covered(key []byte) bool {
	for _, r := range w.rangeDels {
		if bytes.Compare(key, r[0]) >= 0 && bytes.Compare(key, r[1]) < 0 {
			return true
		}
	}
	return false
}

// DeleteRange records the deletion of [start, end): the buffer's entries
// in it go, and the range deletion is given to Pebble before the rest.
// Until then reads treat the Pebble keys it covers as deleted (lookup,
// deleted), so nothing depends on when the buffer is flushed.
func (w *writeBuffer) DeleteRange(start, end []byte) error {
	var drop []*bufEntry
	w.t.AscendRange(&bufEntry{key: string(start)}, &bufEntry{key: string(end)}, func(e *bufEntry) bool {
		drop = append(drop, e)
		return true
	})
	for _, e := range drop {
		w.t.Delete(e)
	}
	in := func(k string) bool { return k >= string(start) && k < string(end) }
	for _, h := range []*hashedKeys{&w.jobs, &w.sched} {
		var keys []string
		w.each(h, func(e *bufEntry) {
			if in(e.key) {
				keys = append(keys, e.key)
			}
		})
		for _, k := range keys {
			w.drop(h, k)
		}
		h.sortedCache = nil
	}
	for k := range w.dels {
		if in(k) {
			delete(w.dels, k)
		}
	}
	clear(w.spans)
	w.rangeDels = append(w.rangeDels, [2][]byte{bytes.Clone(start), bytes.Clone(end)})
	return nil
}

// emit writes the buffer into pb: the range deletions (FLUSHALL's, and
// the runs of deletions that deletionRuns turns into ranges), then every
// entry in key order. The ranges come first: a write of a key inside one
// that follows it in the batch has the later sequence number, and stays.
func (w *writeBuffer) emit(pb *pebble.Batch) error {
	for _, r := range w.rangeDels {
		if err := pb.DeleteRange(r[0], r[1], nil); err != nil {
			return err
		}
	}
	// The schedule's deletions join the tree's for the runs (a schedule
	// key sorts after every key dels holds but the resume set's: merge).
	var schedSets, schedDels []*bufEntry
	for _, e := range w.sorted(&w.sched) {
		if e.del {
			schedDels = append(schedDels, e)
		} else {
			schedSets = append(schedSets, e)
		}
	}
	dels := mergeSorted(w.sortedDels(), schedDels)
	points, ranges, err := w.deletionRuns(dels)
	if err != nil {
		return err
	}
	for _, r := range ranges {
		if err := pb.DeleteRange(r[0], r[1], nil); err != nil {
			return err
		}
	}
	w.rangedDeletions += int64(len(dels) - len(points))
	w.deletionRanges += int64(len(ranges))
	put := func(e *bufEntry) bool {
		// The batch copies key and value.
		if e.del {
			err = pb.Delete(unsafeBytes(e.key), nil)
		} else {
			err = pb.Set(unsafeBytes(e.key), e.value, nil)
		}
		return err == nil
	}
	// Runs in key order, which Pebble's memtable inserts fastest: the tree
	// around the job and schedule keys (they sit between the others,
	// keys.go), then the deletions of keys Pebble holds.
	jobsFrom := &bufEntry{key: string([]byte{prefixJob})}
	schedFrom := &bufEntry{key: string([]byte{prefixSchedule})}
	w.t.AscendLessThan(jobsFrom, put)
	for _, e := range w.sorted(&w.jobs) {
		if !put(e) {
			return err
		}
	}
	if err == nil {
		w.t.AscendRange(jobsFrom, schedFrom, put)
	}
	for _, e := range schedSets {
		if err != nil || !put(e) {
			return err
		}
	}
	if err == nil {
		w.t.AscendGreaterOrEqual(schedFrom, put)
	}
	if err == nil {
		for _, e := range points {
			if !put(e) {
				break
			}
		}
	}
	return err
}

// minDeletionRun is the fewest neighbouring deletions deletionRuns turns
// into one range deletion: a range costs Pebble two keys to write, and a
// fragment for every read that crosses it, so a short run stays points.
// A variable so that tests can make runs short.
var minDeletionRun = 16

// deletionRuns splits dels (the buffer's deletions of keys Pebble may hold,
// in key order) into the ones to write as point deletions and ranges
// [start, end) that delete the rest. Consumption deletes a queue's head —
// the queue keys of the jobs delivered, and the TTL events of the jobs
// acked, which were added together and so lie together in the schedule —
// and a hundred neighbouring point tombstones are a hundred memtable
// inserts, a hundred keys flushed and compacted, where one range deletion
// is two. A run is a stretch of deletions within one key family (one
// queue's keys, or the schedule) between which Pebble holds no key that
// stays: it walks Pebble over each candidate stretch and cuts the run at
// every key it finds that is not being deleted. Keys the buffer writes
// inside a range are emitted after it and stay (emit). Keys of other
// families (resume, pause, holds, counters: few) stay points.
func (w *writeBuffer) deletionRuns(dels []*bufEntry) (points []*bufEntry, ranges [][2][]byte, err error) {
	if w.pebble == nil || len(dels) < minDeletionRun {
		return dels, nil, nil
	}
	points = make([]*bufEntry, 0, len(dels))
	for i := 0; i < len(dels); {
		fam := deletionFamily(dels[i].key)
		j := i + 1
		for j < len(dels) && fam != "" && strings.HasPrefix(dels[j].key, fam) {
			j++
		}
		if fam == "" || j-i < minDeletionRun {
			points = append(points, dels[i:j]...)
			i = j
			continue
		}
		var p []*bufEntry
		var r [][2][]byte
		var err error
		if dels[i].key[0] == prefixQueue {
			p, r, err = w.spanRuns(fam, dels[i:j])
		} else {
			p, r, err = w.runsWithin(dels[i:j])
		}
		if err != nil {
			return nil, nil, err
		}
		points = append(points, p...)
		ranges = append(ranges, r...)
		i = j
	}
	return points, ranges, nil // points are in key order: taken from dels in order
}

// deletionFamily is the prefix within which neighbouring deletions may
// become one range: a queue's keys (q <len> <queue>) or the schedule (s);
// "" for any other key.
func deletionFamily(key string) string {
	switch {
	case len(key) >= 3 && key[0] == prefixQueue:
		n := 3 + (int(key[1])<<8 | int(key[2]))
		if n > len(key) {
			return ""
		}
		return key[:n]
	case len(key) > 0 && key[0] == prefixSchedule:
		return key[:1]
	}
	return ""
}

// runsWithin is deletionRuns for one family's deletions, dels (in key
// order, at least minDeletionRun of them). The walk seeks past each key
// that stays to the next deletion, and it gives up (the rest stay points)
// once the runs it found are short on average: deletions scattered among
// keys that stay (a million TTL events due in one millisecond, fired in
// the wheel's order, not the keys') would cost it a seek each and save
// nothing.
func (w *writeBuffer) runsWithin(dels []*bufEntry) (points []*bufEntry, ranges [][2][]byte, err error) {
	last := dels[len(dels)-1].key
	it, err := w.pebble.NewIter(&pebble.IterOptions{
		LowerBound: unsafeBytes(dels[0].key),
		UpperBound: append([]byte(last), 0),
	})
	if err != nil {
		return nil, nil, err
	}
	var r deletionRuns
	k := 0 // r.start..k is the run so far
	cut := func() { r.cut(dels, k) }
	breaks := 0
	for ok := it.First(); ok; {
		key := unsafeString(it.Key())
		for k < len(dels) && dels[k].key < key {
			k++ // not in Pebble: deleting it inside a range is harmless
		}
		if k == len(dels) {
			break
		}
		if dels[k].key == key {
			k++
			ok = it.Next()
			continue
		}
		cut() // Pebble holds key and it stays: no range may cover it
		if breaks++; breaks >= 4 && k < breaks*minDeletionRun {
			break // short runs: the rest stay points
		}
		ok = it.SeekGE(unsafeBytes(dels[k].key))
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return nil, nil, err
	}
	if breaks >= 4 && k < breaks*minDeletionRun {
		r.points = append(r.points, dels[r.start:]...)
		return r.points, r.ranges, nil
	}
	r.cut(dels, len(dels))
	return r.points, r.ranges, nil
}

// deletionRuns splits a flush's sorted deletions into runs, each ended
// where Pebble holds a key that stays: a run of at least minDeletionRun
// deletions becomes one range deletion, a shorter one stays points.
type deletionRuns struct {
	start  int // the first deletion of the run so far
	points []*bufEntry
	ranges [][2][]byte
}

// cut ends the run at dels[k] (exclusive).
func (r *deletionRuns) cut(dels []*bufEntry, k int) {
	if k-r.start >= minDeletionRun {
		r.ranges = append(r.ranges, [2][]byte{[]byte(dels[r.start].key), append([]byte(dels[k-1].key), 0)})
	} else {
		r.points = append(r.points, dels[r.start:k]...)
	}
	r.start = k
}

func cmpEntryKey(a, b *bufEntry) int { return strings.Compare(a.key, b.key) }

// mergeSorted merges two slices of entries in key order.
func mergeSorted(a, b []*bufEntry) []*bufEntry {
	if len(b) == 0 {
		return a
	}
	out := make([]*bufEntry, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		if a[0].key < b[0].key {
			out, a = append(out, a[0]), a[1:]
		} else {
			out, b = append(out, b[0]), b[1:]
		}
	}
	return append(append(out, a...), b...)
}

// reset empties the buffer. The slabs are left to the garbage collector:
// the batch Pebble was given has copied what it needed, and scans copy what
// they keep.
func (w *writeBuffer) reset() {
	w.t.Clear(true)
	w.jobs.reset()
	w.sched.reset()
	clear(w.ids)
	w.idSlab, w.lastKeys = nil, nil
	clear(w.dels)
	clear(w.delOrder)
	w.delOrder = w.delOrder[:0]
	w.bytes = 0
	w.rangeDels = nil
	w.entries, w.arena = nil, nil
	clear(w.spans) // Pebble changed: see read_spans.go
}

// entryCursor yields buffer entries in a scan's order; nil at the end.
type entryCursor interface{ next() *bufEntry }

// cursor walks the buffer's entries in [lower, upper) (upper "": no bound)
// in order, or reverse order.
func (w *writeBuffer) cursor(lower, upper string, reverse bool) entryCursor {
	var c entryCursor = &bufCursor{w: w, lower: lower, upper: upper, reverse: reverse}
	for _, h := range []*hashedKeys{&w.jobs, &w.sched} {
		if !h.within(lower, upper) {
			continue
		}
		es := w.sorted(h)
		at := func(k string) int {
			i, _ := slices.BinarySearchFunc(es, k, func(e *bufEntry, k string) int { return strings.Compare(e.key, k) })
			return i
		}
		lo, hi := at(lower), len(es)
		if upper != "" {
			hi = at(upper)
		}
		c = &twoCursor{a: c, b: &sliceCursor{es: es[lo:max(lo, hi)], reverse: reverse}, reverse: reverse}
	}
	return c
}

// sliceCursor walks a sorted slice of entries.
type sliceCursor struct {
	es      []*bufEntry
	reverse bool
}

func (c *sliceCursor) next() *bufEntry {
	if len(c.es) == 0 {
		return nil
	}
	if c.reverse {
		e := c.es[len(c.es)-1]
		c.es = c.es[:len(c.es)-1]
		return e
	}
	e := c.es[0]
	c.es = c.es[1:]
	return e
}

// twoCursor merges two cursors over disjoint sets of keys.
type twoCursor struct {
	a, b             entryCursor
	ha, hb           *bufEntry
	started, reverse bool
}

func (c *twoCursor) next() *bufEntry {
	if !c.started {
		c.ha, c.hb, c.started = c.a.next(), c.b.next(), true
	}
	switch {
	case c.ha == nil && c.hb == nil:
		return nil
	case c.hb == nil || (c.ha != nil && (c.ha.key < c.hb.key) != c.reverse):
		e := c.ha
		c.ha = c.a.next()
		return e
	default:
		e := c.hb
		c.hb = c.b.next()
		return e
	}
}

// bufCursor walks the buffer's tree (every entry but the job keys and the
// deletions of keys Pebble holds) in [lower, upper) in order (or reverse
// order) a chunk at a time, so that a scan that stops early does not copy
// the whole range.
type bufCursor struct {
	w            *writeBuffer
	lower, upper string // upper "" : no bound
	reverse      bool
	chunk        []*bufEntry
	i            int
	last         string
	started      bool
	done         bool
}

// bufCursorChunk is how many entries a bufCursor copies at a time (tests make
// it small to cross chunks).
var bufCursorChunk = 64

func (c *bufCursor) next() *bufEntry {
	if c.i < len(c.chunk) {
		e := c.chunk[c.i]
		c.i++
		return e
	}
	if c.done {
		return nil
	}
	c.chunk, c.i = c.chunk[:0], 0
	collect := func(e *bufEntry) bool {
		if c.started && e.key == c.last {
			return true // the previous chunk's last entry
		}
		if e.key < c.lower || (c.upper != "" && e.key >= c.upper) {
			return false
		}
		c.chunk = append(c.chunk, e)
		return len(c.chunk) < bufCursorChunk
	}
	switch {
	case !c.reverse && !c.started:
		c.w.t.AscendGreaterOrEqual(&bufEntry{key: c.lower}, collect)
	case !c.reverse:
		c.w.t.AscendGreaterOrEqual(&bufEntry{key: c.last}, collect)
	case !c.started && c.upper == "":
		c.w.t.Descend(collect)
	case !c.started:
		c.w.t.DescendLessOrEqual(&bufEntry{key: c.upper}, func(e *bufEntry) bool {
			if e.key == c.upper {
				return true
			}
			return collect(e)
		})
	default:
		c.w.t.DescendLessOrEqual(&bufEntry{key: c.last}, collect)
	}
	c.started = true
	if len(c.chunk) < bufCursorChunk {
		c.done = true
	}
	if len(c.chunk) == 0 {
		return nil
	}
	c.last = c.chunk[len(c.chunk)-1].key
	c.i = 1
	return c.chunk[0]
}

// scanMerged calls fn for every key in [lower, upper) of the index as it
// stands — the buffer's writes over Pebble's keys — in key order (reverse
// order if reverse), until fn returns false. upper nil: no bound. The
// caller holds mu, so that the buffer and the Pebble iterator are one moment.
func (s *Store) scanMerged(lower, upper []byte, reverse bool, fn func(k, v []byte) bool) error {
	return s.scanMergedFrom(lower, upper, reverse, func(k, v []byte, _ bool) bool { return fn(k, v) })
}

// scanMergedFrom is scanMerged telling fn where each key's value is:
// fromPebble is false for a write the buffer holds.
func (s *Store) scanMergedFrom(lower, upper []byte, reverse bool, fn func(k, v []byte, fromPebble bool) bool) error {
	it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
	if err != nil {
		return err
	}
	cur := s.buf.cursor(string(lower), string(upper), reverse)
	step, ok := it.Next, it.First()
	if reverse {
		step, ok = it.Prev, it.Last()
	}
	e := cur.next()
	for ok || e != nil {
		c := 0
		switch {
		case !ok:
			c = 1
		case e == nil:
			c = -1
		default:
			c = bytes.Compare(it.Key(), unsafeBytes(e.key))
			if reverse {
				c = -c
			}
		}
		var more bool
		switch {
		case c < 0: // Pebble's key, not overwritten (unless deleted)
			more = true
			if !s.buf.deleted(it.Key()) {
				more = fn(it.Key(), it.Value(), true)
			}
			ok = step()
		default: // the buffer's write replaces Pebble's, if any
			more = true
			if !e.del {
				more = fn(unsafeBytes(e.key), e.value, false)
			}
			if c == 0 {
				ok = step()
			}
			e = cur.next()
		}
		if !more {
			break
		}
	}
	return errors.Join(it.Error(), it.Close())
}

// unsafeBytes views s as bytes, for callees that only read them.
func unsafeBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// unsafeString views b as a string, for lookups that do not keep it.
func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }
