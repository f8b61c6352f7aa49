package queue

import (
	"fmt"
	"slices"
	"sync"

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
	Async     bool  // ADDJOB ASYNC: reply before replication; a lone node replicates nothing
}

// AddResult is the outcome of one AddRequest.
type AddResult struct {
	ID  string
	Err error
}

// DefaultRetry is the RETRY of a job whose ADDJOB gave none: TTL/10, capped
// at 300 seconds and at least 1 (SPEC.md).
func DefaultRetry(ttl int64) int64 { return max(min(ttl/10, 300), 1) }

// AddJobs adds jobs: with those of concurrent calls, in one store batch, so
// that many connections' ADDJOBs share one commit and one AOF write
// (see addCombiner). Each gets its id, or its own error. It returns once the
// jobs are durable per the fsync policy.
func (b *Broker) AddJobs(reqs []AddRequest) []AddResult {
	call := &addCall{reqs: reqs, out: make([]AddResult, len(reqs))}
	b.adds.run(call, b.addCalls)
	if err := call.pending.Wait(); err != nil {
		for i := range call.out {
			if call.out[i].Err == nil {
				call.out[i] = AddResult{Err: wrapStore(err)}
			}
		}
	}
	return call.out
}

// addCalls applies the requests of calls as one store batch, filling each
// call's results and pending durability.
func (b *Broker) addCalls(calls []*addCall) {
	now := b.nowMillis()
	batch := b.st.NewBatch()
	type ref struct {
		call *addCall
		i    int
	}
	var refs []ref // batch op → request

	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpenLocked(); err != nil {
		for _, c := range calls {
			for i := range c.out {
				c.out[i].Err = err
			}
		}
		return
	}
	added := map[string]int64{} // per queue, for MAXLEN within the batch
	for _, c := range calls {
		for i, r := range c.reqs {
			if err := b.validateAdd(r); err != nil {
				c.out[i].Err = err
				continue
			}
			if b.st.PauseState(r.Queue)&storage.PauseIn != 0 {
				c.out[i].Err = ErrPaused
				continue
			}
			if r.MaxLen > 0 && b.st.QueueLen(r.Queue)+added[r.Queue] >= r.MaxLen {
				c.out[i].Err = ErrMaxLen
				continue
			}
			j := b.newJob(r, now)
			if err := batch.AddNew(j, r.Body, r.TTL); err != nil {
				c.out[i].Err = err
				continue
			}
			if j.State == storage.StateQueued {
				added[r.Queue]++
			}
			refs = append(refs, ref{c, i})
		}
	}
	if len(refs) == 0 {
		return
	}
	res, pending := b.st.Apply(batch)
	for _, c := range calls {
		c.pending = pending
	}
	for k, r := range refs {
		if err := res[k].Err; err != nil {
			r.call.out[r.i].Err = wrapStore(err)
			continue
		}
		j := res[k].Job
		r.call.out[r.i].ID = j.ID
		b.stats.JobsAdded++
		b.syncTimersLocked(j.ID, j)
		if q := b.queueLocked(j.Queue, now); j.State == storage.StateQueued {
			q.jobsIn++
			b.queuedLocked(j, now)
		}
	}
}

// addCall is one AddJobs call waiting in an addCombiner.
type addCall struct {
	reqs    []AddRequest
	out     []AddResult
	pending storage.Pending
	// wake tells a waiting call that it was applied (false) or that it
	// leads the next round (true).
	wake chan bool
}

// addCombiner merges concurrent AddJobs calls (flat combining). A call
// that finds no round running leads one: it takes every call waiting,
// its own included, and applies them together; the others sleep until
// they are applied. When the round ends, the first call that arrived during
// it leads the next, so a leader applies at most one round beside its own
// and a busy broker makes a few large batches instead of many small ones:
// each store batch pays for its lock handoffs, counters and Pebble commit
// once, and gives storage's write buffer more of them at a time.
// A lone call leads at once and waits for nobody.
type addCombiner struct {
	mu      sync.Mutex
	waiting []*addCall
	running bool
}

// maxAddRound bounds the requests of one round, so that a round's hold of
// the broker's lock (several µs per job) stays within milliseconds for the
// GETJOBs and timers waiting behind it.
const maxAddRound = 1024

func (c *addCombiner) run(call *addCall, apply func([]*addCall)) {
	c.mu.Lock()
	c.waiting = append(c.waiting, call)
	lead := !c.running
	c.running = true
	if !lead {
		call.wake = make(chan bool, 1)
	}
	c.mu.Unlock()
	if !lead && !<-call.wake {
		return // applied by another call's round
	}
	c.mu.Lock()
	n, reqs := 0, 0
	for n < len(c.waiting) && (n == 0 || reqs+len(c.waiting[n].reqs) <= maxAddRound) {
		reqs += len(c.waiting[n].reqs)
		n++
	}
	round := slices.Clone(c.waiting[:n])
	c.waiting = slices.Delete(c.waiting, 0, n)
	c.mu.Unlock()

	apply(round)

	c.mu.Lock()
	if len(c.waiting) > 0 {
		c.waiting[0].wake <- true
	} else {
		c.running = false
	}
	c.mu.Unlock()
	for _, other := range round {
		if other != call {
			other.wake <- false
		}
	}
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

// newJob builds the store's record of a new job created at now; the store
// gives it its id (Batch.AddNew).
func (b *Broker) newJob(r AddRequest, now int64) *storage.Job {
	j := &storage.Job{
		Queue: r.Queue,
		Ctime: b.ctime.Next(now),
		Etime: now + secondsToMillis(r.TTL),
		Delay: uint32(min(r.Delay, 1<<32-1)),
		Retry: uint32(min(r.Retry, 1<<32-1)),
		Repl:  uint16(max(r.Replicate, 1)),
		Nodes: b.selfNodes,
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
