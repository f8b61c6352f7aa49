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

// The commit pipeline. A batch of operations takes the store's lock once.
// Each operation in turn is resolved (its job read, its transition checked)
// against the index plus the batch's own earlier operations; a valid one is
// enqueued in the AOF, which fixes its LSN, and its index changes go into
// the write buffer (write_buffer.go). When the buffer is full, the end of the
// batch gives it to Pebble with the derived counters and the applied LSN.
// The lock is released before waiting for the AOF, so batches from many
// goroutines share its writes and fsyncs.

// Result is the outcome of one operation of a Batch.
type Result struct {
	// Job is the job after the operation (nil for deletes and for
	// operations that are not about one job).
	Job *Job
	// Old is the job before the operation (nil for adds and for operations
	// that are not about one job).
	Old *Job
	Err error
	// lsn is where the operation's record went (tests check the log's
	// layout against it).
	lsn wal.LSN
}

// Batch collects lifecycle operations to commit together with Store.Commit.
// A Batch is not safe for concurrent use; it may be reused after Reset.
type Batch struct {
	s   *Store
	ops []*op
	// slab holds the ops jobOp made (one allocation for many).
	slab []op
	// node is the store's node id, read by the first AddNew.
	node string
}

// Len returns the number of operations in the batch.
func (b *Batch) Len() int { return len(b.ops) }

// Reset empties the batch.
func (b *Batch) Reset() { clear(b.ops); b.ops = b.ops[:0]; b.slab = nil }

// commitOne commits a single operation.
func (s *Store) commitOne(o *op) (*Job, error) {
	var res [1]Result
	p := s.apply([]*op{o}, res[:])
	if err := p.Wait(); err != nil {
		return nil, err
	}
	return res[0].Job, res[0].Err
}

// Commit applies the batch's operations in order, each valid on the state
// left by the ones before it. An operation that fails validation
// (ErrNotFound, ErrWrongState, ErrExists) is skipped and the others still
// apply; res[i] tells the outcome of operation i. Commit returns once every
// applied operation is written per the fsync policy; if that fails, every
// applied operation reports the error and the store fails (see ErrFailed).
func (s *Store) Commit(b *Batch) []Result {
	res, p := s.Apply(b)
	if err := p.Wait(); err != nil {
		failApplied(res, err)
	}
	return res
}

// Apply is Commit without the wait: the operations are applied (visible to
// reads) and their records queued for the AOF when it returns, and
// Pending.Wait waits for their durability. A caller that keeps its own
// state next to the store's (the broker's queue heads) applies and updates
// that state under its own lock, then waits outside it; it must not tell a
// client an operation succeeded before Wait returned nil — unless losing it
// to a crash is allowed (the broker answers a GETJOB of at-least-once jobs
// without waiting: a lost delivery only queues the job again). Operations
// are logged in the order they are applied, so a later operation's Wait
// covers every earlier one.
func (s *Store) Apply(b *Batch) ([]Result, Pending) {
	res := make([]Result, len(b.ops))
	p := s.apply(b.ops, res)
	return res, p
}

// Pending is the durability of operations applied by Store.Apply.
type Pending struct {
	s   *Store
	end wal.LSN // 0: nothing to wait for
	// sync: an at-most-once delivery is among the operations, so they
	// must be fsynced whatever the policy.
	sync bool
	err  error
}

// Wait blocks until the operations are written per the fsync policy (and
// fsynced, for at-most-once deliveries). An error means none of them may be
// reported as done; the store has failed (see ErrFailed).
func (p Pending) Wait() error {
	if p.err != nil || p.end == 0 {
		return p.err
	}
	s := p.s
	err := s.log.Wait(p.end)
	if err == nil && p.sync {
		err = s.log.WaitSynced(p.end)
	}
	if err != nil {
		s.fail(err)
		return fmt.Errorf("%w: %w", ErrFailed, err)
	}
	return nil
}

// AtMostOnce says whether an at-most-once delivery is among the
// operations: Wait then fsyncs them whatever the policy.
func (p Pending) AtMostOnce() bool { return p.sync }

// Err is the error Wait would return at once (the store was unusable when
// the operations were applied), without waiting for anything.
func (p Pending) Err() error { return p.err }

