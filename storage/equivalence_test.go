package storage

// Recovery equivalence: a seeded random run of lifecycle operations against a
// store and against the model (model_test.go), crashed at random points. The
// store recovered from a crash clone must equal the model as of the durable
// end of the AOF, exactly; the run then goes on from the recovered store.

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

const eqDir = "db"

// eqOptions are TestingOptions with SyncNever (durability comes from explicit
// Syncs, checkpoints, at-most-once deliveries and segment roll-over), a
// memtable small enough that Pebble flushes on its own, and small segments.
func eqOptions(fs vfs.FS) Options {
	o := TestingOptions()
	o.FS = fs
	o.Sync = wal.SyncNever
	o.SegmentSize = 32 << 10
	o.MemTableSize = 64 << 10
	o.Logger = slog.New(slog.DiscardHandler)
	return o
}

// quiesce waits until the index has no flush running or queued, so that no
// FlushBegin hook fsyncs the AOF while the test reads Durable and clones.
func quiesce(t testing.TB, s *Store) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		m := s.db.Metrics()
		if m.Flush.NumInProgress == 0 && m.MemTable.Count <= 1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("an index flush is still running after 10s")
		}
		time.Sleep(time.Millisecond)
	}
}

// keepEverything is a crash clone that keeps every write. It has its own
// generator: how often CrashClone draws depends on Pebble's file layout, which
// must not perturb the run's operations.
func keepEverything() vfs.CrashCloneCfg {
	return vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(0, 0))}
}

// eqRun is one randomised run.
type eqRun struct {
	t       *testing.T
	rng     *rand.Rand
	fs      *vfs.MemFS
	s       *Store
	h       *modelHistory
	g       *opGen
	node    string
	nodeEnd wal.LSN // end of the record that set node
	ckpt    wal.LSN // the index on disk has applied at least this much
	ops     int
	failed  int // operations the store refused, as the model predicted
	syncs   int
	flushes int
	ckpts   int
	batches int
	moved   int64 // bodies moved by segment rewrites
	// forwarded counts the job states and deletions rewrites copied.
	forwarded int64
	removed   int64 // segments removed
}

func newEqRun(t *testing.T, seed uint64) *eqRun {
	fs := vfs.NewCrashableMem()
	s, err := Open(eqDir, eqOptions(fs))
	if err != nil {
		t.Fatal(err)
	}
	r := &eqRun{t: t, rng: rand.New(rand.NewPCG(seed, ^seed)), fs: fs, s: s, node: s.NodeID()}
	r.h = newModelHistory(newJobModel(), 0)
	noteOpen(r.h, s)
	r.nodeEnd = r.h.end()
	r.g = newOpGen(seed, r.node)
	return r
}

// steps runs n random steps: mostly single lifecycle operations, sometimes a
// Batch of them, a Sync, an index flush or a Checkpoint.
func (r *eqRun) steps(n int) {
	for range n {
		switch x := r.rng.IntN(100); {
		case x < 3:
			if err := r.s.Sync(); err != nil {
				r.t.Fatalf("sync: %v", err)
			}
			r.syncs++
		case x < 5:
			// What Pebble does on its own when a memtable fills, at any
			// point: its FlushBegin hook must make the AOF durable first.
			// Half the time the write buffer goes to Pebble first, as when
			// it fills.
			if r.rng.IntN(2) == 0 {
				r.s.mu.Lock()
				err := r.s.flushBufferLocked()
				r.s.mu.Unlock()
				if err != nil {
					r.t.Fatalf("write buffer flush: %v", err)
				}
			}
			if err := r.s.db.Flush(); err != nil {
				r.t.Fatalf("index flush: %v", err)
			}
			r.flushes++
		case x < 6:
			r.checkpoint()
		case x < 8:
			r.collect()
		case x < 11:
			ops := r.g.batch(r.h.cur, 2+r.rng.IntN(5))
			modelBatch(r.t, r.s, r.h, ops)
			r.ops += len(ops)
			r.batches++
		default:
			if modelDo(r.t, r.s, r.h, r.g.op(r.h.cur)) != nil {
				r.failed++
			}
			r.ops++
		}
		// A flush Pebble started on its own fsyncs the AOF when it runs:
		// let it finish now, so that what is durable at a crash depends on
		// the seed alone and a failing seed replays exactly.
		quiesce(r.t, r.s)
	}
}

