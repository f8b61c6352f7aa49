package storage

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/diskque/diskque/wal"
)

// Check verifies a store's directory offline, without changing anything:
// every AOF record's checksums (every damaged span, not only the first),
// and the index on disk against the AOF and against itself — every job's
// body is the ADD or MOVE record of that job, every queued job has its
// queue-order key and every such key a queued job, every schedule key is an
// event of its job and every event has its key, and the derived counters
// (queued per queue, live bodies per segment, jobs) are what the jobs add
// up to. The index is checked as of its applied LSN; the AOF records after
// it (replayed at the next start) are checked for damage only.

// CheckReport is what Check found.
type CheckReport struct {
	// The AOF.
	Segments int
	AOFBytes int64
	Records  int
	// Damage lists the AOF's damaged spans, with the jobs whose bodies
	// they hold.
	Damage []DamagedSpan
	// Tail is the end of the last segment as the next start will find it:
	// a torn tail it will cut, or damage it will refuse to start on.
	Tail wal.TailState
	// The index: its applied LSN, the AOF's end, and what it holds.
	Applied, AOFEnd wal.LSN
	Jobs, Queued    int64
	Queues          int
	NodeID          string
	// Problems are the index's inconsistencies, one line each (at most
	// maxCheckProblems; ProblemCount counts them all).
	Problems     []string
	ProblemCount int
	// ReleasePending counts the deletion keys (h/) that wait for segments
	// a checkpoint already removed: the index on disk predates the
	// release (a kill right after the removal); the next Open does it.
	// Not a problem.
	ReleasePending int64
	Took           time.Duration
}

// DamagedSpan is one damaged span of the AOF and the jobs it holds the body
// of (their bodies cannot be read).
type DamagedSpan struct {
	Segment string
	wal.Damage
	Repairable bool
	Jobs       []string
}

// OK reports whether Check found nothing wrong. A torn tail is not wrong:
// it is what a crash leaves, and the next start cuts it.
func (r *CheckReport) OK() bool { return len(r.Damage) == 0 && r.ProblemCount == 0 }

const maxCheckProblems = 50

func (r *CheckReport) problem(format string, args ...any) {
	r.ProblemCount++
	if len(r.Problems) < maxCheckProblems {
		r.Problems = append(r.Problems, fmt.Sprintf(format, args...))
	}
}

// Check verifies the store in dir (see above). It takes the directory's
// lock, so it refuses while a server uses it. An error means it could not
// check; what it found wrong is in the report.
func Check(dir string, opts Options) (rep *CheckReport, err error) {
	defer func() {
		// A damaged index can make Pebble give up (Fatalf) on this
		// goroutine: that is a finding, not a crash of the check.
		if p := recover(); p != nil {
			rep, err = nil, fmt.Errorf("storage: the index cannot be read: %v", p)
		}
	}()
	opts.EnsureDefaults()
	start := time.Now()
	fs := opts.FS
	lock, err := fs.Lock(fs.PathJoin(dir, lockFile))
	if err != nil {
		return nil, fmt.Errorf("storage: lock %s (is a server using it? stop it first): %w", dir, err)
	}
	defer lock.Close()
	db, err := pebble.Open(fs.PathJoin(dir, indexDir), &pebble.Options{
		FS: fs, ReadOnly: true, DisableWAL: true, Logger: quietPebbleLogger{},
	})
	if err != nil {
		return nil, fmt.Errorf("storage: open the index read-only: %w", err)
	}
	defer db.Close()
	c := &checker{db: db, rep: &CheckReport{}}
	if err := c.meta(); err != nil {
		return nil, err
	}
	wopts := opts.walOptions()
	wopts.ReadOnly, wopts.Checkpoint = true, c.rep.Applied
	log, err := wal.Open(fs.PathJoin(dir, walDir), wopts)
	if err != nil {
		return nil, err
	}
	defer log.Close()
	c.log = log
	c.rep.Tail = log.Tail()
	if err := c.aof(); err != nil {
		return nil, err
	}
	if err := c.index(); err != nil {
		return nil, err
	}
	c.rep.Took = time.Since(start)
	return c.rep, nil
}

type checker struct {
	db  *pebble.DB
	log *wal.Log
	rep *CheckReport
	// names is the index's node id and table of interned ids.
	names *nodeNames
	// format is the index's format (0: none written yet).
	format uint64
	// spans are the damaged spans, in the order of rep.Damage.
	spans []wal.Damage
}

func (c *checker) get(key []byte) ([]byte, error) {
	v, closer, err := c.db.Get(key)
	if errors.Is(err, pebble.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("storage: read the index: %w", err)
	}
	defer closer.Close()
	return bytes.Clone(v), nil
}