// AppliedPending is the durability of every operation applied so far: a
// caller that finds what it needs applied already (by another caller that
// may not have waited for it yet) and writes nothing waits with it before
// it tells anyone.
func (s *Store) AppliedPending() Pending {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil {
		return Pending{err: err}
	}
	if s.applied == 0 {
		return Pending{}
	}
	return Pending{s: s, end: s.applied}
}

func (s *Store) apply(ops []*op, res []Result) Pending {
	// The index's back-pressure, before mu: a writer never waits inside
	// Pebble for a flush or a compaction with mu held (backpressure.go).
	if err := s.waitForIndexRoom(); err != nil {
		for i := range res {
			res[i].Err = err
		}
		return Pending{err: err}
	}
	return s.applyNow(ops, res)
}

// applyNow is apply once the caller has waited for the index's room: the
// checkpoint's forward records wait with waitForIndexRoomToClose, since
// Close's own checkpoint writes them too.
func (s *Store) applyNow(ops []*op, res []Result) Pending {
	s.mu.Lock()
	if err := s.usableLocked(); err != nil {
		s.mu.Unlock()
		for i := range res {
			res[i].Err = err
		}
		return Pending{err: err}
	}
	var overlay map[string]*Job
	if len(ops) > 1 {
		overlay = make(map[string]*Job, len(ops))
	}
	if err := s.prefetchQueued(ops, overlay); err != nil {
		s.mu.Unlock()
		for i := range res {
			res[i].Err = err
		}
		return Pending{err: err}
	}
	w := s.buf
	var end wal.LSN
	var failure error
	// noop: a replica add found its id known; the batch then waits for
	// everything applied before it (that job's records among them).
	noop := false
	for i, o := range ops {
		var old, nj *Job
		var err error
		if o.id != "" && len(o.id) != JobIDLen {
			err = fmt.Errorf("%w: %q", ErrNotFound, o.id)
		} else {
			old, nj, err = s.resolve(overlay, o)
		}
		switch {
		case err != nil:
		case o.typ == recAdd && old != nil && o.replica:
			res[i].Job, res[i].Old = old, old
			noop = true
			continue
		case o.typ == recAdd && old != nil:
			err = fmt.Errorf("%w: %s", ErrExists, o.id)
		case o.typ == recTomb:
			err = s.checkTomb(w, o)
		case o.typ == recNode && o.ifEmpty && s.jobs != 0:
			err = fmt.Errorf("%w: %d jobs; flush them before changing the node id", ErrNotEmpty, s.jobs)
		case o.typ != recAdd && o.id != "" && old == nil:
			err = fmt.Errorf("%w: %s", ErrNotFound, o.id)
		}
		if err != nil {
			res[i].Err = err
			continue
		}
		s.prepareRecord(o, old, nj)
		// Enqueueing fixes the record's LSN (the body's address for an
		// add); it does no I/O (it waits only while more than MaxPending
		// bytes wait for the AOF writer), so holding mu keeps log and
		// index order the same.
		s.scratch = encodeOp(s.scratch[:0], o)
		var lsn wal.LSN
		lsn, end, failure = s.log.Enqueue(wal.Record{Type: o.typ, Payload: s.scratch})
		if failure != nil {
			break
		}
		if failure = s.write(w, o, old, nj, lsn); failure != nil {
			failure = fmt.Errorf("storage: apply lsn %d: %w", lsn, failure)
			break
		}
		s.applied = end
		// A TOMB that leaves the job alone (resolve: nil, nil) changes
		// nothing the batch's later operations read: the id may have a
		// job added again.
		if overlay != nil && o.id != "" && (o.typ != recTomb || old != nil) {
			overlay[o.id] = nj
		}
		res[i].Job, res[i].Old, res[i].lsn = nj, old, lsn
	}
	if noop && failure == nil && s.applied > end {
		end = s.applied
	}
	if end == 0 && failure == nil {
		s.mu.Unlock()
		return Pending{}
	}
	if failure == nil && (len(w.rangeDels) > 0 || w.bytes >= s.opts.WriteBufferSize) {
		failure = s.flushBufferLocked()
	}
	if failure != nil {
		// Records may be in the log but not in the index: only a reopen
		// (which replays them) makes the two agree again.
		s.failLocked(failure)
		s.mu.Unlock()
		failure = fmt.Errorf("%w: %w", ErrFailed, failure)
		failApplied(res, failure)
		return Pending{err: failure}
	}
	kick := int64(end-s.lastCkptEnd) > s.opts.CheckpointBytes
	s.mu.Unlock()
	if kick {
		select {
		case s.ckptKick <- struct{}{}:
		default:
		}
	}
	p := Pending{s: s, end: end}
	for i, o := range ops {
		// At-most-once: the delivery must be durable before the job
		// leaves, so a crash can never deliver it twice.
		if res[i].Err == nil && o.typ == recDeliver && res[i].Job.Retry == 0 {
			p.sync = true
			break
		}
	}
	return p
}