// checkpoint checkpoints the store. What it writes forward before it
// removes segments (forward.go) changes no job the model sees, and is in the
// index it flushes.
func (r *eqRun) checkpoint() {
	r.ckpt = rvCheckpoint(r.t, r.s, r.h)
	r.ckpts++
}

// collect rewrites a random sealed segment that holds live bodies, as the
// gc package's collector would, and sometimes checkpoints right after so the
// segment is removed. The MOVE records change no job the model sees; a
// crash may keep any prefix of them.
func (r *eqRun) collect() {
	t := r.t
	var cands []SegmentStat
	for _, st := range r.s.Stats().Segments {
		if !st.Active && (st.LiveBodies > 0 || st.Held > 0) {
			cands = append(cands, st)
		}
	}
	if len(cands) == 0 {
		return
	}
	seg := cands[r.rng.IntN(len(cands))]
	before := storeApplied(r.s)
	res, err := r.s.RewriteSegment(context.Background(), seg.First)
	if err != nil {
		t.Fatalf("rewrite segment %d: %v", seg.First, err)
	}
	if after := storeApplied(r.s); after > before {
		r.h.steps = append(r.h.steps, modelStep{start: before, end: after, records: true})
	}
	if res.Moved+res.Skipped < seg.LiveBodies {
		t.Fatalf("rewrite of a segment with %d live bodies moved %d and skipped %d", seg.LiveBodies, res.Moved, res.Skipped)
	}
	r.forwarded += res.Forwarded
	r.moved += res.Moved
	syncBodyLSNs(r.s, r.h.cur)
	for _, st := range r.s.Stats().Segments {
		if st.First == seg.First && (st.LiveBodies != 0 || st.Held != 0) {
			t.Fatalf("segment %d still has %d live bodies and %d held records after its rewrite", seg.First, st.LiveBodies, st.Held)
		}
	}
	if r.rng.IntN(2) == 0 {
		removed := r.s.Stats().Collect.SegmentsRemoved
		r.checkpoint()
		if r.s.Stats().Collect.SegmentsRemoved == removed {
			t.Fatalf("the checkpoint after rewriting segment %d removed nothing", seg.First)
		}
		for _, st := range r.s.Stats().Segments {
			if st.First == seg.First {
				t.Fatalf("segment %d survived the checkpoint after its rewrite", seg.First)
			}
		}
	}
}

// syncBodyLSNs copies each job's body location from the store into the
// model: MOVE records change it without changing the job (checkStore has
// already compared the bodies themselves).
func syncBodyLSNs(s *Store, m *jobModel) {
	for id, w := range m.jobs {
		if j, err := s.Job(id); err == nil {
			w.job.BodyLSN = j.BodyLSN
		} // a missing job is checkStore's to report
	}
}

