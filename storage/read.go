package storage

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// Reads see every operation that has returned, and possibly operations still
// waiting for their fsync: state is visible once applied, durable once its
// record is. Callers that reply to clients reply only after their own
// operation returned, and the AOF is ordered, so nothing a client is told
// depends on state that a crash could lose. All reads are safe for concurrent
// use with each other and with the operations.

// Job returns the job with id, or ErrNotFound.
func (s *Store) Job(id string) (*Job, error) {
	if err := s.pin(); err != nil {
		return nil, err
	}
	defer s.unpin()
	return s.job(id)
}

// job is Job for a caller that holds the pin.
func (s *Store) job(id string) (*Job, error) {
	if len(id) != JobIDLen {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, id)
	}
	s.mu.Lock()
	j, ok := s.cache.get(id)
	var err error
	if !ok {
		j, ok, err = s.getBuffered(id)
	}
	flushes := s.buf.flushes
	s.mu.Unlock()
	if err != nil {
		return nil, err
	}
	// Not in the buffer: Pebble has the job's latest state (a flush moves
	// a write from the buffer to Pebble under mu).
	if !ok {
		var err error
		if j, err = s.getJob(s.db, id); err != nil {
			return nil, err
		}
		if j != nil {
			s.cacheRead(j, flushes)
		}
	}
	if j == nil {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return j, nil
}

// cacheRead leaves in the job cache a job read from Pebble after mu was
// released, if it is still the job's state: the read came after a look
// that found the job in neither the cache nor the buffer, and only a
// buffer flush changes Pebble's keys while the store is open, so if no
// flush happened since (flushes) and the buffer still knows nothing of
// the job, no write of it happened in between either (a write leaves its
// key in the buffer until a flush). So the operation that usually follows
// a read by id (the ack, nack or working of the job the caller just
// looked at) resolves the job from the cache instead of a second Get.
func (s *Store) cacheRead(j *Job, flushes int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || s.buf.flushes != flushes {
		return
	}
	if _, ok := s.cache.get(j.ID); ok {
		return
	}
	if _, ok := s.buf.lookup(appendJobKey(s.kbuf[:0], j.ID)); ok {
		return
	}
	s.cache.put(j)
}

// Body reads a job's body from the AOF, checking the record's checksum. j
// may be a copy read some time ago: when the read fails, the job is read
// again by id and, if the segment collector moved its body meanwhile, the
// body is read where it is now (see Bodies). A job deleted meanwhile gives
// ErrNotFound.
func (s *Store) Body(j *Job) ([]byte, error) {
	r := s.Bodies([]*Job{j})[0]
	return r.Body, r.Err
}

// BodyResult is one job's body as Bodies read it, or why it could not be.
type BodyResult struct {
	Body []byte
	// Err is nil, ErrNotFound (the job was deleted since the caller read
	// it), or the failure to read or decode the body at the job's current
	// location: the job is there but its body cannot be had.
	Err error
}

// bodyReadAttempts bounds how often Bodies follows a body the collector
// moved while it was being read: each further attempt needs another
// rewrite and checkpoint of the segment in between.
const bodyReadAttempts = 4