func failApplied(res []Result, err error) {
	for i := range res {
		if res[i].Err == nil {
			res[i] = Result{Err: err}
		}
	}
}

// prefetchQueued reads, for the deliveries in ops that name their queue
// position (Batch.DeliverAt, DeliverQueued) and are neither taken as
// read (DeliverQueued's WriteMark) nor in the job cache, the jobs from the
// values of their queue-order keys (queueValuesLocked): in queue order,
// where a batch's deliveries sit next to each other, instead of a random
// point lookup per job (the lookup was 40% of a consuming server's CPU,
// mostly block-cache misses). It runs under mu before any op of the batch
// applies, so the values are the index's current jobs; it puts them in
// overlay, which resolve reads first.
func (s *Store) prefetchQueued(ops []*op, overlay map[string]*Job) error {
	if overlay == nil {
		return nil
	}
	var want []QueueEntry
	for _, o := range ops {
		if o.typ != recDeliver || o.hintQueue == "" {
			continue
		}
		if o.seen != nil && o.seenAt == (WriteMark{s, s.writes}) {
			o.cached = o.seen // nothing was applied since it was read
			continue
		}
		if j, ok := s.cache.get(o.id); ok {
			o.cached = j
			continue
		}
		want = append(want, QueueEntry{Queue: o.hintQueue, Pos: QueuePos{Ctime: o.hintCtime, ID: o.id}})
	}
	return s.queueValuesLocked(want, func(_ int, j *Job) {
		if j != nil {
			overlay[j.ID] = j
		}
	})
}

// WriteMark is the point in a store's writes at which a read was made
// (QueuedJobs): a batch applied while the store has applied nothing since
// knows the jobs that read returned are still the index's, and skips
// looking them up again (Batch.DeliverQueued). The zero mark matches
// nothing.
type WriteMark struct {
	s *Store
	n uint64
}

// QueueEntry names a queued job by its queue and its position there.
type QueueEntry struct {
	Queue string
	Pos   QueuePos
}

// QueuedJobs returns the jobs at entries as the index holds them now, in
// order: nil for an entry that is no longer queued there (delivered,
// acked, deleted or moved since the caller read the position). It reads
// them as a delivery does (queueValuesLocked: in queue order, from the
// values of the queue-order keys) and leaves them in the job cache, so a
// Batch.DeliverAt of the same jobs applied next costs no further read.
func (s *Store) QueuedJobs(entries []QueueEntry) ([]*Job, WriteMark, error) {
	out := make([]*Job, len(entries))
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.usableLocked(); err != nil && !errors.Is(err, ErrFailed) {
		return nil, WriteMark{}, err
	}
	var want []QueueEntry
	var at []int // want[k] is entries[at[k]]
	for i, e := range entries {
		if j, ok := s.cache.get(e.Pos.ID); ok {
			if j.State == StateQueued && j.Queue == e.Queue && j.Ctime == e.Pos.Ctime {
				out[i] = j
			}
			continue
		}
		want = append(want, e)
		at = append(at, i)
	}
	var old []int // entries whose key carries no job (an index written before it did)
	err := s.queueValuesLocked(want, func(k int, j *Job) {
		if j == nil {
			old = append(old, at[k])
			return
		}
		out[at[k]] = j
		s.cache.put(j)
	})
	if err != nil {
		return nil, WriteMark{}, err
	}
	for _, i := range old {
		j, err := s.currentJob(nil, entries[i].Pos.ID, true)
		if err != nil {
			return nil, WriteMark{}, err
		}
		if j != nil && j.State == StateQueued && j.Queue == entries[i].Queue && j.Ctime == entries[i].Pos.Ctime {
			out[i] = j
			s.cache.put(j)
		}
	}
	return out, WriteMark{s, s.writes}, nil
}