// crash clones the filesystem as a crash would leave it — exactly the synced
// data, or (keepAll) everything written — opens a store on the clone, and
// checks it against the model as of the AOF end the clone kept. The run goes
// on with the recovered store and the model rolled back to that point.
func (r *eqRun) crash(keepAll bool) {
	t := r.t
	t.Helper()
	quiesce(t, r.s)
	d1, tail := r.s.log.Durable(), r.s.log.End()
	var clone *vfs.MemFS
	if keepAll {
		clone = r.fs.CrashClone(keepEverything())
	} else {
		clone = r.fs.CrashClone(vfs.CrashCloneCfg{})
	}
	d2 := r.s.log.Durable()
	r.removed += r.s.Stats().Collect.SegmentsRemoved
	if err := r.s.Close(); err != nil {
		t.Fatalf("close: %v", err)
	}
	s, err := Open(eqDir, eqOptions(clone))
	if err != nil {
		t.Fatalf("open after a crash (durable %d, tail %d, keep all %v): %v", d1, tail, keepAll, err)
	}
	ri := s.RecoveryInfo()
	// The recovered log ends exactly at the durable LSN (at the tail if the
	// clone kept everything): nothing synced is lost, nothing unsynced kept.
	want := d1
	if keepAll {
		want = tail
	}
	if d1 != d2 || ri.To != want {
		t.Fatalf("recovered the aof to %d, want %d (durable %d, %d after the clone; tail %d)", ri.To, want, d1, d2, tail)
	}
	m, n, exact := r.h.at(ri.To)
	if !exact {
		t.Fatalf("recovered aof ends at %d, inside a record", ri.To)
	}
	if ri.From < r.ckpt || ri.From > ri.To {
		t.Fatalf("replayed [%d, %d), but the index on disk had applied %d", ri.From, ri.To, r.ckpt)
	}
	if ri.To >= r.nodeEnd && s.NodeID() != r.node {
		t.Fatalf("node id %s became %s, though its record was durable", r.node, s.NodeID())
	}
	syncBodyLSNs(s, m) // the crash may have kept some of a rewrite's moves
	checkStore(t, s, m, r.g.queues)
	t.Logf("crash (keep all %v): aof end %d of %d, %d of %d steps kept, %d jobs; replayed %d records from %d",
		keepAll, ri.To, tail, n, len(r.h.steps), len(m.jobs), ri.Records, ri.From)
	r.fs, r.s, r.ckpt = clone, s, ri.From
	r.h = newModelHistory(m, ri.To)
	noteOpen(r.h, s) // a lost node-id record is written again
	if s.NodeID() != r.node {
		r.node, r.nodeEnd = s.NodeID(), r.h.end()
	}
}

