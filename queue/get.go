package queue

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	"github.com/diskque/diskque/storage"
)

// GetRequest is one GETJOB.
type GetRequest struct {
	Queues  []string
	Count   int           // ≥ 1
	NoHang  bool          // return at once when nothing is queued
	Timeout time.Duration // how long to block; 0 = until ctx ends
	// Leaving: this node is leaving the cluster. A GETJOB that finds
	// nothing fails with ErrLeaving instead of blocking (NoHang still
	// answers nil), and asks no other node for jobs (federation.go).
	Leaving bool
	// OnBlock, if set, is called when the GETJOB is about to block (it
	// found nothing), with no broker lock held and before it is a
	// waiter (its queues are looked at again after); the context it
	// returns replaces ctx for the wait, and stop is called when the
	// wait ends. The server watches for the client's
	// hang-up there, so that a GETJOB served at once pays nothing for it.
	OnBlock func(ctx context.Context) (context.Context, func())
}

// Delivered is one job handed to a consumer.
type Delivered struct {
	Queue                string
	ID                   string
	Body                 []byte
	Nacks                uint32
	AdditionalDeliveries uint32
}

// waiter is a blocked GETJOB. It is served one job, by whoever queues one
// first, under the broker's lock.
type waiter struct {
	queues []string
	ch     chan waiterResult // capacity 1
	done   bool              // served, timed out or closed (under Broker.mu)
}

type waiterResult struct {
	got delivery
	err error
}

// delivery is what deliverLocked hands out: jobs whose deliveries are
// applied, their durability, and the bodies read so far.
type delivery struct {
	out     []Delivered
	pending storage.Pending
	// late are the jobs of out whose bodies were not durable in the AOF
	// when they were delivered (their ADD still on its way to the disk):
	// finish reads them once the deliveries, logged after them, are
	// written. lateAt[k] is late[k]'s index in out.
	late   []*storage.Job
	lateAt []int
	// bytes is the replyCost of out; more says whether the call that
	// delivered out stopped at its count (rather than at its byte budget
	// or for want of jobs); next is the queue its next pass would start
	// at.
	bytes int64
	more  bool
	next  int
	// jobs are out's jobs as delivered, in out's order, for a take that
	// moves them to another node (take.moved: RemoteNeedJobs); before
	// holds each one as it was before the delivery (its node list without
	// the asker: federation_first.go).
	jobs   []*storage.Job
	before []*storage.Job
}

// join appends the jobs of a later chunk, o, to d.
func (d *delivery) join(o delivery) {
	for k, j := range o.late {
		d.late = append(d.late, j)
		d.lateAt = append(d.lateAt, len(d.out)+o.lateAt[k])
	}
	d.out = append(d.out, o.out...)
	d.jobs = append(d.jobs, o.jobs...)
	d.before = append(d.before, o.before...)
	d.pending = d.pending.Join(o.pending)
	d.bytes += o.bytes
	d.more, d.next = o.more, o.next
}

// Limits of one GETJOB (SPEC.md leaves COUNT unbounded; Disque built any
// reply in memory). A GETJOB delivers at most MaxGetCount jobs, and stops
// taking jobs once their replies would pass MaxGetBytes (a job's body, its
// id and queue, and some framing: replyCost) — but always takes a first
// job, whatever its size. The rest stay queued for the next GETJOB; a
// client asking for more gets fewer, as it does from a short queue.
const (
	MaxGetCount       = 10_000
	MaxGetBytes int64 = 4 << 20
)

// getChunk bounds the jobs one hold of Broker.mu delivers: a GETJOB of
// more delivers them in chunks, each under its own hold, so the other
// clients are served between chunks. A delivery costs about what a fired
// timer does (fireChunk): an index read and write, and its body's read.
const getChunk = 128

// replyCost is what a delivered job weighs against MaxGetBytes: its body,
// id and queue, and the RESP framing and Delivered around them.
func replyCost(j *storage.Job) int64 {
	return int64(j.BodySize) + int64(len(j.ID)) + int64(len(j.Queue)) + 64
}

