package queue

import (
	"fmt"

	"github.com/diskque/diskque/storage"
)

// AddRequest is one ADDJOB, its options resolved (see DefaultRetry).
type AddRequest struct {
	Queue     string
	Body      []byte
	Replicate int   // copies wanted, this node included
	TTL       int64 // seconds, > 0
	Retry     int64 // seconds, 0 = at-most-once
	Delay     int64 // seconds, < TTL
	MaxLen    int64 // refuse if the queue already has this many jobs; 0 = off
	Async     bool
}

// AddResult is the outcome of one AddRequest.
type AddResult struct {
	ID  string
	Err error
}

// DefaultRetry is the RETRY of a job whose ADDJOB gave none: TTL/10, capped
// at 300 seconds and at least 1 (SPEC.md).
func DefaultRetry(ttl int64) int64 { return max(min(ttl/10, 300), 1) }

// AddJobs adds jobs: all in one store batch, so a pipeline of ADDJOBs shares
// one AOF write and one index batch. Each gets its id, or its own error. It
// returns once the jobs are durable per the fsync policy.
func (b *Broker) AddJobs(reqs []AddRequest) []AddResult {
	out := make([]AddResult, len(reqs))
	now := b.nowMillis()
	batch := b.st.NewBatch()
	idx := make([]int, 0, len(reqs)) // batch op → request
	jobs := make([]*storage.Job, len(reqs))

	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	added := map[string]int64{} // per queue, for MAXLEN within the batch
	for i, r := range reqs {
		if err := b.validateAdd(r); err != nil {
			out[i].Err = err
			continue
		}
		if b.st.PauseState(r.Queue)&storage.PauseIn != 0 {
			out[i].Err = ErrPaused
			continue
		}
		if r.MaxLen > 0 && b.st.QueueLen(r.Queue)+added[r.Queue] >= r.MaxLen {
			out[i].Err = ErrMaxLen
			continue
		}
		j := b.newJob(r, now)
		if err := batch.AddNew(j, r.Body); err != nil {
			out[i].Err = err
			continue
		}
		if j.State == storage.StateQueued {
			added[r.Queue]++
		}
		jobs[i] = j
		idx = append(idx, i)
	}
	if len(idx) == 0 {
		b.mu.Unlock()
		return out
	}
	res, pending := b.st.Apply(batch)
	for k, i := range idx {
		if err := res[k].Err; err != nil {
			out[i].Err = wrapStore(err)
			continue
		}
		j := res[k].Job
		out[i].ID = j.ID
		b.stats.JobsAdded++
		b.syncTimersLocked(j.ID, j)
		if q := b.queueLocked(j.Queue, now); j.State == storage.StateQueued {
			q.jobsIn++
			b.queuedLocked(j, now)
		}
	}
	b.mu.Unlock()
	if err := pending.Wait(); err != nil {
		for _, i := range idx {
			out[i] = AddResult{Err: wrapStore(err)}
		}
	}
	return out
}

func (b *Broker) validateAdd(r AddRequest) error {
	switch {
	case r.Queue == "" || len(r.Queue) > storage.MaxQueueNameLen:
		return fmt.Errorf("queue: queue name must be 1 to %d bytes", storage.MaxQueueNameLen)
	case r.TTL <= 0:
		return fmt.Errorf("queue: TTL must be positive")
	case r.Retry < 0 || r.Delay < 0:
		return fmt.Errorf("queue: RETRY and DELAY must not be negative")
	case r.Delay >= r.TTL:
		return fmt.Errorf("queue: DELAY must be less than TTL")
	case r.Replicate > 1:
		// A lone node: no peer can hold a copy.
		return ErrNoRepl
	}
	return nil
}

// newJob builds the store's record of a new job created at now.
func (b *Broker) newJob(r AddRequest, now int64) *storage.Job {
	j := &storage.Job{
		ID:    storage.NewJobID(b.node, r.TTL, r.Retry),
		Queue: r.Queue,
		Ctime: b.ctime.Next(now),
		Etime: now + secondsToMillis(r.TTL),
		Delay: uint32(min(r.Delay, 1<<32-1)),
		Retry: uint32(min(r.Retry, 1<<32-1)),
		Repl:  uint16(max(r.Replicate, 1)),
		Nodes: []string{b.node},
	}
	if r.Delay > 0 {
		j.State = storage.StateActive
		j.AwakeTime = now + secondsToMillis(r.Delay)
	} else {
		j.State = storage.StateQueued
		j.QueueTime = retryTime(now, j.Retry)
	}
	return j
}