// queueValuesLocked reads the queue-order keys of entries: from the write
// buffer, or else from Pebble with one iterator walk per queue over the
// span of its entries. It calls fn(k, j) for each entries[k] whose key is
// in the index, with the job the key's value carries, or nil if the value
// is empty (an index written before queue keys carried their job); not at
// all for an entry whose key is not (no longer) there. mu must be held.
func (s *Store) queueValuesLocked(entries []QueueEntry, fn func(k int, j *Job)) error {
	type wanted struct {
		pos QueuePos
		k   int
	}
	var byQueue map[string][]wanted
	for k, e := range entries {
		// A queue key written since the buffer's last flush is read there.
		s.kbuf = appendQueueKey(s.kbuf[:0], e.Queue, e.Pos.Ctime, e.Pos.ID)
		if be, ok := s.buf.lookup(s.kbuf); ok {
			switch {
			case be.del:
			case len(be.value) == 0:
				fn(k, nil)
			default:
				j, err := be.decode(e.Pos.ID, s.names.Load())
				if err != nil {
					return err
				}
				fn(k, j)
			}
			continue
		}
		if byQueue == nil {
			byQueue = map[string][]wanted{}
		}
		byQueue[e.Queue] = append(byQueue[e.Queue], wanted{e.Pos, k})
	}
	cmpWanted := func(a, b wanted) int { return a.pos.Compare(b.pos) }
	for queue, want := range byQueue {
		if len(want) == 1 {
			// One key: a point lookup (bloom filters) is cheaper than an
			// iterator over every level.
			if err := s.getQueueValue(queue, want[0].pos, func(j *Job) { fn(want[0].k, j) }); err != nil {
				return err
			}
			continue
		}
		slices.SortFunc(want, cmpWanted)
		lower := queueKey(queue, want[0].pos.Ctime, want[0].pos.ID)
		last := want[len(want)-1].pos
		upper := append(queueKey(queue, last.Ctime, last.ID), 0)
		s.indexGets.Add(1) // a walk in place of len(want) Gets
		it, err := s.db.NewIter(&pebble.IterOptions{LowerBound: lower, UpperBound: upper})
		if err != nil {
			return err
		}
		for ok := it.First(); ok; ok = it.Next() {
			ctime, id, err := parseQueueKey(it.Key())
			if err != nil {
				it.Close()
				return err
			}
			i, found := slices.BinarySearchFunc(want, wanted{pos: QueuePos{Ctime: ctime, ID: id}}, cmpWanted)
			if !found {
				continue
			}
			if len(it.Value()) == 0 {
				fn(want[i].k, nil)
				continue
			}
			j, err := decodeJob(id, it.Value(), s.names.Load())
			if err != nil {
				it.Close()
				return err
			}
			fn(want[i].k, j)
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return err
		}
	}
	return nil
}

// getQueueValue is queueValuesLocked for one entry in Pebble: fn(j), with
// nil for an empty value, if the key is there.
func (s *Store) getQueueValue(queue string, p QueuePos, fn func(j *Job)) error {
	s.kbuf = appendQueueKey(s.kbuf[:0], queue, p.Ctime, p.ID)
	s.indexGets.Add(1)
	v, closer, err := s.db.Get(s.kbuf)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	defer closer.Close()
	if len(v) == 0 {
		fn(nil)
		return nil
	}
	j, err := decodeJob(p.ID, v, s.names.Load()) // copies what it keeps
	if err != nil {
		return err
	}
	fn(j)
	return nil
}

// prepareRecord completes what a live operation's record carries from the
// job it applies to: a MOVE or SNAP carries the job's whole state, a DEL the
// job's creator LSNs (see Job.creatorLSNs).
func (s *Store) prepareRecord(o *op, old, nj *Job) {
	switch o.typ {
	case recMoveFull, recSnap:
		o.job = nj
	case recDel:
		o.creators = s.present(old.creators())
	case recMeta:
		o.node, o.pauses, o.maxCtime = s.nodeID, maps.Clone(s.paused), s.maxCtime
	}
}

