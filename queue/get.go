package queue

import (
	"context"
	"fmt"
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
	job     *storage.Job
	pending storage.Pending
	err     error
}

// GetJobs delivers up to Count jobs from the queues, taken left to right,
// one per queue per pass (SPEC.md GETJOB). Queues paused for output are
// skipped. With nothing queued it returns nil at once under NoHang, or
// blocks until a job is queued (and is then served that one job), Timeout
// passes or ctx ends. Each job's delivery is durable per the fsync policy
// before GetJobs returns it (fsynced, for at-most-once jobs).
func (b *Broker) GetJobs(ctx context.Context, req GetRequest) ([]Delivered, error) {
	now := b.nowMillis()
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	if b.st.Failing() {
		// The AOF failed: no delivery can be logged until the store is
		// reopened. Serve what is safe without a record; a GETJOB that
		// would block is told why instead (nothing can be queued now).
		jobs, err := b.deliverWhileFailedLocked(req.Queues, max(req.Count, 1), now)
		b.mu.Unlock()
		switch {
		case err != nil:
			return nil, err
		case len(jobs) > 0:
			return b.finishDelivery(jobs, storage.Pending{})
		case req.NoHang:
			return nil, nil
		}
		return nil, wrapStore(fmt.Errorf("%w: %w", storage.ErrFailed, b.st.Err()))
	}
	jobs, pending, err := b.deliverLocked(req.Queues, max(req.Count, 1), now)
	if err != nil || len(jobs) > 0 || req.NoHang {
		b.mu.Unlock()
		if err != nil {
			return nil, err
		}
		return b.finishDelivery(jobs, pending)
	}
	w := &waiter{queues: slices.Clone(req.Queues), ch: make(chan waiterResult, 1)}
	for _, name := range req.Queues {
		q := b.queueLocked(name, now)
		q.waiters = append(q.waiters, w)
	}
	b.stats.BlockedClients++
	b.mu.Unlock()

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

func (b *Broker) finishWaiter(r waiterResult) ([]Delivered, error) {
	if r.err != nil {
		return nil, r.err
	}
	return b.finishDelivery([]*storage.Job{r.job}, r.pending)
}

// finishDelivery waits for the deliveries' durability and reads the bodies.
func (b *Broker) finishDelivery(jobs []*storage.Job, pending storage.Pending) ([]Delivered, error) {
	if len(jobs) == 0 {
		return nil, nil
	}
	if err := pending.Wait(); err != nil {
		return nil, wrapStore(err)
	}
	bodies, err := b.st.Bodies(jobs)
	if err != nil {
		return nil, wrapStore(err)
	}
	out := make([]Delivered, len(jobs))
	for i, j := range jobs {
		out[i] = Delivered{Queue: j.Queue, ID: j.ID, Body: bodies[i], Nacks: j.Nacks, AdditionalDeliveries: j.AdditionalDeliveries}
	}
	return out, nil
}

// deliverLocked takes up to count queued jobs from the queues round-robin
// and applies their deliveries, one store batch per round. Heads are
// refilled only between rounds: a refill reads the index, where popped
// entries stay queued until their batch applies.
func (b *Broker) deliverLocked(names []string, count int, now int64) ([]*storage.Job, storage.Pending, error) {
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
	var jobs []*storage.Job
	var pending storage.Pending
	for len(jobs) < count {
		for _, q := range qs {
			if err := b.refillLocked(q, count-len(jobs)); err != nil {
				return nil, storage.Pending{}, wrapStore(err)
			}
		}
		batch := b.st.NewBatch()
		var from []*queueState
		for progress := true; progress && len(from)+len(jobs) < count; {
			progress = false
			for _, q := range qs {
				if len(from)+len(jobs) == count {
					break
				}
				if p, ok := q.head.Pop(); ok {
					batch.DeliverAt(q.name, p, retryFn)
					from = append(from, q)
					progress = true
				}
			}
		}
		if len(from) == 0 {
			break
		}
		res, p := b.st.Apply(batch)
		for i, r := range res {
			if r.Err != nil {
				if errUnusable(r.Err) {
					return nil, storage.Pending{}, wrapStore(r.Err)
				}
				continue // stale: acked, deleted or moved since it was queued
			}
			jobs = append(jobs, r.Job)
			from[i].jobsOut++
			from[i].atime = now
			b.stats.JobsDelivered++
			b.syncTimersLocked(r.Job.ID, r.Job)
		}
		pending = pending.Join(p)
	}
	return jobs, pending, nil
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
// be queued while the store is failed.
func (b *Broker) deliverWhileFailedLocked(names []string, count int, now int64) ([]*storage.Job, error) {
	if b.failedCursor == nil {
		b.failedCursor = map[string]storage.QueuePos{}
	}
	durable := b.st.Durable()
	var jobs []*storage.Job
	for _, name := range names {
		if b.st.PauseState(name)&storage.PauseOut != 0 {
			continue
		}
		cur := b.failedCursor[name]
		for len(jobs) < count {
			page, err := b.st.QueueRange(name, cur, 256)
			if err != nil {
				return nil, wrapStore(err)
			}
			for _, p := range page {
				cur = p
				j, err := b.st.Job(p.ID)
				if err != nil || j.State != storage.StateQueued || j.Retry == 0 || j.BodyLSN >= durable {
					continue
				}
				jobs = append(jobs, j)
				b.stats.JobsDelivered++
				if len(jobs) == count {
					break
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
	return jobs, nil
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
		jobs, pending, err := b.deliverLocked([]string{q.name}, 1, now)
		if err != nil || len(jobs) == 0 {
			return
		}
		w.done = true
		b.removeWaiterLocked(w)
		w.ch <- waiterResult{job: jobs[0], pending: pending}
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