// Bodies returns the bodies of jobs, in order, each with its own outcome
// (one unreadable body does not spoil the others): Body for many jobs,
// reading the records that lie close together in the AOF (jobs added
// together, a GETJOB COUNT's usual catch) with one read instead of one each.
//
// The jobs may be copies read before, with no lock held since: the segment
// collector may have moved a body (RewriteSegment) and a checkpoint removed
// its old segment in between. So a body whose read fails is looked for
// again: the job is read by id and, if its BodyLSN changed, read there (up
// to bodyReadAttempts times); a job gone meanwhile reports ErrNotFound.
// Whatever error the first read gave (the wal says ErrNotFound for a
// removed segment, but a segment removed between its lookup and the read
// can surface otherwise), only a failure at the job's current location is
// reported. LSNs are never reused and bodyOf checks the record's job id, so
// a stale LSN never yields another job's body.
func (s *Store) Bodies(jobs []*Job) []BodyResult {
	out := make([]BodyResult, len(jobs))
	if len(jobs) == 0 {
		return out
	}
	if err := s.pin(); err != nil {
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	defer s.unpin()
	lsns := make([]wal.LSN, len(jobs))
	hints := make([]int, len(jobs))
	for i, j := range jobs {
		lsns[i], hints[i] = j.BodyLSN, bodyRecordHint(j)
	}
	recs, errs := s.log.ReadEach(lsns, hints)
	for i, j := range jobs {
		if out[i].Err = errs[i]; out[i].Err == nil {
			out[i].Body, out[i].Err = bodyOf(j, recs[i])
		} else {
			out[i].Err = fmt.Errorf("storage: body of %s at lsn %d: %w", j.ID, j.BodyLSN, out[i].Err)
		}
	}
	for i, j := range jobs {
		for attempt := 1; out[i].Err != nil && attempt < bodyReadAttempts; attempt++ {
			cur, err := s.job(j.ID) // pinned above
			if err != nil {
				// ErrNotFound: deleted since the caller read it.
				out[i] = BodyResult{Err: err}
				break
			}
			if cur.BodyLSN == j.BodyLSN {
				break // where the body is now: the error is the job's
			}
			j = cur
			out[i].Body, out[i].Err = s.readBody(j)
		}
	}
	return out
}

// readBody reads j's body at j.BodyLSN.
func (s *Store) readBody(j *Job) ([]byte, error) {
	r, err := s.log.ReadSized(j.BodyLSN, bodyRecordHint(j))
	if err != nil {
		return nil, fmt.Errorf("storage: body of %s at lsn %d: %w", j.ID, j.BodyLSN, err)
	}
	return bodyOf(j, r)
}

// bodyRecordHint is about the payload size of j's ADD (or MOVE) record: the
// job's header (about 100 bytes, plus its queue name and node ids) and the
// stored body, so that one read gets it all.
func bodyRecordHint(j *Job) int { return int(j.StoredSize) + 128 + len(j.Queue) + 48*len(j.Nodes) }

// bodyOf returns j's body from r, the record at j.BodyLSN. It reads only
// what it needs of the record — the job id, the body's flags and size, the
// stored body — where decodeOp would build the whole op and its job (an
// allocation per field: 5% of a server's CPU under producers and consumers
// at once); recordBody says what it checks. An uncompressed body aliases
// r's payload, which the log's reads (ReadEach, ReadSized) put in memory
// of the caller's that the log never reuses: a copy was an allocation per
// delivered job. The body's caller then holds the record's read (a
// GETJOB's, its jobs' records, read together) until it drops the body.
func bodyOf(j *Job, r wal.Record) ([]byte, error) {
	if r.Type != recAdd && r.Type != recMove && r.Type != recMoveFull {
		return nil, fmt.Errorf("storage: body of %s: lsn %d holds a type %d record", j.ID, j.BodyLSN, r.Type)
	}
	id, stored, compressed, size, err := recordBody(r.Type, r.Payload)
	if err != nil {
		return nil, fmt.Errorf("storage: body of %s: %w", j.ID, err)
	}
	if id != j.ID {
		return nil, fmt.Errorf("storage: body of %s: lsn %d holds job %s", j.ID, j.BodyLSN, id)
	}
	if !compressed {
		if len(stored) == 0 {
			return nil, nil // as decodeOp
		}
		return stored[:len(stored):len(stored)], nil // an append copies
	}
	return decompressBody(stored, compressed, size)
}

// recordBody is the body part of decodeOp for a record that carries one
// (ADD, MOVE, MOVE with the job's state): the job's id (aliasing payload),
// the stored body (aliasing payload), whether it is compressed and its
// size. It checks what decodeOp checks of the body (its flags, its size
// and, uncompressed, its length) and the encoding of the job's header it
// steps over (its version and varints), not the header's values (a
// replay's decodeOp does).
func recordBody(typ wal.RecordType, payload []byte) (id string, stored []byte, compressed bool, size uint32, err error) {
	d := decoder{b: payload}
	if typ == recMove {
		id = unsafeString(d.bytes(JobIDLen))
	} else {
		id = d.skipJobHeader()
	}
	if typ != recAdd {
		d.uvarint() // the MOVE's source
	}
	stored, compressed, size = d.bodyTail()
	if d.err != nil {
		return "", nil, false, 0, fmt.Errorf("%w: type %d: %v", ErrBadRecord, typ, d.err)
	}
	return id, stored, compressed, size, nil
}

// QueuePos is a position in a queue's order: ctime, then id.
type QueuePos struct {
	Ctime uint64
	ID    string
}

// Compare orders positions as a queue does: by ctime, then by id.
func (p QueuePos) Compare(q QueuePos) int {
	if c := cmp.Compare(p.Ctime, q.Ctime); c != 0 {
		return c
	}
	return strings.Compare(p.ID, q.ID)
}

// QueueRange returns up to limit queued entries of queue in order, oldest
// first, strictly after the position after (the zero QueuePos starts at the
// oldest).
func (s *Store) QueueRange(queue string, after QueuePos, limit int) ([]QueuePos, error) {
	prefix := queuePrefix(queue)
	lower := prefix
	if after != (QueuePos{}) {
		lower = append(queueKey(queue, after.Ctime, after.ID), 0)
	}
	return s.queueScan(prefix, lower, limit, false)
}

// QueueNewest returns up to limit queued entries of queue, newest first.
func (s *Store) QueueNewest(queue string, limit int) ([]QueuePos, error) {
	prefix := queuePrefix(queue)
	return s.queueScan(prefix, prefix, limit, true)
}

func (s *Store) queueScan(prefix, lower []byte, limit int, reverse bool) ([]QueuePos, error) {
	return scanPage(s, lower, prefixEnd(prefix), reverse, limit, func(k, _ []byte) (QueuePos, error) {
		ctime, id, err := parseQueueKey(k)
		return QueuePos{Ctime: ctime, ID: id}, err
	})
}

// scanPage returns up to limit items that decode makes of the keys in
// [lower, upper) of the index as it stands (the write buffer over Pebble),
// in key order (reverse order if reverse). It holds mu for the merge.
func scanPage[T any](s *Store, lower, upper []byte, reverse bool, limit int, decode func(k, v []byte) (T, error)) ([]T, error) {
	if limit <= 0 {
		return nil, nil
	}
	var out []T
	var derr error
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // Close sets it under mu before it closes Pebble
		return nil, ErrClosed
	}
	err := s.scanMerged(lower, upper, reverse, func(k, v []byte) bool {
		var x T
		if x, derr = decode(k, v); derr != nil {
			return false
		}
		out = append(out, x)
		return len(out) < limit
	})
	if err = errors.Join(derr, s.indexErr(err)); err != nil {
		return nil, err
	}
	return out, nil
}

