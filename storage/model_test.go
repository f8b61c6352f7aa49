package storage

// A plain in-memory model of the store, written from the lifecycle contract
// (ops.go, doc.go's invariants, SPEC.md), and the helpers the
// recovery-equivalence and crash tests share: a history of model steps keyed
// by AOF LSN, runners that apply an operation or a Batch to a store and the
// model and check they agree, and a checker that compares a whole store with
// a model. The operation generator is in equivalence_test.go.

import (
	"bytes"
	"cmp"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"reflect"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/diskque/diskque/wal"
)

var eqSeedFlag = flag.Uint64("storage.eqseed", 0,
	"seed of the randomised storage model tests (0: from the clock; env DISKQUE_STORAGE_SEED works too)")

// modelSeed returns the seed of a randomised test and logs it so that a
// failure can be replayed.
func modelSeed(t testing.TB) uint64 {
	t.Helper()
	seed := *eqSeedFlag
	if v := os.Getenv("DISKQUE_STORAGE_SEED"); seed == 0 && v != "" {
		var err error
		if seed, err = strconv.ParseUint(v, 10, 64); err != nil {
			t.Fatalf("DISKQUE_STORAGE_SEED=%q: %v", v, err)
		}
	}
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (replay with -storage.eqseed=%d or DISKQUE_STORAGE_SEED=%d)", seed, seed, seed)
	return seed
}

// mjob is what the model expects of one job: Job() and Body().
type mjob struct {
	job  Job
	body []byte
}

// jobModel is the expected state of a store.
type jobModel struct {
	jobs   map[string]*mjob
	ids    []string // the keys of jobs, sorted
	paused map[string]PauseState
}

func newJobModel() *jobModel {
	return &jobModel{jobs: map[string]*mjob{}, paused: map[string]PauseState{}}
}

func (m *jobModel) clone() *jobModel {
	c := newJobModel()
	for id, j := range m.jobs {
		cj := *j
		c.jobs[id] = &cj
	}
	c.ids = slices.Clone(m.ids)
	maps.Copy(c.paused, m.paused)
	return c
}

type mopKind uint8

const (
	mopAdd mopKind = iota
	mopQueue
	mopDeliver
	mopRequeue
	mopNack
	mopWorking
	mopDequeue
	mopAck
	mopDelete
	mopPause
	mopFlush
	numMops
)

var mopNames = [numMops]string{"add", "queue", "deliver", "requeue", "nack", "working", "dequeue", "ack", "delete", "pause", "flushall"}

// mop is one lifecycle operation.
type mop struct {
	kind  mopKind
	id    string
	qtime int64
	awake int64
	job   *Job   // add: the job as given to Add (not modified)
	body  []byte // add
	queue string // pause
	pause PauseState
}

func (o *mop) String() string {
	switch o.kind {
	case mopAdd:
		return fmt.Sprintf("add %s %s state=%s retry=%d awake=%d qtime=%d body=%d", o.id, o.job.Queue, o.job.State, o.job.Retry, o.job.AwakeTime, o.job.QueueTime, len(o.body))
	case mopPause:
		return fmt.Sprintf("pause %s %s", o.queue, o.pause)
	}
	return fmt.Sprintf("%s %q qtime=%d awake=%d", mopNames[o.kind], o.id, o.qtime, o.awake)
}

// run applies o to the store.
func (o *mop) run(s *Store) (*Job, error) {
	switch o.kind {
	case mopAdd:
		j := *o.job
		err := s.Add(&j, o.body)
		return &j, err
	case mopQueue:
		return s.Queue(o.id, o.qtime)
	case mopDeliver:
		return s.Deliver(o.id, o.qtime)
	case mopRequeue:
		return s.Requeue(o.id, o.qtime)
	case mopNack:
		return s.Nack(o.id, o.qtime, o.awake)
	case mopWorking:
		return s.Working(o.id, o.qtime)
	case mopDequeue:
		return s.Dequeue(o.id)
	case mopAck:
		return s.Ack(o.id)
	case mopDelete:
		return nil, s.Delete(o.id)
	case mopPause:
		return nil, s.Pause(o.queue, o.pause)
	case mopFlush:
		return nil, s.FlushAll().Wait()
	}
	panic("unknown op")
}