func (c *checker) meta() error {
	v, err := c.get(keyFormat)
	if err != nil {
		return err
	}
	if ver, _ := binary.Uvarint(v); v != nil && (ver < 1 || ver > formatVersion) {
		return fmt.Errorf("storage: index format %d, this build reads 1 to %d", ver, formatVersion)
	} else if v != nil {
		c.format = ver
	}
	if v, err = c.get(keyState); err != nil {
		return err
	}
	if v != nil {
		st, err := decodeState(v)
		if err != nil {
			c.rep.problem("the index's state key does not decode: %v", err)
		}
		c.rep.Applied, c.rep.Jobs = st.applied, st.jobs
	}
	if v, err = c.get(keyNodeID); err != nil {
		return err
	}
	c.rep.NodeID = string(v)
	c.names = &nodeNames{}
	if len(v) > 0 {
		c.names.self = []string{string(v)}
	}
	// The table of interned node ids (nodenames.go): numbered 1, 2, … in
	// key order.
	return c.scan(prefixNodeName, func(k, v []byte) error {
		if len(k) != 5 || binary.BigEndian.Uint32(k[1:]) != uint32(len(c.names.ids)+1) {
			c.rep.problem("node table key %x: the table is not numbered 1 to n", k)
		}
		c.names.ids = append(c.names.ids, string(v))
		return nil
	})
}

// aof checks every segment whole.
func (c *checker) aof() error {
	segs := c.log.Segments()
	c.rep.Segments, c.rep.AOFEnd = len(segs), c.log.End()
	for _, seg := range segs {
		sr, err := c.log.CheckSegment(seg.First)
		if err != nil {
			return err
		}
		c.rep.AOFBytes += seg.Size
		c.rep.Records += sr.Records
		for _, d := range sr.Damage {
			c.rep.Damage = append(c.rep.Damage, DamagedSpan{Segment: seg.Name, Damage: d, Repairable: sr.Repairable})
			c.spans = append(c.spans, d)
		}
	}
	if c.rep.Applied > c.rep.AOFEnd {
		c.rep.problem("the index has applied the aof up to lsn %d, but the aof ends at %d", c.rep.Applied, c.rep.AOFEnd)
	}
	return nil
}

// damagedSpan returns the index of the damaged span holding lsn, or -1.
func (c *checker) damagedSpan(lsn wal.LSN) int {
	for i, d := range c.spans {
		if lsn >= d.LSN && lsn < d.LSN+wal.LSN(d.Len) {
			return i
		}
	}
	return -1
}