// checkTomb refuses a live TOMB of a deletion that no longer holds
// anything (accounting.go): it was copied forward already, and copying it
// again would take over nothing. Called with mu held.
func (s *Store) checkTomb(b *writeBuffer, o *op) error {
	held, err := s.heldAt(b, o.src, o.creators)
	if err == nil && len(held) == 0 {
		err = fmt.Errorf("%w: the deletion of %s at lsn %d is not held (copied forward already)", ErrNotFound, o.id, o.src)
	}
	o.held = held
	return err
}

// createdBy reports whether j's latest creator (the record a replay took
// its state from last) is among lsns, the creators of a deleted job: j is
// that incarnation of its id. Not any creator: in a rebuild a later
// incarnation whose ADD was collected continues from its own MOVE or SNAP,
// which inherits the earlier one's creators, but its latest is its own.
func createdBy(j *Job, lsns []wal.LSN) bool {
	c := j.creators()
	return slices.Contains(lsns, c[len(c)-1])
}

// present returns the LSNs of lsns whose segments the AOF still holds (a
// new slice).
func (s *Store) present(lsns []wal.LSN) []wal.LSN {
	out := make([]wal.LSN, 0, len(lsns)+1)
	for _, l := range lsns {
		if _, ok := s.log.SegmentOf(l); ok {
			out = append(out, l)
		}
	}
	return out
}

// resolve reads the job a record concerns (jobs in overlay, which an
// earlier operation of the same batch produced, take precedence; then the
// job cache, the write buffer and Pebble) and computes its next state with
// transition. Records that are not about one job resolve
// to nil, nil.
func (s *Store) resolve(overlay map[string]*Job, o *op) (old, nj *Job, err error) {
	if o.typ == recNode || o.typ == recPause || o.typ == recFlush || o.typ == recMeta {
		return nil, nil, nil
	}
	if !o.fresh { // a fresh id is new: there is nothing to read
		// A first REPLJOB the store can prove new reads memory only.
		o.firstFast = o.typ == recAdd && s.firstFastLocked(o)
		if j, ok := overlay[o.id]; ok {
			old = j
		} else if o.cached != nil {
			old = o.cached // the cache's, read under this hold of mu: current
		} else if old, err = s.currentJob(nil, o.id, !o.firstFast); err != nil {
			return nil, nil, err
		}
	}
	switch {
	case o.typ == recAdd:
		// The op's job is its own (addOp copied it, or the caller handed
		// it over, or the replay decoded it): it becomes the stored job.
		o.job.StoredSize = uint32(len(o.body))
		return old, o.job, nil
	case o.typ == recTomb:
		// The copy of a deletion. Live, the job was deleted when the DEL
		// was logged: one of the id that exists was added again since,
		// and stays. A replay may have the deleted job (its DEL was
		// collected): it goes, but not an incarnation added again.
		if !o.replay || old == nil || !createdBy(old, o.creators) {
			return nil, nil, nil
		}
		return old, nil, nil
	case o.replay && (o.typ == recMoveFull || o.typ == recSnap):
		// The record holds the job's whole state: it is the job, whatever
		// the index held (in a rebuild, the history before it may be gone).
		j := *o.job
		if o.typ == recMoveFull {
			j.StoredSize = uint32(len(o.body))
		}
		return old, &j, nil
	}
	if old == nil {
		return nil, nil, nil
	}
	if o.qtimeFn != nil {
		o.qtime = o.qtimeFn(old)
	}
	if o.nodesFn != nil {
		o.nodes = nil
		if n := o.nodesFn(old); len(n) > 0 {
			o.nodes = slices.Clone(n)
		}
	}
	nj, err = transition(old, o)
	if err != nil && o.rebuild {
		// In a rebuild, a record whose job's history was collected may
		// not apply to the state the replay has so far; the SNAP written
		// forward when that history went sets the job right later.
		return nil, nil, nil
	}
	return old, nj, err
}

// currentJob returns the job with id as the batch so far left it: from
// overlay, the job cache, the write buffer or else Pebble; nil if there is
// none. Without pebble it does not read Pebble.
func (s *Store) currentJob(overlay map[string]*Job, id string, pebble bool) (*Job, error) {
	if j, ok := overlay[id]; ok {
		return j, nil
	}
	if j, ok := s.cache.get(id); ok {
		return j, nil
	}
	j, found, err := s.getBuffered(id)
	if err != nil || found {
		return j, err
	}
	if !pebble {
		return nil, nil
	}
	return s.getJob(s.db, id)
}