// take bounds one deliverLocked call.
type take struct {
	count int   // at most this many jobs
	bytes int64 // whose replyCost sums to at most this, but for a first job
	first bool  // nothing delivered yet to this GETJOB: take a first job whatever its cost
	start int   // the queue the first pass starts at (index among the unpaused), for the round-robin across chunks
	// moved: the jobs go to another node (a NEEDJOBS), not to a consumer:
	// not counted in Stats.JobsDelivered, and returned in delivery.jobs.
	moved bool
	// to, for a moved take: that node, which the delivery record of each
	// at-least-once job adds to its nodes (storage.Batch.DeliverMoved).
	to string
}

// GetJobs delivers up to Count jobs (at most MaxGetCount and MaxGetBytes)
// from the queues, taken left to right, one per queue per pass (SPEC.md
// GETJOB). Queues paused for output are skipped. With nothing queued it
// returns nil at once under NoHang, or blocks until a job is queued (and
// is then served that one job), Timeout passes or ctx ends. An
// at-most-once job's delivery is fsynced before GetJobs returns it; an
// at-least-once job's is applied and its record queued for the AOF, not
// waited for (finishReply). A job whose body cannot be read is not
// delivered (see deliverLocked). Jobs are delivered getChunk at a time,
// each chunk under its own hold of Broker.mu.
func (b *Broker) GetJobs(ctx context.Context, req GetRequest) ([]Delivered, error) {
	count := min(max(req.Count, 1), b.maxGetCount)
again:
	now := b.nowMillis()
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if b.st.Failing() {
		b.mu.Unlock()
		return b.getWhileFailed(req, count)
	}
	start := time.Now() // for sizing chunks only
	first := b.firstTake(count)
	got, err := b.deliverLocked(req.Queues, first, now)
	var need []NeedJobsRequest
	if err == nil {
		need = b.needJobsAfterGetLocked(req.Queues, got.out, req.Leaving, now)
	}
	if err != nil || len(got.out) > 0 || req.NoHang || req.Leaving {
		hold := time.Since(start)
		b.mu.Unlock()
		b.holdDone(len(got.out))
		b.sendNeedJobs(need)
		if err != nil {
			return nil, err
		}
		if len(got.out) == 0 && !req.NoHang {
			return nil, ErrLeaving // Disque's -LEAVING: do not block here
		}
		b.deliverMore(&got, req.Queues, count, nextChunk(first.count, len(got.out), hold, b.getChunk))
		return b.finishReply(got)
	}
	if req.OnBlock != nil {
		// Before the waiter is registered: OnBlock may wait (the server
		// writes the replies pipelined before, to a client that may not
		// read them for now), and a waiter would take a job meanwhile
		// that a consumer blocked and reading could have. Then the
		// queues are looked at again (need is sent now: its plan is
		// paced, the second look would plan nothing).
		b.mu.Unlock()
		b.sendNeedJobs(need)
		var stop func()
		ctx, stop = req.OnBlock(ctx)
		defer stop()
		req.OnBlock = nil
		if err := ctx.Err(); err != nil {
			return nil, err // the client hung up meanwhile
		}
		goto again
	}
	w := &waiter{queues: slices.Clone(req.Queues), ch: make(chan waiterResult, 1)}
	for _, name := range req.Queues {
		q := b.queueLocked(name, now)
		q.waiters = append(q.waiters, w)
		b.noteWaitingLocked(q)
	}
	b.stats.BlockedClients++
	b.mu.Unlock()
	b.sendNeedJobs(need)

	var timeout <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case r := <-w.ch:
		return b.finishWaiter(r)
	case <-timeout:
	case <-ctx.Done():
	}
	b.mu.Lock()
	if w.done {
		// Served while we were giving up: the job is ours.
		b.mu.Unlock()
		return b.finishWaiter(<-w.ch)
	}
	b.removeWaiterLocked(w)
	b.mu.Unlock()
	return nil, ctx.Err()
}

// firstTake is the first chunk of a GETJOB of count jobs.
func (b *Broker) firstTake(count int) take {
	return take{count: min(count, b.getChunk), bytes: MaxGetBytes, first: true}
}