// nextJob is the model's state machine: the job cur becomes under o, or the
// error the store must return. Delete and pause are handled by the caller.
func nextJob(cur Job, o *mop) (Job, error) {
	retryTime := func(q int64) int64 {
		if cur.Retry == 0 {
			return 0
		}
		return q
	}
	j := cur
	if cur.State == StateAcked {
		return j, ErrWrongState // an acked job only waits to be deleted
	}
	if cur.Retry == 0 && cur.Deliveries > 0 && (o.kind == mopQueue || o.kind == mopRequeue || o.kind == mopNack) {
		return j, ErrWrongState // SPEC.md: a delivered RETRY 0 job is never queued again
	}
	switch o.kind {
	case mopQueue: // active or wait-repl → queued
		if cur.State == StateQueued {
			return j, ErrWrongState
		}
		j.State, j.AwakeTime, j.QueueTime = StateQueued, 0, retryTime(o.qtime)
	case mopDeliver:
		if cur.State != StateQueued {
			return j, ErrWrongState
		}
		j.State, j.QueueTime = StateActive, retryTime(o.qtime)
		j.Deliveries++
	case mopRequeue:
		if cur.State != StateActive {
			return j, ErrWrongState
		}
		if cur.Deliveries > 0 {
			j.AdditionalDeliveries++
		}
		j.State, j.AwakeTime, j.QueueTime = StateQueued, 0, retryTime(o.qtime)
	case mopNack:
		if cur.State != StateActive {
			return j, ErrWrongState
		}
		j.Nacks++
		if o.awake != 0 { // NACK … DELAY: waits like a delayed job
			j.AwakeTime, j.QueueTime = o.awake, 0
		} else {
			j.State, j.AwakeTime, j.QueueTime = StateQueued, 0, retryTime(o.qtime)
		}
	case mopWorking: // postpones the requeue, in any unacked state
		if cur.Retry == 0 {
			return j, ErrWrongState
		}
		j.QueueTime = o.qtime
	case mopDequeue:
		if cur.State != StateQueued {
			return j, ErrWrongState
		}
		j.State = StateActive
	case mopAck:
		j.State, j.QueueTime, j.AwakeTime = StateAcked, 0, 0
	default:
		panic("nextJob of " + o.String())
	}
	return j, nil
}

// next returns what o does to the model: the job after it (nil for delete
// and pause) or the error the store must return. It changes nothing. An Add's
// job lacks BodyLSN and StoredSize, which only the store knows.
func (m *jobModel) next(o *mop) (*Job, error) {
	if o.kind == mopPause || o.kind == mopFlush {
		return nil, nil
	}
	cur := m.jobs[o.id]
	if o.kind == mopAdd {
		if cur != nil {
			return nil, ErrExists
		}
		j := *o.job
		j.Nacks, j.AdditionalDeliveries, j.Deliveries = 0, 0, 0
		j.BodySize, j.BodyLSN, j.StoredSize = uint32(len(o.body)), 0, 0
		return &j, nil
	}
	if cur == nil {
		return nil, ErrNotFound
	}
	if o.kind == mopDelete {
		return nil, nil
	}
	j, err := nextJob(cur.job, o)
	if err != nil {
		return nil, err
	}
	return &j, nil
}

// apply records a successful o; nj is the job after it as the store returned
// it (for Add, with its BodyLSN and StoredSize).
func (m *jobModel) apply(o *mop, nj *Job) {
	switch o.kind {
	case mopFlush:
		clear(m.jobs)
		m.ids = nil
		clear(m.paused)
	case mopPause:
		if o.pause == PauseNone {
			delete(m.paused, o.queue)
		} else {
			m.paused[o.queue] = o.pause
		}
	case mopDelete:
		delete(m.jobs, o.id)
		if i, ok := slices.BinarySearch(m.ids, o.id); ok {
			m.ids = slices.Delete(m.ids, i, i+1)
		}
	case mopAdd:
		m.jobs[o.id] = &mjob{job: *nj, body: o.body}
		if i, ok := slices.BinarySearch(m.ids, o.id); !ok {
			m.ids = slices.Insert(m.ids, i, o.id)
		}
	default:
		m.jobs[o.id].job = *nj
	}
}