// TestRecoveryEquivalence runs rounds of random operations, each ended by a
// crash: most rounds keep exactly the synced data, every third keeps every
// write. Replay a failure with -storage.eqseed.
func TestRecoveryEquivalence(t *testing.T) {
	seed := modelSeed(t)
	rounds, per := 12, 320
	if testing.Short() {
		rounds, per = 3, 150
	}
	r := newEqRun(t, seed)
	start := time.Now()
	for round := range rounds {
		r.steps(per/2 + r.rng.IntN(per))
		r.crash(round%3 == 2)
	}
	// A clean close replays nothing and changes nothing.
	want := r.h.cur
	if err := r.s.Close(); err != nil {
		t.Fatal(err)
	}
	s, err := Open(eqDir, eqOptions(r.fs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ri := s.RecoveryInfo(); ri.Records != 0 {
		t.Fatalf("a clean reopen replayed %d records", ri.Records)
	}
	checkStore(t, s, want, r.g.queues)
	t.Logf("%d operations (%d single ones refused as predicted, %d batches), %d syncs, %d index flushes, %d checkpoints, %d bodies moved, %d segments removed, %d rounds in %v",
		r.ops, r.failed, r.batches, r.syncs, r.flushes, r.ckpts, r.moved, r.removed+r.s.Stats().Collect.SegmentsRemoved, rounds, time.Since(start).Round(time.Millisecond))
}

// TestRecoveryEquivalenceEveryStep crashes after every operation of a short
// run, each time into a clone that is then discarded: every prefix of the log
// the fsyncs made durable recovers to the model at that point.
func TestRecoveryEquivalenceEveryStep(t *testing.T) {
	seed := modelSeed(t)
	r := newEqRun(t, seed)
	defer func() { r.s.Close() }()
	n := 60
	if testing.Short() {
		n = 20
	}
	for i := range n {
		r.steps(1)
		d := r.s.log.Durable()
		keepAll := i%2 == 1
		var clone *vfs.MemFS
		if keepAll {
			clone = r.fs.CrashClone(keepEverything())
			d = r.s.log.End()
		} else {
			clone = r.fs.CrashClone(vfs.CrashCloneCfg{})
		}
		s, err := Open(eqDir, eqOptions(clone))
		if err != nil {
			t.Fatalf("step %d: open after a crash: %v", i, err)
		}
		m, _, exact := r.h.at(d)
		if ri := s.RecoveryInfo(); !exact || ri.To != d {
			t.Fatalf("step %d: recovered the aof to %d, want %d (a step boundary: %v)", i, ri.To, d, exact)
		}
		syncBodyLSNs(s, m) // the crash may have kept some of a rewrite's moves, as in crash
		checkStore(t, s, m, r.g.queues)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
	}
}

// opGen generates lifecycle operations with a seeded generator, so a run can
// be replayed from its seed.
type opGen struct {
	rng    *rand.Rand
	node   string // the node-id digits job ids carry
	now    int64  // Unix ms, advancing
	ctime  uint64
	ids    []string // every id ever generated for an Add, in order
	queues []string
	strict bool // only operations the model says succeed
}

func newOpGen(seed uint64, node string) *opGen {
	return &opGen{
		rng:    rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		node:   node[:8],
		now:    1_700_000_000_000,
		queues: []string{"alpha", "beta", "gamma", "delta"},
	}
}

// newID returns a well-formed job id from the generator (NewJobID draws from
// crypto/rand, which a seed cannot replay).
func (g *opGen) newID(retry uint32) string {
	var rnd [18]byte
	for i := range rnd {
		rnd[i] = byte(g.rng.Uint32())
	}
	ttl := 0x0a0
	if retry > 0 {
		ttl |= 1
	}
	return fmt.Sprintf("D-%s-%s-%04x", g.node, base64.StdEncoding.EncodeToString(rnd[:]), ttl)
}

func (g *opGen) time() int64 { return g.now + 1 + g.rng.Int64N(600_000) }

// body returns 0..4 KiB: random bytes, or text that compresses when over 1 KiB.
func (g *opGen) body() []byte {
	n := g.rng.IntN(4097)
	if g.rng.IntN(4) == 0 {
		n = g.rng.IntN(64)
	}
	if n > 1024 && g.rng.IntN(3) == 0 {
		return bytes.Repeat([]byte("compressible job body "), n/22+1)[:n]
	}
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(g.rng.Uint32())
	}
	return b
}

// newJob returns a new job for Add: queued, delayed or wait-repl, sometimes
// at-most-once, sometimes with the ctime of the previous job.
func (g *opGen) newJob() *Job {
	retry := uint32(0)
	if g.rng.IntN(4) != 0 {
		retry = 1 + g.rng.Uint32N(300)
	}
	if g.ctime == 0 || g.rng.IntN(5) != 0 {
		g.ctime = uint64(g.now)*1_000_000 + uint64(g.rng.IntN(1000))
	}
	j := &Job{
		ID:    g.newID(retry),
		Queue: g.queues[g.rng.IntN(len(g.queues))],
		State: StateQueued,
		Ctime: g.ctime,
		Retry: retry,
		Repl:  uint16(1 + g.rng.IntN(3)),
	}
	g.ids = append(g.ids, j.ID)
	if g.rng.IntN(7) != 0 {
		j.Etime = g.time() + 3_600_000
	}
	if retry > 0 {
		j.QueueTime = g.time()
	}
	switch g.rng.IntN(10) {
	case 0, 1: // delayed
		j.State, j.AwakeTime, j.Delay = StateActive, g.time(), 30
	case 2:
		j.State = StateWaitRepl
	}
	switch g.rng.IntN(3) {
	case 1:
		j.Nodes = []string{g.node + "00000000000000000000000000000001"}
	case 2:
		j.Nodes = []string{g.node + "00000000000000000000000000000001", g.node + "00000000000000000000000000000002"}
	}
	return j
}

var opWeights = [numMops]int{mopAdd: 22, mopQueue: 8, mopDeliver: 15, mopRequeue: 7, mopNack: 9,
	mopWorking: 6, mopDequeue: 5, mopAck: 9, mopDelete: 10, mopPause: 3, mopFlush: eqFlushWeight}

// batch returns n random operations, each generated against the model as
// the ones before it (if the model lets them apply) leave it.
func (g *opGen) batch(m *jobModel, n int) []*mop {
	scratch := m.clone()
	ops := make([]*mop, n)
	for i := range ops {
		ops[i] = g.op(scratch)
		for ops[i].kind == mopFlush {
			ops[i] = g.op(scratch)
		}
		if nj, err := scratch.next(ops[i]); err == nil {
			scratch.apply(ops[i], nj)
		}
	}
	return ops
}

// op returns a random operation against the model's current state.
func (g *opGen) op(m *jobModel) *mop {
	g.now += g.rng.Int64N(40)
	total := 0
	for _, w := range opWeights {
		total += w
	}
	x := g.rng.IntN(total)
	k := mopKind(0)
	for x >= opWeights[k] {
		x -= opWeights[k]
		k++
	}
	o := &mop{kind: k}
	switch k {
	case mopAdd:
		o.job = g.newJob()
		o.id, o.body = o.job.ID, g.body()
		switch {
		case !g.strict && len(m.jobs) > 0 && g.rng.IntN(30) == 0:
			ids := m.sortedIDs() // an id in use: ErrExists
			o.job.ID = ids[g.rng.IntN(len(ids))]
			o.id = o.job.ID
		case g.rng.IntN(25) == 0:
			// The id of a job deleted earlier, added again: a second
			// incarnation, which a TOMB of the first must not delete.
			for range 8 {
				id := g.ids[g.rng.IntN(len(g.ids))]
				if _, live := m.jobs[id]; !live {
					o.job.ID, o.id = id, id
					break
				}
			}
		}
		return o
	case mopPause:
		o.queue, o.pause = g.queues[g.rng.IntN(len(g.queues))], PauseState(g.rng.IntN(4))
		return o
	case mopFlush:
		return o
	}
	o.qtime = g.time()
	if g.rng.IntN(20) == 0 {
		o.qtime = 0
	}
	if k == mopNack && g.rng.IntN(2) == 0 {
		o.awake = g.time()
	}
	// Sort a sample of the jobs into those o applies to and the others (all
	// of them if the sample has none o applies to).
	var ok, wrong []string
	ids := m.sortedIDs()
	classify := func(id string) {
		o.id = id
		if _, err := m.next(o); err == nil {
			ok = append(ok, id)
		} else {
			wrong = append(wrong, id)
		}
	}
	for range min(len(ids), 32) {
		classify(ids[g.rng.IntN(len(ids))])
	}
	if len(ok) == 0 {
		for _, id := range ids {
			classify(id)
		}
	}
	switch y := g.rng.IntN(100); {
	case len(ok) > 0 && (g.strict || y < 82):
		o.id = ok[g.rng.IntN(len(ok))]
	case g.strict:
		return g.op(m) // nothing this op applies to: try another
	case y < 92 && len(wrong) > 0:
		o.id = wrong[g.rng.IntN(len(wrong))]
	case y < 96 && len(g.ids) > 0:
		o.id = g.ids[g.rng.IntN(len(g.ids))] // maybe deleted (or rolled back by a crash)
	case y < 98:
		o.id = g.newID(1) // never added
	default:
		o.id = "D-not-an-id"
	}
	return o
}

// queuedJob is a queued at-least-once job with a small body: cheap records
// that do not roll the log.
func (g *opGen) queuedJob(bodyLen int) *mop {
	j := g.newJob()
	j.ID, j.State, j.AwakeTime, j.Delay, j.Retry, j.QueueTime = g.newID(30), StateQueued, 0, 0, 30, g.time()
	return &mop{kind: mopAdd, id: j.ID, job: j, body: bytes.Repeat([]byte{'b'}, bodyLen)}
}

// processCrashClone returns a filesystem as a process crash leaves fs: every
// write is there (the OS has it), but only what was synced survives a later
// machine crash (a CrashClone of the result).
func processCrashClone(t *testing.T, fs *vfs.MemFS) *vfs.MemFS {
	out := fs.CrashClone(vfs.CrashCloneCfg{})
	all := fs.CrashClone(vfs.CrashCloneCfg{UnsyncedDataPercent: 100, RNG: rand.New(rand.NewPCG(3, 4))})
	var walk func(dir string)
	walk = func(dir string) {
		names, err := all.List(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range names {
			path := all.PathJoin(dir, name)
			if st, err := all.Stat(path); err != nil {
				t.Fatal(err)
			} else if st.IsDir() {
				if err := out.MkdirAll(path, 0o755); err != nil {
					t.Fatal(err)
				}
				walk(path)
				continue
			}
			b := readMemFile(t, all, path)
			if _, err := out.Stat(path); err == nil && bytes.Equal(readMemFile(t, out, path), b) {
				continue
			}
			f, err := out.OpenReadWrite(path, vfs.WriteCategoryUnspecified) // keeps the synced data as it was
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.WriteAt(b, 0); err != nil {
				t.Fatal(err)
			}
			f.Close() // no sync
		}
	}
	walk(eqDir)
	return out
}

// Regression test; the bug it caught, now fixed (wal/log.go, Open: `l.written, l.synced, l.syncWanted = l.tail, l.tail,
// l.tail`): the log counts everything it finds in the last segment as
// fsynced. After a process crash that data is only in the OS page cache, but
// Durable, WaitSynced and Sync (so the FlushBegin hook and Checkpoint) treat
// it as durable and never fsync it: the restarted store's Close checkpoints
// an index whose applied LSN is beyond the durable log, and after a machine
// crash Open refuses ("the index is ahead of the log"). Open should fsync the
// last segment (or start synced at 0 for it) before trusting it.
func TestReopenMakesTheRecoveredTailDurable(t *testing.T) {
	fs := vfs.NewCrashableMem()
	s := openCrash(t, fs, wal.SyncNever)
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	g := newOpGen(5, s.NodeID())
	for i := range 20 {
		modelDo(t, s, h, g.queuedJob(50))
		if i == 9 {
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	durable := s.log.Durable()
	if durable >= h.end() {
		t.Fatalf("nothing is unsynced")
	}
	proc := processCrashClone(t, fs) // kill -9: the unsynced tail is in the page cache
	s.Close()
	s = openCrash(t, proc, wal.SyncNever)
	checkStore(t, s, h.cur, g.queues) // the restart sees all 20 jobs
	if err := s.Close(); err != nil { // a clean shutdown: checkpoint
		t.Fatal(err)
	}
	// Power loss before the OS wrote the tail back.
	s, err := Open(eqDir, crashOpts(proc.CrashClone(vfs.CrashCloneCfg{}), wal.SyncNever))
	if err != nil {
		t.Fatalf("regression: a process crash, a clean restart and a machine crash leave a store that cannot open "+
			"(the restart never fsynced the aof tail it recovered, then checkpointed the index past it; durable was %d of %d): %v",
			durable, h.end(), err)
	}
	defer s.Close()
	m, _, exact := h.at(s.RecoveryInfo().To)
	if !exact || s.RecoveryInfo().To < durable {
		t.Fatalf("recovered to %d; durable was %d", s.RecoveryInfo().To, durable)
	}
	checkStore(t, s, m, g.queues)
}

// Regression test; the bug it caught, now fixed (first by a zeroed-sector rule in the wal's repair, now by its
// sync marks, which tell the unsynced tail from the durable part whatever the damage): a record that fails
// its checksum is taken for mid-log damage, and Open refuses, whenever a
// valid record follows it. But that is also what a crash leaves when the OS
// wrote back the unsynced pages of the last segment out of order: a record
// larger than a page with one page never written (zeros) and later records
// complete. Nothing in it was durable, yet the store cannot start. A
// CrashClone with UnsyncedDataPercent 50 produces it for about one clone in
// fifty once records exceed 4 KiB. etcd's WAL treats a frame with a zeroed
// sector as torn (decoder.isTornEntry); the repair should too, at least for
// frames that contain an all-zero page.
func TestTornPageInUnsyncedTailIsCut(t *testing.T) {
	fs := vfs.NewCrashableMem()
	opts := eqOptions(fs)
	opts.SegmentSize, opts.CompressThreshold = 1<<20, -1
	s, err := Open(eqDir, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	h := newModelHistory(newJobModel(), 0)
	noteOpen(h, s)
	g := newOpGen(17, s.NodeID())
	for i := range 6 { // 10 KiB bodies: each record spans pages
		o := g.queuedJob(10 << 10)
		for k := range o.body {
			o.body[k] = byte(g.rng.Uint32())
		}
		modelDo(t, s, h, o)
		if i == 2 {
			if err := s.Sync(); err != nil {
				t.Fatal(err)
			}
		}
	}
	durable := s.log.Durable()
	crashed := fs.CrashClone(keepEverything())
	// The first unsynced record's second page never reached the disk.
	path := eqDir + "/aof/" + s.log.Segments()[0].Name
	b := readMemFile(t, crashed, path)
	page := (walHeaderSize + int64(durable) + 4095) / 4096 * 4096
	clear(b[page : page+4096])
	writeMemFile(t, crashed, path, b)
	opts.FS = crashed
	s2, err := Open(eqDir, opts)
	if err != nil {
		t.Fatalf("regression: a crash that lost one unsynced page of the aof tail leaves a store that refuses to open "+
			"(durable %d, the zeroed page at file offset %d is inside the first unsynced record): %v", durable, page, err)
	}
	defer s2.Close()
	m, _, _ := h.at(durable)
	if ri := s2.RecoveryInfo(); ri.To != durable && ri.To != durable+walMarkSize {
		t.Fatalf("recovered the aof to %d, want the durable %d", ri.To, durable)
	}
	checkStore(t, s2, m, g.queues)
}

// TestRebuildEquivalence loses the index — a copy of everything written,
// without index/ — at the end of each round of random operations, segment
// rewrites and checkpoints, which remove segments from the middle of the
// AOF, and opens the copy: the index is rebuilt from what the AOF still
// holds, and must be exactly the model's, job for job (forward.go writes
// forward what the removed segments held that a replay would need). Replay
// a failure with -storage.eqseed.
func TestRebuildEquivalence(t *testing.T) {
	seed := modelSeed(t)
	rounds, per := 8, 300
	if testing.Short() {
		rounds, per = 3, 150
	}
	r := newEqRun(t, seed)
	defer func() { r.s.Close() }()
	for round := range rounds {
		r.steps(per/2 + r.rng.IntN(per))
		quiesce(t, r.s)
		end := r.s.log.End()
		clone := r.fs.CrashClone(keepEverything())
		opts := eqOptions(clone)
		if round%2 == 1 {
			opts.Rebuild = RebuildAlways // or it was set aside on purpose (--rebuild-index)
		} else if err := clone.RemoveAll(eqDir + "/" + indexDir); err != nil {
			t.Fatal(err)
		}
		s, err := Open(eqDir, opts)
		if err != nil {
			t.Fatalf("round %d: open without an index: %v", round, err)
		}
		ri := s.RecoveryInfo()
		m, _, exact := r.h.at(end)
		if !ri.Rebuilt || !exact {
			t.Fatalf("round %d: rebuilt %v, exact %v", round, ri.Rebuilt, exact)
		}
		if s.NodeID() != r.node {
			t.Fatalf("round %d: the rebuilt index has node %s, want %s", round, s.NodeID(), r.node)
		}
		// Where bodies are is the collector's business (the model's
		// steps know where they were added); checkStore reads them all.
		syncBodyLSNs(s, m)
		checkStore(t, s, m, r.g.queues)
		checkSameAccounting(t, r.s, s)
		segs := len(s.Stats().Segments)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: rebuilt %d jobs from %d records in %d segments (%d removed so far, %d snaps written forward, %d states and deletions copied by rewrites)",
			round, len(m.jobs), ri.Records, segs, r.s.Stats().Collect.SegmentsRemoved, r.s.Stats().Collect.Snaps, r.forwarded)
	}
	if r.s.Stats().Collect.SegmentsRemoved == 0 {
		t.Fatal("no segment was removed: the rebuilds replayed a whole log, which tests nothing of forward.go")
	}
}