// deliverMore delivers the chunks after the first of a GETJOB of count
// jobs into got, each under its own hold of Broker.mu, until count, the
// byte budget, or a chunk that finds fewer jobs than it asked for. Like
// Tick's, each chunk is sized from the last one's hold (nextChunk: about
// chunkHold), starting at limit, at most getChunk jobs. An error (or the
// broker closing, or the store failing) ends it: the jobs of got are
// delivered already, and are returned.
func (b *Broker) deliverMore(got *delivery, names []string, count, limit int) {
	for len(got.out) < count && got.more {
		// Let a client woken by the last Unlock take the lock first (see
		// Tick).
		runtime.Gosched()
		t := take{count: min(count-len(got.out), limit), bytes: MaxGetBytes - got.bytes, start: got.next}
		b.mu.Lock()
		if b.closed || b.st.Failing() {
			b.mu.Unlock()
			return
		}
		start := time.Now()
		d, err := b.deliverLocked(names, t, b.nowMillis())
		hold := time.Since(start)
		b.mu.Unlock()
		b.holdDone(len(d.out))
		if err != nil {
			return
		}
		got.join(d)
		limit = nextChunk(limit, len(d.out), hold, b.getChunk)
	}
}

// getWhileFailed is GetJobs while the store has failed: chunks of
// deliverWhileFailedLocked, each under its own hold of Broker.mu.
func (b *Broker) getWhileFailed(req GetRequest, count int) ([]Delivered, error) {
	var out []Delivered
	budget := MaxGetBytes
	for len(out) < count {
		n := min(count-len(out), b.getChunk)
		b.mu.Lock()
		if err := b.checkOpenLocked(); err != nil {
			b.mu.Unlock()
			if len(out) > 0 {
				break
			}
			return nil, err
		}
		// Serve what is safe without a record (deliverWhileFailedLocked).
		got, used, err := b.deliverWhileFailedLocked(req.Queues, n, budget, len(out) == 0, b.nowMillis())
		b.mu.Unlock()
		b.holdDone(len(got))
		if err != nil {
			if len(out) > 0 {
				break // those are handed out: nothing was recorded
			}
			return nil, err
		}
		out = append(out, got...)
		budget -= used
		if len(got) < n || budget <= 0 {
			break
		}
	}
	switch {
	case len(out) > 0:
		return out, nil
	case req.NoHang:
		return nil, nil
	}
	// A GETJOB that would block is told why instead (nothing can be queued
	// now).
	return nil, wrapStore(fmt.Errorf("%w: %w", storage.ErrFailed, b.st.Err()))
}

// holdDone is called after each hold of Broker.mu in which GetJobs
// delivered jobs (tests watch the chunks).
func (b *Broker) holdDone(delivered int) {
	if b.testGetHoldHook != nil {
		b.testGetHoldHook(delivered)
	}
}

func (b *Broker) finishWaiter(r waiterResult) ([]Delivered, error) {
	if r.err != nil {
		return nil, r.err
	}
	return b.finishReply(r.got)
}

// finishReply is finish for a consumer's GETJOB. Deliveries of
// at-least-once jobs whose bodies were read already are returned at once,
// their records queued for the AOF but not waited for: Disque logs no
// delivery at all, and a delivery lost to a crash only queues its job
// again at the restart (its retry counts from then), to be delivered once
// more, which at-least-once allows. Every later record of such a job (its
// ACKJOB, NACK, WORKING, a requeue) is applied after the delivery and so
// follows it in the AOF, and whoever waits for that record's durability
// waits for the delivery's too. An at-most-once job's delivery is fsynced
// before the reply, as finish does (a crash must never deliver it twice),
// and a delivery with bodies still to read (their ADD not written yet)
// waits as well.
func (b *Broker) finishReply(d delivery) ([]Delivered, error) {
	if len(d.out) == 0 || len(d.late) > 0 || d.pending.AtMostOnce() {
		return b.finish(d)
	}
	if err := d.pending.Err(); err != nil {
		return nil, wrapStore(err)
	}
	return d.out, nil
}

// finish waits for the deliveries' durability and reads the bodies that
// were not durable yet when they were delivered. One of those that cannot
// be read is left out of the reply (it is delivered: an at-least-once job
// comes back after its RETRY); see noteUnreadableLocked.
func (b *Broker) finish(d delivery) ([]Delivered, error) {
	if len(d.out) == 0 {
		return nil, nil
	}
	if err := d.pending.Wait(); err != nil {
		return nil, wrapStore(err)
	}
	if len(d.late) == 0 {
		return d.out, nil
	}
	drop := false
	for k, r := range b.st.Bodies(d.late) {
		i := d.lateAt[k]
		if r.Err != nil {
			if !errors.Is(r.Err, storage.ErrNotFound) { // not deleted since: unreadable
				b.mu.Lock()
				b.noteUnreadableLocked(d.late[k], r.Err, unreadableDelivered)
				b.mu.Unlock()
			}
			d.out[i].ID, drop = "", true
			continue
		}
		d.out[i].Body = r.Body
	}
	if drop {
		d.out = slices.DeleteFunc(d.out, func(x Delivered) bool { return x.ID == "" })
	}
	return d.out, nil
}