// queued returns queue's queued jobs in queue order: ctime, then id.
func (m *jobModel) queued(queue string) []QueuePos {
	var out []QueuePos
	for _, j := range m.jobs {
		if j.job.Queue == queue && j.job.State == StateQueued {
			out = append(out, QueuePos{Ctime: j.job.Ctime, ID: j.job.ID})
		}
	}
	slices.SortFunc(out, func(a, b QueuePos) int {
		return cmp.Or(cmp.Compare(a.Ctime, b.Ctime), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// events is the schedule the model implies: delay at AwakeTime, retry at
// QueueTime while active, ttl at Etime, in (due, kind, id) order.
func (m *jobModel) events() []Event {
	var out []Event
	for _, j := range m.jobs {
		if j.job.AwakeTime != 0 {
			out = append(out, Event{Due: j.job.AwakeTime, Kind: EventDelay, ID: j.job.ID})
		}
		if j.job.QueueTime != 0 && j.job.State == StateActive { // doc.go: only an active job is requeued
			out = append(out, Event{Due: j.job.QueueTime, Kind: EventRetry, ID: j.job.ID})
		}
		if j.job.Etime != 0 {
			out = append(out, Event{Due: j.job.Etime, Kind: EventTTL, ID: j.job.ID})
		}
	}
	slices.SortFunc(out, func(a, b Event) int {
		return cmp.Or(cmp.Compare(a.Due, b.Due), cmp.Compare(a.Kind, b.Kind), cmp.Compare(a.ID, b.ID))
	})
	return out
}

// sortedIDs returns the model's job ids in order; the caller must not modify
// the slice.
func (m *jobModel) sortedIDs() []string { return m.ids }

// modelStep is one record of the AOF and what it did to the model.
type modelStep struct {
	start, end wal.LSN
	op         *mop // nil: records that change no job (the node id, MOVEs)
	job        *Job // the job after op, as the store returned it
	// records: the step is several records (a segment rewrite's MOVEs), so
	// a crash may keep any record boundary inside it.
	records bool
}

// modelHistory is a model and the steps that built it from a base state, so
// that the model as of any LSN can be rebuilt after a crash.
type modelHistory struct {
	base  *jobModel
	from  wal.LSN // the log end the base describes
	steps []modelStep
	cur   *jobModel
}

func newModelHistory(base *jobModel, from wal.LSN) *modelHistory {
	return &modelHistory{base: base, from: from, cur: base.clone()}
}

func (h *modelHistory) end() wal.LSN {
	if len(h.steps) == 0 {
		return h.from
	}
	return h.steps[len(h.steps)-1].end
}

func (h *modelHistory) record(start, end wal.LSN, o *mop, nj *Job) {
	if o != nil {
		h.cur.apply(o, nj)
	}
	h.steps = append(h.steps, modelStep{start: start, end: end, op: o, job: nj})
}

// at returns the model after every step that ends at or before lsn, and how
// many steps that is. exact reports whether lsn is a step boundary.
func (h *modelHistory) at(lsn wal.LSN) (m *jobModel, n int, exact bool) {
	m = h.base.clone()
	exact = lsn == h.from
	for _, st := range h.steps {
		if st.end > lsn {
			exact = exact || (st.records && st.op == nil && st.start < lsn)
			break
		}
		if st.op != nil {
			m.apply(st.op, st.job)
		}
		n++
		// A log may end with a sync mark after its last record.
		exact = exact || st.end == lsn || st.end+walMarkSize == lsn
	}
	return m, n, exact
}

// storeApplied is the end of the last record applied to the index.
func storeApplied(s *Store) wal.LSN {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// noteOpen records in h the node-id record a fresh Open may have written.
func noteOpen(h *modelHistory, s *Store) {
	if a := storeApplied(s); a > h.end() {
		h.record(h.end(), a, nil, nil)
	}
}

// walMarkSize is the LSN space of the wal's sync mark, which may come before
// the first record of a commit.
const walMarkSize = 13 + 8

// afterMarks reports whether a record at lsn is the next after applied:
// right there, or after the sync mark the log writes before the first
// record after an fsync — and after the mark that already ended the log
// (tail: an Open that cut a torn record after one keeps it).
func afterMarks(lsn, applied, tail wal.LSN) bool {
	return lsn == applied || lsn == applied+walMarkSize ||
		tail == applied+walMarkSize && lsn == applied+2*walMarkSize
}

// stateOf is j without its creator LSNs: the store's bookkeeping for
// rebuilds (forward.go), which the model does not follow.
func stateOf(j Job) Job {
	j.creatorLSNs = nil
	return j
}

func statePtr(j *Job) *Job {
	if j == nil {
		return nil
	}
	s := stateOf(*j)
	return &s
}

// modelDo runs o on the store and the model and checks that they agree: the
// same error class, the same job, and nothing written on an error.
func modelDo(t testing.TB, s *Store, h *modelHistory, o *mop) error {
	t.Helper()
	want, wantErr := h.cur.next(o)
	before, tail := storeApplied(s), s.log.End()
	got, err := o.run(s)
	if wantErr != nil || err != nil {
		if !errors.Is(err, wantErr) || wantErr == nil {
			t.Fatalf("%v: store returned %v, model expects %v", o, err, wantErr)
		}
		if a, e := storeApplied(s), s.log.End(); a != before || e != tail {
			t.Fatalf("%v failed (%v) but wrote: applied %d→%d, aof end %d→%d", o, err, before, a, tail, e)
		}
		if w := h.cur.jobs[o.id]; w != nil {
			if j, err := s.Job(o.id); err != nil || !reflect.DeepEqual(stateOf(*j), stateOf(w.job)) {
				t.Fatalf("%v failed but changed the job:\n got %+v (%v)\nwant %+v", o, j, err, w.job)
			}
		}
		return err
	}
	after := storeApplied(s)
	if after <= before || s.log.End() != after {
		t.Fatalf("%v: applied %d→%d, aof end %d", o, before, after, s.log.End())
	}
	if o.kind == mopAdd {
		if !afterMarks(got.BodyLSN, before, tail) {
			t.Fatalf("%v: BodyLSN %d, but its record starts at %d (or after a sync mark; the aof ended at %d)", o, got.BodyLSN, before, tail)
		}
		if got.StoredSize > got.BodySize || len(o.body) < s.opts.CompressThreshold && got.StoredSize != got.BodySize {
			t.Fatalf("%v: stored %d bytes of a %d-byte body", o, got.StoredSize, got.BodySize)
		}
		want.BodyLSN, want.StoredSize = got.BodyLSN, got.StoredSize
	}
	if want != nil && !reflect.DeepEqual(statePtr(got), statePtr(want)) {
		t.Fatalf("%v returned\n %+v\nmodel expects\n %+v", o, got, want)
	}
	h.record(before, after, o, got)
	if o.kind == mopDeliver && got.Retry == 0 && s.log.Durable() < after {
		t.Fatalf("%v: at-most-once delivery returned before it was durable (durable %d, record end %d)", o, s.log.Durable(), after)
	}
	return nil
}

// modelBatch commits ops as one Batch and checks every result against the
// model, applied op by op in the same order: each operation sees the ones
// before it, a refused one is skipped, and each applied one is one record.
func modelBatch(t testing.TB, s *Store, h *modelHistory, ops []*mop) {
	t.Helper()
	b := s.NewBatch()
	for _, o := range ops {
		switch o.kind {
		case mopAdd:
			j := *o.job
			if err := b.Add(&j, o.body); err != nil {
				t.Fatalf("batch %v: %v", o, err)
			}
		case mopQueue:
			b.Queue(o.id, o.qtime)
		case mopDeliver:
			// Most deliveries name the job's queue position as the broker
			// does (DeliverAt, read with its neighbours); some name a wrong
			// one, which must only cost a lookup.
			w := h.cur.jobs[o.id]
			if w == nil {
				b.Deliver(o.id, o.qtime)
				break
			}
			qtime, ctime := o.qtime, w.job.Ctime
			if o.qtime%3 == 0 {
				ctime++
			}
			b.DeliverAt(w.job.Queue, QueuePos{Ctime: ctime, ID: o.id}, func(*Job) int64 { return qtime })
		case mopRequeue:
			b.Requeue(o.id, o.qtime)
		case mopNack:
			b.Nack(o.id, o.qtime, o.awake)
		case mopWorking:
			b.Working(o.id, o.qtime)
		case mopDequeue:
			b.Dequeue(o.id)
		case mopAck:
			b.Ack(o.id)
		case mopDelete:
			b.Delete(o.id)
		case mopPause:
			if err := b.Pause(o.queue, o.pause); err != nil {
				t.Fatalf("batch %v: %v", o, err)
			}
		}
	}
	before := storeApplied(s)
	res := s.Commit(b)
	// The records of the applied operations follow each other in order,
	// each maybe after a sync mark the log put before it.
	lsn, sync := before, false
	for i, o := range ops {
		want, wantErr := h.cur.next(o)
		got := res[i]
		if wantErr != nil || got.Err != nil {
			if !errors.Is(got.Err, wantErr) || wantErr == nil {
				t.Fatalf("batch op %d %v: store returned %v, model expects %v", i, o, got.Err, wantErr)
			}
			continue
		}
		if got.lsn != lsn && got.lsn != lsn+walMarkSize {
			t.Fatalf("batch op %d %v: record at %d, want %d (or after a sync mark)", i, o, got.lsn, lsn)
		}
		end := got.lsn + wal.FrameSize(len(encodeOp(nil, b.ops[i])))
		lsn = got.lsn
		if o.kind == mopAdd {
			if got.Job.BodyLSN != lsn {
				t.Fatalf("batch op %d %v: BodyLSN %d, but its record starts at %d", i, o, got.Job.BodyLSN, lsn)
			}
			want.BodyLSN, want.StoredSize = got.Job.BodyLSN, got.Job.StoredSize
		}
		if !reflect.DeepEqual(statePtr(got.Job), statePtr(want)) {
			t.Fatalf("batch op %d %v returned\n %+v\nmodel expects\n %+v", i, o, got.Job, want)
		}
		h.record(lsn, end, o, got.Job)
		lsn = end
		sync = sync || o.kind == mopDeliver && got.Job.Retry == 0
	}
	if a := storeApplied(s); a != lsn || s.log.End() != lsn {
		t.Fatalf("batch of %d: applied %d, aof end %d; its records end at %d", len(ops), a, s.log.End(), lsn)
	}
	if sync && s.log.Durable() < lsn {
		t.Fatalf("batch with an at-most-once delivery returned before it was durable (durable %d, end %d)", s.log.Durable(), lsn)
	}
}

// checkStore compares everything a store answers with the model: every job
// and body, no other job, queue order and lengths, pause states, counters,
// the schedule and the per-segment live-body accounting.
func checkStore(t testing.TB, s *Store, m *jobModel, queues []string) {
	t.Helper()
	checkQueueValues(t, s)
	n := 0
	for after := ""; ; {
		page, err := s.ScanJobs(after, 17)
		if err != nil {
			t.Fatalf("ScanJobs: %v", err)
		}
		if len(page) == 0 {
			break
		}
		for _, j := range page {
			w := m.jobs[j.ID]
			if w == nil {
				t.Errorf("store has job %s that the model does not: %+v", j.ID, *j)
				continue
			}
			n++
			// Where the body is stored is the store's business (the
			// collector moves it); what it holds is checked below.
			got, want := stateOf(*j), stateOf(w.job)
			got.BodyLSN, want.BodyLSN = 0, 0
			if !reflect.DeepEqual(got, want) {
				t.Errorf("job %s:\n got %+v\nwant %+v", j.ID, *j, w.job)
			}
			if b, err := s.Body(j); err != nil || !bytes.Equal(b, w.body) {
				t.Errorf("body of %s: %d bytes, want %d (%v)", j.ID, len(b), len(w.body), err)
			}
		}
		// The same bodies read together (Bodies batches the AOF reads).
		for k, r := range s.Bodies(page) {
			j := page[k]
			if w := m.jobs[j.ID]; w != nil && (r.Err != nil || !bytes.Equal(r.Body, w.body)) {
				t.Errorf("Bodies: body of %s: %d bytes, want %d (%v)", j.ID, len(r.Body), len(w.body), r.Err)
			}
		}
		after = page[len(page)-1].ID
	}
	if n != len(m.jobs) {
		for _, id := range m.sortedIDs() {
			if _, err := s.Job(id); err != nil {
				t.Errorf("job %s (%s) is missing: %v", id, m.jobs[id].job.State, err)
			}
		}
	}
	names := map[string]bool{}
	for _, q := range queues {
		names[q] = true
	}
	var wantQueues []QueueInfo
	totalQueued, nonEmpty := int64(0), 0
	for _, j := range m.jobs {
		names[j.job.Queue] = true
	}
	for q := range m.paused {
		names[q] = true
	}
	for _, q := range slices.Sorted(maps.Keys(names)) {
		want := m.queued(q)
		var got []QueuePos
		for after := (QueuePos{}); ; {
			page, err := s.QueueRange(q, after, 5)
			if err != nil {
				t.Fatalf("QueueRange %s: %v", q, err)
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			after = page[len(page)-1]
		}
		if !slices.Equal(got, want) {
			t.Errorf("queue %s order (%d entries, want %d): %s", q, len(got), len(want), diffList(got, want))
		}
		if l := s.QueueLen(q); l != int64(len(want)) {
			t.Errorf("QueueLen(%s) = %d, want %d", q, l, len(want))
		}
		if p := s.PauseState(q); p != m.paused[q] {
			t.Errorf("PauseState(%s) = %s, want %s", q, p, m.paused[q])
		}
		totalQueued += int64(len(want))
		if len(want) > 0 {
			nonEmpty++
		}
		if len(want) > 0 || m.paused[q] != PauseNone {
			wantQueues = append(wantQueues, QueueInfo{Name: q, Len: int64(len(want)), Pause: m.paused[q]})
		}
	}
	if got := s.Queues("", 1<<20); !slices.Equal(got, wantQueues) {
		t.Errorf("Queues:\n got %v\nwant %v", got, wantQueues)
	}
	st := s.Stats()
	if st.Jobs != int64(len(m.jobs)) || st.Queued != totalQueued || st.Queues != nonEmpty {
		t.Errorf("Stats: jobs %d queued %d queues %d, want %d %d %d", st.Jobs, st.Queued, st.Queues, len(m.jobs), totalQueued, nonEmpty)
	}
	var evs []Event
	for after := (Event{}); ; {
		page, err := s.DueEvents(1<<63-1, after, 13)
		if err != nil {
			t.Fatalf("DueEvents: %v", err)
		}
		if len(page) == 0 {
			break
		}
		evs = append(evs, page...)
		after = page[len(page)-1]
	}
	if want := m.events(); !slices.Equal(evs, want) {
		t.Errorf("schedule: %d events, want %d: %s", len(evs), len(want), diffList(evs, want))
	}
	checkSegmentAccounting(t, st, m)
	if t.Failed() {
		t.FailNow()
	}
}

// diffList describes how got differs from want: the first position where
// they differ, and what each has there.
func diffList[T comparable](got, want []T) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	show := func(l []T) string {
		if i >= len(l) {
			return "(end)"
		}
		return fmt.Sprintf("%v", l[i:min(i+3, len(l))])
	}
	return fmt.Sprintf("first difference at %d: got %s, want %s", i, show(got), show(want))
}

// checkSegmentAccounting checks that every body lies in a segment the store
// still has, and that each segment's live bodies and bytes are those of the
// model's jobs.
func checkSegmentAccounting(t testing.TB, st Stats, m *jobModel) {
	t.Helper()
	type live struct{ bodies, bytes int64 }
	firsts := make([]wal.LSN, len(st.Segments))
	for i, seg := range st.Segments {
		v, err := strconv.ParseUint(seg.Name[:16], 16, 64)
		if err != nil {
			t.Fatalf("segment name %q: %v", seg.Name, err)
		}
		firsts[i] = wal.LSN(v)
	}
	want := make([]live, len(st.Segments))
	for _, j := range m.jobs {
		i := len(firsts) - 1
		for i >= 0 && firsts[i] > j.job.BodyLSN {
			i--
		}
		if i < 0 || j.job.BodyLSN >= firsts[i]+wal.LSN(st.Segments[i].Size) {
			t.Errorf("job %s: body at lsn %d is in no segment the store has", j.job.ID, j.job.BodyLSN)
			continue
		}
		want[i].bodies++
		want[i].bytes += int64(j.job.StoredSize)
	}
	for i, seg := range st.Segments {
		if seg.LiveBodies != want[i].bodies || seg.LiveBytes != want[i].bytes {
			t.Errorf("segment %s: %d live bodies / %d bytes, want %d / %d", seg.Name, seg.LiveBodies, seg.LiveBytes, want[i].bodies, want[i].bytes)
		}
	}
}

// checkQueueValues checks the invariant prefetchQueued relies on: every
// queue-order key's value is its job exactly as the job key holds it.
func checkQueueValues(t testing.TB, s *Store) {
	t.Helper()
	err := s.scanPrefix([]byte{prefixQueue}, func(k, v []byte) error {
		_, id, err := parseQueueKey(k)
		if err != nil {
			return err
		}
		j, err := s.lockedJob(id)
		if err != nil || j == nil {
			return fmt.Errorf("queue key of %s without a job: %v", id, err)
		}
		if want := encodeJob(nil, j, s.nodeID, s.nodeNumber); !bytes.Equal(v, want) {
			return fmt.Errorf("queue key of %s holds %x, its job is %x", id, v, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// lockedJob reads a job as the commit path does (cache aside): the write
// buffer, then Pebble. For checks that run inside scanPrefix, which holds mu.
func (s *Store) lockedJob(id string) (*Job, error) {
	j, found, err := s.getBuffered(id)
	if err != nil || found {
		return j, err
	}
	return s.getJob(s.db, id)
}