// DueEvents returns up to limit schedule events due before the time before
// (Unix ms), in (due, kind, id) order, strictly after the event after (the
// zero Event starts at the earliest).
func (s *Store) DueEvents(before int64, after Event, limit int) ([]Event, error) {
	lower := []byte{prefixSchedule}
	if after != (Event{}) {
		lower = append(scheduleKey(after.Due, after.Kind, after.ID), 0)
	}
	upper := scheduleKey(before, 0, "")
	return scanPage(s, lower, upper, false, limit, func(k, _ []byte) (Event, error) {
		return parseScheduleKey(k)
	})
}

// ScanJobs returns up to limit jobs in id order, with ids strictly greater
// than after ("" starts at the first). Pass the last id returned to go on; an
// empty result ends the scan. Jobs present for the whole scan are returned
// exactly once.
func (s *Store) ScanJobs(after string, limit int) ([]*Job, error) {
	lower := []byte{prefixJob}
	if after != "" {
		lower = append(jobKey(after), 0)
	}
	return scanPage(s, lower, []byte{prefixJob + 1}, false, limit, func(k, v []byte) (*Job, error) {
		return decodeJob(string(k[1:]), v, s.names.Load())
	})
}

// QueueInfo describes one queue.
type QueueInfo struct {
	Name  string
	Len   int64 // queued jobs
	Pause PauseState
}

// QueueLen returns the number of queued jobs in queue (0 if unknown).
func (s *Store) QueueLen(queue string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.queued[queue]
}

// PauseState returns the queue's pause state.
func (s *Store) PauseState(queue string) PauseState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.paused[queue]
}

// Queues returns up to limit queues that have queued jobs or a pause state,
// in name order, with names strictly greater than after.
func (s *Store) Queues(after string, limit int) []QueueInfo {
	s.mu.Lock()
	names := make([]string, 0, len(s.queued)+len(s.paused))
	for q := range s.queued {
		if q > after {
			names = append(names, q)
		}
	}
	for q := range s.paused {
		if _, dup := s.queued[q]; !dup && q > after {
			names = append(names, q)
		}
	}
	slices.Sort(names)
	if len(names) > limit {
		names = names[:max(limit, 0)]
	}
	out := make([]QueueInfo, len(names))
	for i, q := range names {
		out[i] = QueueInfo{Name: q, Len: s.queued[q], Pause: s.paused[q]}
	}
	s.mu.Unlock()
	return out
}