// candidate is a queue entry popped from a head for delivery.
type candidate struct {
	q   *queueState
	pos storage.QueuePos
}

// deliverLocked takes up to count queued jobs from the queues round-robin
// and applies their deliveries, one store batch per round. Heads are
// refilled only between rounds: a refill reads the index, where popped
// entries stay queued until their batch applies.
//
// Bodies are read before the deliveries are recorded, under mu, so that a
// job whose body cannot be read (a damaged AOF) is not delivered at all —
// the others of the batch are — rather than recorded as delivered and then
// lost to the client (an at-most-once job would never come back). Those
// reads are of durable records, nearly always in the page cache. A body
// that is not durable yet (its ADD is being written: a job taken moments
// after it was added) is read after the wait instead (finish): reading it
// here would wait under mu for the AOF write — for the fsync, under
// appendfsync always — and it was written from memory just now.
//
// It delivers at most t.count jobs, and stops before a job that would take
// the replies past t.bytes (unless t.first and it is the first); those not
// taken go back to their heads. Its passes over the queues start at
// t.start, and the delivery says where the next one would (next), so that
// the chunks of one GETJOB keep its round-robin.
func (b *Broker) deliverLocked(names []string, t take, now int64) (delivery, error) {
	var qs []*queueState
	for _, name := range names {
		if b.st.PauseState(name)&storage.PauseOut != 0 {
			continue
		}
		if q := b.queueLocked(name, now); !slices.Contains(qs, q) {
			qs = append(qs, q)
		}
	}
	retryFn := func(j *storage.Job) int64 { return retryTime(now, j.Retry) }
	var nodesFn func(*storage.Job) []string
	if t.moved && t.to != "" {
		// The asker may hold a copy from now on: an ACKJOB here must
		// reach it. An at-most-once job's list does not matter: it is
		// deleted here once delivered.
		to := []string{t.to}
		nodesFn = func(j *storage.Job) []string {
			if j.Retry == 0 {
				return nil
			}
			if merged, grew := mergeNodes(j.Nodes, to); grew {
				return merged
			}
			return nil
		}
	}
	count := t.count
	var d delivery
	if len(qs) > 0 {
		d.next = t.start % len(qs)
	}
	full := false // stopped at the byte budget
	for len(d.out) < count {
		if full {
			if !t.first || len(d.out) > 0 {
				break
			}
			// The first job taken was not delivered (unreadable, or
			// stale): take a first one again.
			full = false
		}
		for _, q := range qs {
			if err := b.refillLocked(q, count-len(d.out)); err != nil {
				return delivery{}, wrapStore(err)
			}
		}
		cands := make([]candidate, 0, count-len(d.out)) // sized: append's growth was a tenth of GETJOB's bytes
		for progress := true; progress && len(cands)+len(d.out) < count; {
			progress = false
			start := d.next
			for k := range qs {
				if len(cands)+len(d.out) == count {
					break
				}
				i := (start + k) % len(qs)
				if p, ok := qs[i].head.Pop(); ok {
					cands = append(cands, candidate{qs[i], p})
					progress = true
					d.next = (i + 1) % len(qs)
				}
			}
		}
		if len(cands) == 0 {
			break
		}
		entries := make([]storage.QueueEntry, len(cands))
		for i, c := range cands {
			entries[i] = storage.QueueEntry{Queue: c.q.name, Pos: c.pos}
		}
		jobs, mark, err := b.st.QueuedJobs(entries)
		if err != nil {
			for _, c := range cands {
				c.q.head.Insert(c.pos) // still queued: back where they were
			}
			return delivery{}, wrapStore(err)
		}
		// Take jobs up to the byte budget; the rest go back to their heads
		// (they are still queued: nothing was applied).
		used := d.bytes
		for i, j := range jobs {
			if j == nil {
				continue
			}
			cost := replyCost(j)
			if used+cost > t.bytes && !(t.first && used == 0) {
				for k := i; k < len(jobs); k++ {
					if jobs[k] != nil {
						cands[k].q.head.Insert(cands[k].pos)
						jobs[k] = nil
					}
				}
				full = true
				break
			}
			used += cost
		}
		// Read the durable bodies; the others are read in finish.
		durable := b.st.Durable()
		early := make([]*storage.Job, 0, len(jobs))
		earlyAt := make([]int, 0, len(jobs))
		for i, j := range jobs {
			if j != nil && j.BodyLSN < durable {
				early = append(early, j)
				earlyAt = append(earlyAt, i)
			}
		}
		bodies := make([][]byte, len(cands))
		for k, r := range b.st.Bodies(early) {
			i := earlyAt[k]
			switch {
			case r.Err == nil:
				bodies[i] = r.Body
			case errors.Is(r.Err, storage.ErrNotFound):
				jobs[i] = nil // deleted meanwhile: stale
			default:
				b.markUnreadableLocked(cands[i].q, jobs[i], r.Err)
				jobs[i] = nil
			}
		}
		batch := b.st.NewBatch()
		batch.Grow(len(jobs))
		from := make([]int, 0, len(jobs)) // batch op → candidate
		for i, j := range jobs {
			if j != nil { // nil: stale (acked, deleted or moved since it was queued) or unreadable
				batch.DeliverQueued(j, mark, retryFn, nodesFn)
				from = append(from, i)
			}
		}
		if batch.Len() == 0 {
			continue
		}
		res, p := b.st.Apply(batch)
		if d.out == nil {
			d.out = make([]Delivered, 0, len(res)) // most GETJOBs take their jobs in one round
		}
		for k, r := range res {
			if r.Err != nil {
				if errUnusable(r.Err) {
					return delivery{}, wrapStore(r.Err)
				}
				continue // stale
			}
			i := from[k]
			q := cands[i].q
			q.jobsOut++
			q.atime = now
			if t.moved {
				d.jobs = append(d.jobs, r.Job)
				d.before = append(d.before, r.Old)
			} else {
				b.stats.JobsDelivered++
			}
			b.syncTimersLocked(r.Job.ID, r.Job)
			j := r.Job
			if jobs[i].BodyLSN >= durable {
				d.late = append(d.late, j)
				d.lateAt = append(d.lateAt, len(d.out))
			}
			d.out = append(d.out, Delivered{Queue: j.Queue, ID: j.ID, Body: bodies[i], Nacks: j.Nacks,
				AdditionalDeliveries: j.AdditionalDeliveries})
			d.bytes += replyCost(jobs[i])
		}
		d.pending = d.pending.Join(p)
	}
	d.more = len(d.out) == count && !full
	return d, nil
}