// write adds a resolved record's effects to b. Live operations and replay
// both end here, so the index is a function of the log. Counters are
// updated in memory and marked dirty; a buffer flush writes them.
func (s *Store) write(b *writeBuffer, o *op, old, nj *Job, lsn wal.LSN) error {
	s.writes++
	switch o.typ {
	case recNode:
		s.setNodeID(o.node)
		return b.Set(keyNodeID, []byte(o.node), false)
	case recFlush:
		return s.flushAll(b)
	case recPause:
		return s.setPause(b, o.queue, o.pause)
	case recMeta:
		s.maxCtime = max(s.maxCtime, o.maxCtime)
		if s.nodeID != o.node && o.node != "" {
			s.setNodeID(o.node)
			if err := b.Set(keyNodeID, []byte(o.node), false); err != nil {
				return err
			}
		}
		var errs []error
		for q := range s.paused {
			if _, ok := o.pauses[q]; !ok {
				errs = append(errs, s.setPause(b, q, PauseNone))
			}
		}
		for q, p := range o.pauses {
			if s.paused[q] != p {
				errs = append(errs, s.setPause(b, q, p))
			}
		}
		return errors.Join(errs...)
	}
	switch {
	case nj == nil:
	case o.typ == recAdd:
		nj.BodyLSN = lsn
		s.firstAddedLocked(o)
	case o.typ == recMove, o.typ == recMoveFull, o.typ == recSnap:
		// A new creator (see Job.creatorLSNs): the job's earlier ones (and
		// its body's record) stay while their segments do. (A MOVE of an
		// older build carries no job state, and a replay cannot create the
		// job from it: forward.go says what that means for a rebuild.)
		base := []wal.LSN{nj.BodyLSN} // a SNAP's body
		if o.typ != recSnap {
			base[0] = o.src // a MOVE's source
			nj.BodyLSN = lsn
		}
		if old != nil {
			base = append(slices.Clone(old.creators()), base...)
		}
		nj.creatorLSNs = append(s.present(dedupLSNs(base)), lsn)
	}
	switch o.typ {
	case recDel:
		// Needed while the job's creators are in the AOF (accounting.go).
		if err := s.addHolds(b, lsn, o.creators); err != nil {
			return err
		}
	case recTomb:
		// A deletion the collector copied forward: the copy holds now.
		if err := s.takeHolds(b, o.src, o.creators, o.held); err != nil {
			return err
		}
		if err := s.addHolds(b, lsn, o.creators); err != nil {
			return err
		}
	}
	if old == nil && nj == nil {
		// A transition of a job deleted earlier in the log: nothing to do.
		return nil
	}
	switch {
	case o.typ == recAdd:
		// The buffer holds a new job until Pebble has it (and the batch's
		// overlay within the batch): caching it too is work for nothing
		// when the job is not consumed soon. An ADD that replaces a job (a
		// rebuild's earlier incarnation of the id) must not leave it there.
		if old != nil {
			s.cache.drop(old.ID)
		}
	case nj != nil:
		s.cache.put(nj)
	default:
		s.cache.drop(old.ID)
	}
	return s.putJob(b, old, nj)
}

// setPause records a queue's pause state.
func (s *Store) setPause(b *writeBuffer, queue string, p PauseState) error {
	if p == PauseNone {
		delete(s.paused, queue)
		return b.Delete(pauseKey(queue))
	}
	s.paused[queue] = p
	return b.Set(pauseKey(queue), []byte{byte(p)}, false)
}

// dedupLSNs sorts lsns and drops repeats (in place).
func dedupLSNs(lsns []wal.LSN) []wal.LSN {
	slices.Sort(lsns)
	return slices.Compact(lsns)
}

// flushAll adds to b the deletion of every job and pause state: one range
// deletion per key family instead of a point deletion per key, so that
// flushing ten million jobs is one small batch, and Pebble drops the
// covered keys wholesale when it compacts. The derived counters start from
// zero; every AOF segment before this record holds only dead bodies now.
func (s *Store) flushAll(b *writeBuffer) error {
	var errs []error
	s.firstFlushedLocked()
	// The table of interned node ids stays: numbers are never reused
	// (nodenames.go).
	for _, p := range []byte{prefixJob, prefixQueue, prefixSchedule, prefixCount, prefixSegment, prefixHold, prefixPause, prefixResume} {
		errs = append(errs, b.DeleteRange([]byte{p}, []byte{p + 1}))
	}
	clear(s.queued)
	clear(s.paused)
	clear(s.segments)
	// Counters dirtied earlier in the batch were deleted by the ranges.
	clear(s.dirtyQueues)
	clear(s.dirtySegments)
	s.jobs = 0
	s.cache.reset()
	return errors.Join(errs...)
}