// index walks the index's keys family by family.
func (c *checker) index() error {
	queued := map[string]int64{}
	live := map[wal.LSN][2]int64{} // segment → bodies, bytes
	holds := map[holdPair]int64{}  // the g/ values' counts of deletions waiting
	var jobs, nEvents, resumable int64
	var bodies []*Job
	flush := func() {
		c.bodies(bodies)
		bodies = bodies[:0]
	}
	err := c.scan(prefixJob, func(k, v []byte) error {
		id := string(k[1:])
		j, err := decodeJob(id, v, c.names)
		if err != nil {
			c.rep.problem("job %s: its index value does not decode: %v", id, err)
			return nil
		}
		jobs++
		if needsResume(j) {
			resumable++
		}
		if j.State == StateQueued {
			queued[j.Queue]++
		}
		_, n := events(j)
		nEvents += int64(n)
		seg, ok := c.log.SegmentOf(j.BodyLSN)
		if !ok {
			c.rep.problem("job %s: its body (lsn %d) is in no segment of the aof", id, j.BodyLSN)
			return nil
		}
		l := live[seg]
		live[seg] = [2]int64{l[0] + 1, l[1] + int64(j.StoredSize)}
		if bodies = append(bodies, j); len(bodies) == 1024 {
			flush()
		}
		return nil
	})
	if err != nil {
		return err
	}
	flush()
	if jobs != c.rep.Jobs {
		c.rep.problem("the index counts %d jobs but holds %d", c.rep.Jobs, jobs)
	}
	c.rep.Jobs = jobs
	// Every queue-order key is a queued job's, at its place and with its
	// value; with as many keys as queued jobs, every queued job has one.
	var qkeys int64
	err = c.scan(prefixQueue, func(k, v []byte) error {
		qkeys++
		ctime, id, err := parseQueueKey(k)
		if err != nil {
			c.rep.problem("queue-order key %q does not parse", k)
			return nil
		}
		j, err := c.job(id)
		switch {
		case err != nil:
			c.rep.problem("queue-order key of %s: %v", id, err)
		case j == nil:
			c.rep.problem("queue-order key of %s, which is not in the index", id)
		case j.State != StateQueued || j.Ctime != ctime || !bytes.Equal(k, queueKey(j.Queue, j.Ctime, id)):
			c.rep.problem("queue-order key of %s, which is %s in queue %q at ctime %d", id, j.State, j.Queue, j.Ctime)
		case len(v) > 0:
			if qj, err := decodeJob(id, v, c.names); err != nil || !sameJob(qj, j) {
				c.rep.problem("queue-order key of %s holds another state of the job than its job key", id)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	var nqueued int64
	for _, n := range queued {
		nqueued += n
	}
	if qkeys != nqueued {
		c.rep.problem("%d queue-order keys for %d queued jobs", qkeys, nqueued)
	}
	c.rep.Queued, c.rep.Queues = nqueued, len(queued)
	var skeys int64
	err = c.scan(prefixSchedule, func(k, _ []byte) error {
		skeys++
		e, err := parseScheduleKey(k)
		if err != nil {
			c.rep.problem("schedule key %q does not parse", k)
			return nil
		}
		j, err := c.job(e.ID)
		if err != nil || j == nil {
			c.rep.problem("schedule key %s %d of %s, which is not in the index (%v)", e.Kind, e.Due, e.ID, err)
			return nil
		}
		evs, n := events(j)
		if !containsEvent(evs[:n], e) {
			c.rep.problem("schedule key %s %d of %s, which is not one of its events", e.Kind, e.Due, e.ID)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if skeys != nEvents {
		c.rep.problem("%d schedule keys for %d events of the jobs", skeys, nEvents)
	}
	counted := map[string]int64{}
	err = c.scan(prefixCount, func(k, v []byte) error {
		n, _ := binary.Uvarint(v)
		counted[string(k[1:])] = int64(n)
		return nil
	})
	if err != nil {
		return err
	}
	for _, q := range sortedKeys(queued, counted) {
		if queued[q] != counted[q] {
			c.rep.problem("queue %q: the index counts %d queued jobs, the jobs say %d", q, counted[q], queued[q])
		}
	}
	err = c.scan(prefixSegment, func(k, v []byte) error {
		if len(k) != 9 {
			c.rep.problem("malformed segment accounting key %x", k)
			return nil
		}
		seg := wal.LSN(binary.BigEndian.Uint64(k[1:]))
		l, err := decodeSegmentLive(v)
		if err != nil {
			c.rep.problem("segment %016x: %v", uint64(seg), err)
			return nil
		}
		for cs, n := range l.holds {
			holds[holdPair{cs, seg}] = n
		}
		got := [2]int64{l.bodies, l.bytes}
		if want := live[seg]; got != want {
			c.rep.problem("segment %016x: the index counts %d live bodies (%d bytes), the jobs say %d (%d bytes)",
				uint64(seg), got[0], got[1], want[0], want[1])
		}
		delete(live, seg)
		return nil
	})
	for seg, l := range live {
		c.rep.problem("segment %016x: the jobs say it holds %d live bodies, the index counts none", uint64(seg), l[0])
	}
	if err != nil {
		return err
	}
	if c.format >= 6 {
		// The resume set (resume.go): a key for every acked or wait-repl
		// job, and no other.
		var rkeys int64
		err = c.scan(prefixResume, func(k, _ []byte) error {
			rkeys++
			if len(k) != 1+JobIDLen {
				c.rep.problem("malformed resume key %x", k)
				return nil
			}
			j, err := c.job(string(k[1:]))
			switch {
			case err != nil:
				c.rep.problem("resume key of %s: %v", k[1:], err)
			case j == nil:
				c.rep.problem("resume key of %s, which is not in the index", k[1:])
			case !needsResume(j):
				c.rep.problem("resume key of %s, which is %s", k[1:], j.State)
			}
			return nil
		})
		if err != nil {
			return err
		}
		if rkeys != resumable {
			c.rep.problem("%d resume keys for %d acked or wait-repl jobs", rkeys, resumable)
		}
	}
	if c.format < 4 {
		// Holds had no keys before format 4; an open rebuilds them.
		return nil
	}
	// The deletions still needed: an h/ key each (h/<creator segment><the
	// deletion's LSN>), counted in the g/ value of the deletion's segment
	// under the creator's (accounting.go).
	keys := map[holdPair]int64{}
	err = c.scan(prefixHold, func(k, _ []byte) error {
		if len(k) != 17 {
			c.rep.problem("malformed deletion key %x", k)
			return nil
		}
		cs := wal.LSN(binary.BigEndian.Uint64(k[1:9]))
		del := wal.LSN(binary.BigEndian.Uint64(k[9:]))
		first, ok := c.log.SegmentOf(cs)
		if !ok {
			// A checkpoint removed the creator segment, and the
			// release of its holds had not reached the index yet (a
			// kill before the next flush): Open releases them.
			c.rep.ReleasePending++
			return nil
		}
		at, ok := c.log.SegmentOf(del)
		if !ok {
			c.rep.problem("deletion key %x: no segment of the log holds lsn %d", k, uint64(del))
			return nil
		}
		if first != cs {
			c.rep.problem("deletion key %x: it waits for segment %016x, which the log does not have", k, uint64(cs))
			return nil
		}
		keys[holdPair{cs, at}]++
		return nil
	})
	for _, p := range slices.SortedFunc(maps.Keys(keys), holdPair.compare) {
		if holds[p] != keys[p] {
			c.rep.problem("segment %016x: %d of its deletions wait for segment %016x by their keys, its accounting counts %d",
				uint64(p.del), keys[p], uint64(p.creator), holds[p])
		}
	}
	for _, p := range slices.SortedFunc(maps.Keys(holds), holdPair.compare) {
		if _, ok := c.log.SegmentOf(p.creator); !ok {
			continue // released by the next Open, as above
		}
		if _, ok := keys[p]; !ok {
			c.rep.problem("segment %016x: no deletion key waits for segment %016x, its accounting counts %d",
				uint64(p.del), uint64(p.creator), holds[p])
		}
	}
	return err
}

// holdPair is a creator segment and the segment of deletions waiting for it.
type holdPair struct{ creator, del wal.LSN }

func (p holdPair) compare(q holdPair) int {
	return cmp.Or(cmp.Compare(p.del, q.del), cmp.Compare(p.creator, q.creator))
}

// bodies checks that each job's body record is readable and is the job's.
func (c *checker) bodies(jobs []*Job) {
	if len(jobs) == 0 {
		return
	}
	slices.SortFunc(jobs, func(a, b *Job) int { return cmp.Compare(a.BodyLSN, b.BodyLSN) })
	lsns := make([]wal.LSN, len(jobs))
	hints := make([]int, len(jobs))
	for i, j := range jobs {
		lsns[i], hints[i] = j.BodyLSN, bodyRecordHint(j)
	}
	recs, errs := c.log.ReadEach(lsns, hints)
	for i, j := range jobs {
		err := errs[i]
		if err == nil {
			// The whole record decodes (bodyOf reads only its body's
			// part), and its body is the job's.
			if _, err = decodeOp(recs[i].Type, recs[i].Payload); err == nil {
				_, err = bodyOf(j, recs[i])
			}
		}
		if err == nil {
			continue
		}
		if k := c.damagedSpan(j.BodyLSN); k >= 0 {
			c.rep.Damage[k].Jobs = append(c.rep.Damage[k].Jobs, j.ID)
			continue
		}
		c.rep.problem("job %s: its body at lsn %d cannot be read: %v", j.ID, j.BodyLSN, err)
	}
}

func (c *checker) job(id string) (*Job, error) {
	v, err := c.get(jobKey(id))
	if err != nil || v == nil {
		return nil, err
	}
	return decodeJob(id, v, c.names)
}

// scan calls fn for every key with the one-byte prefix p.
func (c *checker) scan(p byte, fn func(k, v []byte) error) error {
	it, err := c.db.NewIter(&pebble.IterOptions{LowerBound: []byte{p}, UpperBound: []byte{p + 1}})
	if err != nil {
		return err
	}
	for ok := it.First(); ok; ok = it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			it.Close()
			return err
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return fmt.Errorf("storage: read the index: %w", err)
	}
	return nil
}

// quietPebbleLogger drops Pebble's messages: Check reports what it finds
// itself, and a read-only index does no background work.
type quietPebbleLogger struct{}

func (quietPebbleLogger) Infof(string, ...any)  {}
func (quietPebbleLogger) Errorf(string, ...any) {}
func (quietPebbleLogger) Fatalf(format string, args ...any) {
	panic(fmt.Sprintf("pebble: "+format, args...))
}

// sameJob compares the fields a queue-order key's copy must share with the
// job key.
func sameJob(a, b *Job) bool {
	return a.State == b.State && a.Queue == b.Queue && a.Ctime == b.Ctime && a.BodyLSN == b.BodyLSN &&
		a.Deliveries == b.Deliveries && a.Nacks == b.Nacks && a.QueueTime == b.QueueTime
}

func sortedKeys(a, b map[string]int64) []string {
	var out []string
	for k := range a {
		out = append(out, k)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}