// markUnreadableLocked leaves a queued job whose body cannot be read out
// of deliveries: it is dropped from the queue's head and refills pass it
// over (queueState.unreadable), so GETJOB does not trip on it again; it
// stays queued in the index, so a restart after the AOF is repaired tries
// it again. It is counted and logged (noteUnreadableLocked).
func (b *Broker) markUnreadableLocked(q *queueState, j *storage.Job, err error) {
	if q.unreadable == nil {
		q.unreadable = map[string]struct{}{}
	}
	q.unreadable[j.ID] = struct{}{}
	b.noteUnreadableLocked(j, err, unreadableQueued)
}

// unreadableLogEvery bounds the ERROR lines about unreadable bodies: one
// per interval, the rest counted into the next line (a damaged segment can
// hold thousands of bodies).
const unreadableLogEvery = time.Second

// What was done about a job whose body could not be read.
const (
	unreadableQueued = "queue: a job's body cannot be read from the aof; " +
		"the job is left queued and undelivered (a restart after a repair retries it)"
	unreadableDelivered = "queue: a delivered job's body cannot be read from the aof; " +
		"it is left out of the reply (an at-least-once job is delivered again after its RETRY)"
	unreadablePeeked = "queue: QPEEK leaves out a job whose body cannot be read from the aof"
)

// noteUnreadableLocked logs a job whose body could not be read, at ERROR,
// at most one line per unreadableLogEvery, and counts it in
// Stats.JobsUnreadable unless a QPEEK found it (what says which).
func (b *Broker) noteUnreadableLocked(j *storage.Job, err error, what string) {
	if what != unreadablePeeked {
		b.stats.JobsUnreadable++
	}
	now := b.nowMillis()
	if b.unreadableLog.last != 0 && now-b.unreadableLog.last < unreadableLogEvery.Milliseconds() {
		b.unreadableLog.suppressed++
		return
	}
	b.opts.Logger.Error(what, "job", j.ID, "queue", j.Queue, "body_lsn", uint64(j.BodyLSN),
		"err", err, "unreadable_since_last_line", b.unreadableLog.suppressed)
	b.unreadableLog.last, b.unreadableLog.suppressed = now, 0
}