// putJob writes the index changes that take a job from old to nj (either may
// be nil) and updates the derived counters.
func (s *Store) putJob(b *writeBuffer, old, nj *Job) error {
	// Keys and values are built in scratch buffers (guarded by mu): the
	// batch copies them.
	var err error
	// fresh: the key is new to the index (see writeBuffer).
	set := func(k, v []byte, fresh bool) {
		if e := b.Set(k, v, fresh); e != nil && err == nil {
			err = e
		}
	}
	setJob := func(k, v []byte, fresh bool) {
		if e := b.SetJob(k, v, fresh, nj); e != nil && err == nil {
			err = e
		}
	}
	del := func(k []byte) {
		if e := b.Delete(k); e != nil && err == nil {
			err = e
		}
	}
	if nj != nil {
		// Before the value that refers to them (nodenames.go).
		if e := s.internLocked(b, nj.Nodes); e != nil {
			return e
		}
		s.vbuf = encodeJob(s.vbuf[:0], nj, s.nodeID, s.nodeNumber)
		s.kbuf = appendJobKey(s.kbuf[:0], nj.ID)
		setJob(s.kbuf, s.vbuf, old == nil)
	} else {
		s.kbuf = appendJobKey(s.kbuf[:0], old.ID)
		del(s.kbuf)
		s.firstDeletedLocked(old.ID)
	}
	// Queue order.
	wasQueued := old != nil && old.State == StateQueued
	isQueued := nj != nil && nj.State == StateQueued
	if wasQueued && (!isQueued || old.Queue != nj.Queue || old.Ctime != nj.Ctime) {
		s.kbuf = appendQueueKey(s.kbuf[:0], old.Queue, old.Ctime, old.ID)
		del(s.kbuf)
		s.collected.OrderDeletes++
		s.addQueued(old.Queue, -1)
	}
	if isQueued {
		// The queue-order key carries the job as its value, rewritten with
		// every change of a queued job (a MOVE, say), so that deliveries
		// read jobs in queue order instead of one random lookup each
		// (prefetchQueued). An empty value (an index written before this)
		// just means no such copy.
		newKey := !wasQueued || old.Queue != nj.Queue || old.Ctime != nj.Ctime
		s.kbuf = appendQueueKey(s.kbuf[:0], nj.Queue, nj.Ctime, nj.ID)
		setJob(s.kbuf, s.vbuf, newKey)
		if newKey {
			s.addQueued(nj.Queue, +1)
		}
	}
	// The resume set (resume.go).
	if wasR, isR := needsResume(old), needsResume(nj); wasR && !isR {
		s.kbuf = appendResumeKey(s.kbuf[:0], old.ID)
		del(s.kbuf)
	} else if isR && !wasR {
		s.kbuf = appendResumeKey(s.kbuf[:0], nj.ID)
		set(s.kbuf, nil, true)
	}
	// Schedule.
	oldEv, on := events(old)
	newEv, nn := events(nj)
	for _, e := range oldEv[:on] {
		if !containsEvent(newEv[:nn], e) {
			s.kbuf = appendScheduleKey(s.kbuf[:0], e.Due, e.Kind, e.ID)
			del(s.kbuf)
			s.collected.OrderDeletes++
		}
	}
	for _, e := range newEv[:nn] {
		if !containsEvent(oldEv[:on], e) {
			s.kbuf = appendScheduleKey(s.kbuf[:0], e.Due, e.Kind, e.ID)
			set(s.kbuf, nil, true)
		}
	}
	// The job's anchor (accounting.go), its count and its body's segment.
	s.moveAnchor(old, nj)
	switch {
	case old == nil && nj != nil:
		s.jobs++
		s.addLive(nj, +1)
		s.maxCtime = max(s.maxCtime, nj.Ctime)
	case old != nil && nj == nil:
		s.jobs--
		s.addLive(old, -1)
	case old.BodyLSN != nj.BodyLSN:
		s.addLive(old, -1)
		s.addLive(nj, +1)
	}
	return err
}