// Stats is a snapshot of the store's counters.
type Stats struct {
	Jobs     int64 // registered jobs
	Queues   int   // queues with queued jobs
	Queued   int64 // queued jobs, all queues
	Applied  wal.LSN
	Segments []SegmentStat // the AOF's segments, oldest first
	Collect  CollectStats
	// AOFEnd is the end of the AOF: every byte ever appended to it,
	// removed segments included. AOFFsyncs counts its fsyncs since Open.
	AOFEnd    wal.LSN
	AOFFsyncs int64
	// WriteBufferBytes is what the index write buffer holds (see
	// Options.WriteBufferSize); WriteBufferFlushes counts its flushes
	// since Open.
	WriteBufferBytes   int64
	WriteBufferFlushes int64
	// RangedDeletions counts the deletions the write buffer's flushes gave
	// Pebble inside a range deletion rather than as point tombstones (a
	// consumed queue head, write_buffer.go deletionRuns), DeletionRanges
	// those ranges, since Open.
	RangedDeletions int64
	DeletionRanges  int64
	// IndexGets counts the point reads the store's reads and commits made
	// in Pebble since Open (a job, a queue key's job, a hold; a delivery's
	// walk over several of one queue's keys counts one): the reads the
	// write buffer and the job cache did not answer.
	IndexGets int64
	// IndexStalls counts the write stalls that ended since Open: spans in
	// which the index had no room (a memtable flush behind, or L0 over
	// its limit: backpressure.go) and writers waited; IndexStallTime is
	// their summed length.
	IndexStalls    int64
	IndexStallTime time.Duration
	// Verify is the background verification of the sealed AOF segments.
	Verify VerifyStats
}

// Stats returns the store's counters. After Close it returns those kept in
// memory and no AOF figures.
func (s *Store) Stats() Stats {
	if err := s.pin(); err != nil {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.countersLocked()
	}
	defer s.unpin()
	segs := s.log.Segments()
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.countersLocked()
	st.AOFEnd, st.AOFFsyncs = s.log.End(), s.log.Fsyncs()
	st.Segments = make([]SegmentStat, len(segs))
	for i, seg := range segs {
		l := s.segments[seg.First]
		st.Segments[i] = SegmentStat{
			First:        seg.First,
			Name:         seg.Name,
			Size:         seg.Size,
			LiveBodies:   l.bodies,
			LiveBytes:    l.bytes,
			Held:         l.held(),
			Active:       i == len(segs)-1,
			Checkpointed: i < len(segs)-1 && seg.First+wal.LSN(seg.Size) <= s.durableApplied,
		}
	}
	return st
}

// countersLocked is Stats' in-memory part. mu is held.
func (s *Store) countersLocked() Stats {
	st := Stats{Jobs: s.jobs, Queues: len(s.queued), Applied: s.applied, Collect: s.collected,
		WriteBufferBytes: s.buf.bytes, WriteBufferFlushes: s.buf.flushes,
		RangedDeletions: s.buf.rangedDeletions, DeletionRanges: s.buf.deletionRanges, Verify: s.verifyStats(),
		IndexGets: s.indexGets.Load()}
	st.IndexStalls, st.IndexStallTime = s.room.stallStats()
	for _, n := range s.queued {
		st.Queued += n
	}
	return st
}

// NodeID returns this store's node id: 40 hex digits, made when the store was
// created and kept across restarts.
func (s *Store) NodeID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nodeID
}

// Durable returns the end of the AOF's durable prefix: every record before
// it is on disk. A job whose BodyLSN is below it was added durably.
func (s *Store) Durable() wal.LSN { return s.log.Durable() }

// Sync makes every operation that has returned durable, whatever the fsync
// policy.
func (s *Store) Sync() error {
	if err := s.pin(); err != nil {
		return err
	}
	defer s.unpin()
	return s.log.Sync()
}

// IndexMetrics returns the Pebble index's metrics (levels, cache, flushes);
// empty ones after Close.
func (s *Store) IndexMetrics() *pebble.Metrics {
	if err := s.pin(); err != nil {
		return &pebble.Metrics{}
	}
	defer s.unpin()
	return s.db.Metrics()
}

// DiskUsage reports the space of the filesystem holding the store. An
// in-memory store reports vfs.ErrUnsupported.
func (s *Store) DiskUsage() (vfs.DiskUsage, error) { return s.opts.FS.GetDiskUsage(s.dir) }