// deliverWhileFailedLocked is GETJOB while the store has failed (an AOF
// write or fsync error; the daemon reopens the store once the disk works
// again). A delivery cannot be logged, so only jobs for which an
// unrecorded delivery is safe are handed out: at-least-once jobs (RETRY >
// 0), queued, whose ADD record is durable. Nothing changes on disk: after
// the reopen they are queued again and delivered again, which
// at-least-once allows; an at-most-once job is never delivered without its
// delivery fsynced, and a job whose ADD may be lost is not delivered at
// all. Queues are read left to right from the index, past a per-queue
// cursor so that each job goes out once; this broker is replaced when the
// store is reopened, and the cursors with it. It never blocks: nothing can
// be queued while the store is failed. A job whose body cannot be read is
// passed over, and counted.
func (b *Broker) deliverWhileFailedLocked(names []string, count int, budget int64, first bool, now int64) ([]Delivered, int64, error) {
	if b.failedCursor == nil {
		b.failedCursor = map[string]storage.QueuePos{}
	}
	durable := b.st.Durable()
	var jobs []*storage.Job
	var used int64
	full := false // the next job would pass the budget
	for _, name := range names {
		if full || len(jobs) == count {
			break
		}
		if b.st.PauseState(name)&storage.PauseOut != 0 {
			continue
		}
		cur := b.failedCursor[name]
	pages:
		for len(jobs) < count {
			page, err := b.st.QueueRange(name, cur, 256)
			if err != nil {
				return nil, 0, wrapStore(err)
			}
			for _, p := range page {
				j, err := b.st.Job(p.ID)
				if err != nil || j.State != storage.StateQueued || j.Retry == 0 || j.BodyLSN >= durable {
					cur = p
					continue
				}
				if c := replyCost(j); used+c <= budget || first && used == 0 {
					used += c
				} else {
					full = true // this one is left for the next GETJOB
					break pages
				}
				cur = p
				jobs = append(jobs, j)
				if len(jobs) == count {
					break pages
				}
			}
			if len(page) < 256 {
				break
			}
		}
		b.failedCursor[name] = cur
		if q := b.queues[name]; q != nil {
			q.atime = now
		}
	}
	out := make([]Delivered, 0, len(jobs))
	for k, r := range b.st.Bodies(jobs) {
		j := jobs[k]
		switch {
		case errors.Is(r.Err, storage.ErrNotFound):
			continue
		case r.Err != nil:
			b.noteUnreadableLocked(j, r.Err, unreadableQueued)
			continue
		}
		b.stats.JobsDelivered++
		out = append(out, Delivered{Queue: j.Queue, ID: j.ID, Body: r.Body, Nacks: j.Nacks, AdditionalDeliveries: j.AdditionalDeliveries})
	}
	if full && len(out) < count {
		used = budget // stop here, even if some were not found or unreadable
	}
	return out, used, nil
}

// serveWaitersLocked hands queued jobs of q to its blocked clients, oldest
// client first, one job each.
func (b *Broker) serveWaitersLocked(q *queueState, now int64) {
	if b.st.PauseState(q.name)&storage.PauseOut != 0 {
		return
	}
	for len(q.waiters) > 0 {
		w := q.waiters[0]
		if w.done {
			q.waiters = q.waiters[1:]
			continue
		}
		got, err := b.deliverLocked([]string{q.name}, take{count: 1, bytes: MaxGetBytes, first: true}, now)
		if err != nil || len(got.out) == 0 {
			return
		}
		w.done = true
		b.removeWaiterLocked(w)
		w.ch <- waiterResult{got: got}
	}
}

func (b *Broker) removeWaiterLocked(w *waiter) {
	w.done = true
	for _, name := range w.queues {
		if q := b.queues[name]; q != nil {
			q.waiters = slices.DeleteFunc(q.waiters, func(x *waiter) bool { return x == w })
		}
	}
	b.stats.BlockedClients--
}