func containsEvent(evs []Event, e Event) bool {
	for _, x := range evs {
		if x == e {
			return true
		}
	}
	return false
}

func (s *Store) addQueued(queue string, delta int64) {
	if n := s.queued[queue] + delta; n > 0 {
		s.queued[queue] = n
	} else {
		delete(s.queued, queue)
	}
	s.dirtyQueues[queue] = struct{}{}
}

func (s *Store) addLive(j *Job, sign int64) {
	seg, ok := s.log.SegmentOf(j.BodyLSN)
	if !ok && s.rebuilding {
		// A SNAP replayed in a rebuild names the body where it was then;
		// the collector's MOVE after it says where it is.
		return
	}
	if !ok {
		// A checkpoint removes only segments with no live body, so this is
		// damage (or a bug). It is counted and logged, and no segment is
		// charged: charging the neighbour (as SegmentOf once answered for
		// an LSN inside a removed segment) could make a segment holding
		// live bodies look dead, and the next checkpoint delete it.
		s.collected.MisplacedBodies++
		s.opts.Logger.Error("storage: a job's body is in an aof segment that was removed; its accounting is skipped",
			"job", j.ID, "lsn", j.BodyLSN)
		return
	}
	s.changeSegment(seg, func(l *segmentLive) {
		l.bodies += sign
		l.bytes += sign * int64(j.StoredSize)
	})
}

// flushBufferLocked gives the write buffer to Pebble: its writes, the dirty
// counters and the applied LSN, in one batch, so the index is again the
// state after a prefix of the AOF.
func (s *Store) flushBufferLocked() error {
	// One batch serves every flush: a fresh one per flush was a 2 MiB
	// allocation, 15% of the bytes a producing server allocated.
	if s.flushBatch == nil {
		initial := min(max(2*s.opts.WriteBufferSize, 64<<10), flushBatchRetained)
		s.flushBatch = s.db.NewBatch(pebble.WithInitialSizeBytes(int(initial)),
			pebble.WithMaxRetainedSizeBytes(flushBatchRetained))
	}
	b := s.flushBatch
	err := s.buf.emit(b)
	if err == nil {
		err = s.writeMetaLocked(b)
	}
	if err == nil {
		err = b.Commit(pebble.NoSync)
	}
	if err == nil {
		s.room.add(b)
	}
	if err != nil {
		s.flushBatch = nil
		b.Close()
		return err
	}
	b.Reset()
	s.buf.reset()
	s.buf.flushes++
	return nil
}

// flushBatchRetained bounds the memory the reused flush batch keeps.
const flushBatchRetained = 16 << 20

// writeMetaLocked writes into b the counters dirtied since the last flush
// (deleting those back to zero), the applied LSN and the job count, and
// marks the counters clean.
func (s *Store) writeMetaLocked(b *pebble.Batch) error {
	var errs []error
	for q := range s.dirtyQueues {
		if n := s.queued[q]; n > 0 {
			errs = append(errs, b.Set(countKey(q), binary.AppendUvarint(nil, uint64(n)), nil))
		} else {
			errs = append(errs, b.Delete(countKey(q), nil))
		}
	}
	clear(s.dirtyQueues)
	for seg := range s.dirtySegments {
		if l, ok := s.segments[seg]; ok {
			errs = append(errs, b.Set(segmentKey(uint64(seg)), l.encode(nil), nil))
		} else {
			errs = append(errs, b.Delete(segmentKey(uint64(seg)), nil))
		}
	}
	clear(s.dirtySegments)
	errs = append(errs, b.Set(keyState, encodeState(indexState{applied: s.applied, jobs: s.jobs, maxCtime: s.maxCtime}), nil))
	return errors.Join(errs...)
}

// Join returns a Pending that waits for both p and q.
func (p Pending) Join(q Pending) Pending {
	if p.err != nil {
		return p
	}
	if q.err != nil {
		return q
	}
	out := p
	if q.end > p.end {
		out = q
	}
	if out.s == nil {
		out.s = q.s
	}
	out.sync = p.sync || q.sync
	return out
}
