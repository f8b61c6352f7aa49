package queue

import (
	"cmp"
	"fmt"
	"runtime"
	"slices"
	"sync"

	"github.com/diskque/diskque/storage"
)

// AddRequest is one ADDJOB, its options resolved (see DefaultRetry).
type AddRequest struct {
	Queue string
	Body  []byte
	// Replicate is the copies wanted, this node included; 0 means the
	// default, DefaultReplicate.
	Replicate int
	TTL       int64 // seconds, > 0
	Retry     int64 // seconds, 0 = at-most-once
	Delay     int64 // seconds, < TTL
	MaxLen    int64 // refuse if the queue already has this many jobs; 0 = off
	Async     bool  // ADDJOB ASYNC: reply once the copies are sent, not confirmed
	// Timeout is ADDJOB's ms-timeout: how long a synchronous replication
	// may take, in milliseconds (0 = until the job's TTL).
	Timeout int64
	// External: keep no copy here, replicate to Replicate other nodes and
	// have one of them queue the job (external.go); the server sets it
	// when this node is leaving or short of memory or disk.
	External External
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
// jobs are durable per the fsync policy and, for a synchronous REPLICATE n
// > 1, once n−1 other nodes confirmed a durable copy (or the ms-timeout
// passed: ErrReplTimeout, and the job is gone). The jobs of one add batch
// that replicate are handed to the cluster together once the combiner's
// round is over (replRound): synchronous ones while the batch is still
// being written, asynchronous ones of a non-planner cluster once it is
// durable.
func (b *Broker) AddJobs(reqs []AddRequest) []AddResult {
	if slices.ContainsFunc(reqs, func(r AddRequest) bool { return r.External != ExternalNo }) {
		return b.addMixed(reqs)
	}
	call := &addCall{reqs: reqs, out: make([]AddResult, len(reqs))}
	b.adds.run(call, b.addCalls)
	if call.repl != nil {
		// Whichever call of the round gets here first replicates for all
		// of them; the others wait for it (sync.Once).
		call.repl.once.Do(func() { b.replicateRound(call.repl) })
	}
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
		repl int // the copies wanted, resolved
	}
	var refs []ref // batch op → request

	// The cluster is asked before Broker.mu is taken (it must never be
	// called under it): how many nodes there are and can take a copy.
	known, reachable := 1, 0
ask:
	for _, c := range calls {
		for _, r := range c.reqs {
			if r.Replicate != 1 {
				known, reachable = max(b.cluster.KnownNodes(), 1), b.cluster.ReachablePeers()
				break ask // once per batch, not once per call
			}
		}
	}
	// A replicated job's other nodes, chosen now if the cluster can:
	// planned[call][i] is request i's. An ASYNC job's (AsyncPlanner) are
	// its copies' nodes; a synchronous one's (SyncPlanner) the nodes its
	// first REPLJOBs go to.
	var planned [][][]string
	plan := func(ci, i int, nodes []string) {
		if planned == nil {
			planned = make([][][]string, len(calls))
		}
		if planned[ci] == nil {
			planned[ci] = make([][]string, len(calls[ci].reqs))
		}
		planned[ci][i] = nodes
	}
	asyncPlanner, _ := b.cluster.(AsyncPlanner)
	syncPlanner, _ := b.cluster.(SyncPlanner)
	// The other nodes each synchronous and each ASYNC job needs, in
	// request order, and where each goes: one planner call for each kind.
	type slot struct{ ci, i int }
	var syncNeed, asyncNeed []int
	var syncAt, asyncAt []slot
	for ci, c := range calls {
		for i, r := range c.reqs {
			repl := cmp.Or(r.Replicate, min(3, known))
			if repl <= 1 || repl-1 > reachable {
				continue
			}
			switch {
			case r.Async && asyncPlanner != nil:
				asyncNeed, asyncAt = append(asyncNeed, repl-1), append(asyncAt, slot{ci, i})
			case !r.Async && syncPlanner != nil:
				syncNeed, syncAt = append(syncNeed, repl-1), append(syncAt, slot{ci, i})
			}
		}
	}
	assign := func(at []slot, nodes [][]string) {
		for k, s := range at[:min(len(at), len(nodes))] {
			plan(s.ci, s.i, nodes[k])
		}
	}
	if len(asyncNeed) > 0 {
		assign(asyncAt, asyncPlanner.AsyncNodes(asyncNeed))
	}
	// Read after the plan and before the commit below (PlanMarker).
	var planMark uint64
	if m, ok := asyncPlanner.(PlanMarker); ok && planned != nil {
		planMark = m.PlanMark()
	}
	if len(syncNeed) > 0 {
		assign(syncAt, syncPlanner.SyncNodes(syncNeed))
	}

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
	for ci, c := range calls {
		for i, r := range c.reqs {
			if r.Replicate == 0 {
				r.Replicate = min(3, known)
			}
			if err := b.validateAdd(r, reachable); err != nil {
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
			var nodes []string
			if planned != nil && planned[ci] != nil && len(planned[ci][i]) > 0 {
				nodes = append(slices.Clip(b.selfNodes), planned[ci][i]...)
			}
			j := b.newJob(r, now, nodes)
			if err := batch.AddNew(j, r.Body, r.TTL); err != nil {
				c.out[i].Err = err
				continue
			}
			if j.State == storage.StateQueued {
				added[r.Queue]++
			}
			refs = append(refs, ref{c, i, r.Replicate})
		}
	}
	if len(refs) == 0 {
		return
	}
	res, pending := b.st.Apply(batch)
	var round *replRound
	for _, c := range calls {
		c.pending = pending
	}
	for k, r := range refs {
		if err := res[k].Err; err != nil {
			r.call.out[r.i].Err = wrapStore(err)
			continue
		}
		j := res[k].Job
		b.stats.JobsAdded++
		b.syncTimersLocked(j.ID, j)
		if r.repl > 1 {
			if round == nil {
				round = &replRound{pending: pending}
			}
			req := r.call.reqs[r.i]
			item := replItem{call: r.call, i: r.i, Replication: Replication{Job: j, Body: req.Body}}
			if req.Async && j.State != storage.StateWaitRepl {
				item.Plan = planMark
				round.planned = append(round.planned, item)
			} else if !req.Async {
				item.Deadline = j.Etime
				if req.Timeout > 0 {
					item.Deadline = min(item.Deadline, now+req.Timeout)
				}
				round.sync = append(round.sync, item)
			} else {
				round.async = append(round.async, item)
			}
			r.call.repl = round
		}
		if j.State == storage.StateWaitRepl {
			continue // its id is told once it is replicated
		}
		r.call.out[r.i].ID = j.ID
		if q := b.queueLocked(j.Queue, now); j.State == storage.StateQueued {
			q.jobsIn++
			b.queuedLocked(j, now)
		}
	}
}

// replRound is the replication of one add batch's jobs: run once,
// outside the combiner and Broker.mu, by the first of the round's calls to
// get there (the others wait on once); replicateRound says when it waits
// for the batch's durability.
type replRound struct {
	once    sync.Once
	pending storage.Pending
	sync    []replItem // wait-repl: replicated, then queued (or deleted)
	async   []replItem // wait-repl: copies sent, not waited for, then queued
	// planned: ASYNC jobs stored with the nodes AsyncPlanner chose,
	// queued already: their copies are sent, and that is all.
	planned []replItem
}

// replItem is one job of a replRound and the request it answers.
type replItem struct {
	Replication
	call *addCall
	i    int
}

// replicateRound hands a round's jobs to the cluster and finishes them: a
// synchronous job that enough nodes confirmed gets its nodes and is queued
// (or left for its DELAY), one that timed out is deleted here; an
// asynchronous one gets the nodes its copies were sent to and is queued —
// only then, so that a consumer cannot take and ack it while its node
// list still says only this node holds it (its copies would never be
// collected). The async jobs finish before the sync ones are waited for.
// It writes the results of the round's requests (each call's own slots,
// read by its AddJobs after once.Do returns).
func (b *Broker) replicateRound(r *replRound) {
	if len(r.planned) > 0 {
		// Sent while this node's write may still be on its way to the
		// AOF: nothing here waits for the copies, and the ADDJOBs are
		// answered once that write is durable (AddJobs).
		jobs := make([]Replication, len(r.planned))
		for k, it := range r.planned {
			jobs[k] = it.Replication
		}
		b.cluster.(AsyncPlanner).SendAsync(jobs)
	}
	if len(r.sync)+len(r.async) == 0 {
		return
	}
	// Synchronous copies go out while this node's batch is still on its
	// way to the AOF, not after: the replicas' writes (their fsyncs under
	// appendfsync always) overlap this node's instead of following it,
	// one durable write fewer in a row per round. No reply depends on
	// it — an ADDJOB is answered only after its QUEUE record, later in
	// the log, is durable, and a timed-out job's collection is applied
	// after the batch too. A crash before the batch is durable leaves
	// copies of a job this node never stored: they requeue after RETRY,
	// an unanswered ADDJOB's job delivered (as external replication's can
	// be), never an answered one lost. (A non-planner round's ASYNC jobs,
	// r.async, are replicated after the wait: their nodes are recorded
	// then, and they keep the old order.)
	var syncRes []ReplicationResult
	early := len(r.sync) > 0 && len(r.async) == 0
	if early {
		syncRes = b.cluster.Replicate(replications(r.sync))
	}
	if err := r.pending.Wait(); err != nil {
		// A copy sent early requeues after its RETRY, as after a crash.
		for _, it := range append(r.sync, r.async...) {
			it.call.out[it.i] = AddResult{Err: wrapStore(err)}
		}
		return
	}
	finish := func(items []replItem, nodes [][]string, ok []bool) {
		outcome, err := b.finishReplication(items, nodes, ok)
		for k, it := range items {
			switch {
			case err != nil:
				it.call.out[it.i] = AddResult{Err: err}
			case outcome[k] != nil:
				it.call.out[it.i] = AddResult{Err: outcome[k]}
			default:
				it.call.out[it.i] = AddResult{ID: it.Job.ID}
			}
		}
	}
	if len(r.async) > 0 {
		jobs := make([]Replication, len(r.async))
		for k, it := range r.async {
			jobs[k] = it.Replication
		}
		nodes := b.cluster.ReplicateAsync(jobs)
		ok := make([]bool, len(nodes))
		for k := range ok {
			ok[k] = true
		}
		finish(r.async, nodes, ok)
	}
	if len(r.sync) > 0 {
		if !early {
			syncRes = b.cluster.Replicate(replications(r.sync))
		}
		var nodes [][]string
		var ok []bool
		for _, res := range syncRes {
			nodes, ok = append(nodes, res.Nodes), append(ok, res.OK)
		}
		finish(r.sync, nodes, ok)
	}
}

// replications returns the jobs of items.
func replications(items []replItem) []Replication {
	jobs := make([]Replication, len(items))
	for k, it := range items {
		jobs[k] = it.Replication
	}
	return jobs
}

// finishReplication applies the outcome of replications under Broker.mu
// and waits for its durability outside it: for each job, its nodes (a
// wait-repl job becomes active), then its queueing (a synchronous one
// without DELAY), or, for one not confirmed in time, its deletion. It
// returns, per job, nil or why its ADDJOB fails.
func (b *Broker) finishReplication(items []replItem, nodes [][]string, ok []bool) ([]error, error) {
	outcome := make([]error, len(items))
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	now := b.nowMillis()
	batch := b.st.NewBatch()
	type opRef struct {
		item int
		kind byte // 'n' nodes, 'q' queue, 'd' delete, 'a' ack
	}
	var ops []opRef
	for k, it := range items {
		id := it.Job.ID
		switch {
		case k < len(nodes) && !ok[k] && len(nodes[k]) > 1:
			// Copies were sent: the job is acked here, not deleted, and
			// its collection (Cluster.Acked: SETACK until every node it
			// went to confirmed, then DELJOB) deletes them and then it —
			// retried, and resumed after a restart from the acked job on
			// disk. A lone DELJOB, lost, would leave a copy to be
			// requeued: a job the client was told failed, delivered.
			outcome[k] = ErrReplTimeout
			batch.SetNodes(id, nodes[k])
			batch.Ack(id)
			ops = append(ops, opRef{k, 'n'}, opRef{k, 'a'})
		case k >= len(nodes) || !ok[k]:
			outcome[k] = ErrReplTimeout
			batch.Delete(id)
			ops = append(ops, opRef{k, 'd'})
		default:
			waitRepl := it.Job.State == storage.StateWaitRepl
			queueIt := waitRepl && it.Job.AwakeTime == 0
			// A job stored with the nodes its copies went to (SyncPlanner)
			// is queued by one record: its node list is right already.
			if len(nodes[k]) > 1 && !(queueIt && slices.Equal(nodes[k], it.Job.Nodes)) {
				batch.SetNodes(id, nodes[k])
				ops = append(ops, opRef{k, 'n'})
			}
			if waitRepl && len(nodes[k]) <= 1 {
				batch.SetNodes(id, b.selfNodes) // wait-repl → active
				ops = append(ops, opRef{k, 'n'})
			}
			if queueIt {
				batch.Queue(id, retryTime(now, it.Job.Retry))
				ops = append(ops, opRef{k, 'q'})
			}
		}
	}
	// firstOp[item] is the kind of the item's first operation: the one
	// that finds a wait-repl job gone (expired, deleted by a DELJOB).
	firstOp := make([]byte, len(items))
	for _, o := range ops {
		if firstOp[o.item] == 0 {
			firstOp[o.item] = o.kind
		}
	}
	if batch.Len() == 0 {
		b.mu.Unlock()
		return outcome, nil
	}
	res, pending := b.st.Apply(batch)
	// collect: the timed-out jobs acked here; gone: those that went
	// meanwhile (expired, deleted), whose copies get a DELJOB only.
	var collect, gone []*storage.Job
	for n, r := range res {
		o := ops[n]
		if r.Err != nil {
			if errUnusable(r.Err) {
				b.mu.Unlock()
				return nil, wrapStore(r.Err)
			}
			if o.kind == 'a' {
				j := *items[o.item].Job
				j.Nodes = nodes[o.item]
				gone = append(gone, &j)
			}
			if o.kind != 'd' && o.kind == firstOp[o.item] && items[o.item].Job.State == storage.StateWaitRepl {
				// Gone meanwhile (expired, deleted by a DELJOB).
				outcome[o.item] = ErrReplTimeout
			}
			if o.kind == 'n' && items[o.item].Job.State != storage.StateWaitRepl {
				b.opts.Logger.Warn("queue: could not record the nodes of a replicated job", "job", items[o.item].Job.ID, "err", r.Err)
			}
			continue
		}
		b.syncTimersLocked(r.Old.ID, r.Job)
		switch o.kind {
		case 'q':
			q := b.queueLocked(r.Job.Queue, now)
			q.jobsIn++
			b.queuedLocked(r.Job, now)
		case 'd':
			if r.Old.State == storage.StateQueued {
				b.unqueuedLocked(r.Old)
			}
		case 'a':
			collect = append(collect, r.Job)
		}
	}
	b.mu.Unlock()
	if err := pending.Wait(); err != nil {
		return nil, wrapStore(err)
	}
	if len(collect) > 0 {
		b.cluster.Acked(collect)
	}
	if len(gone) > 0 {
		b.cluster.FastAcked(gone, nil)
	}
	return outcome, nil
}

// SyncPlanner is optional for a Cluster (package replication's has it):
// it chooses, before a synchronous job is stored, the nodes its first
// REPLJOBs go to. The job is stored in wait-repl with them as its node
// list, Replicate sends to them first (a job's Nodes beyond this node),
// and once they all confirmed, the job is queued by one record instead
// of a node list and a queueing (finishReplication). A node added later
// (one did not answer) is recorded as before.
type SyncPlanner interface {
	// SyncNodes returns, for each count n of need, up to n other nodes
	// a synchronous copy can be sent to now, as Replicate would choose
	// them; fewer (even none) when fewer are up: Replicate picks the
	// rest.
	SyncNodes(need []int) [][]string
}

// addCall is one AddJobs call waiting in an addCombiner.
type addCall struct {
	reqs    []AddRequest
	out     []AddResult
	pending storage.Pending
	// repl is the replication of the round's jobs that replicate (nil if
	// none of this call's does).
	repl *replRound
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
	if lead {
		// A call that found no round running lets the goroutines ready
		// to run on this thread (other connections' commands, read
		// already) go first: those that add join its round instead of
		// each leading its own. At pipeline 1 a round was one client's
		// job, and every job paid alone for its commits, its REPLJOBs and
		// their answers; a yield costs well under a µs when nothing waits.
		runtime.Gosched()
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

// validateAdd checks one request, its Replicate resolved, against the
// reachable peers: n copies need n−1 of them.
func (b *Broker) validateAdd(r AddRequest, reachable int) error {
	switch {
	case r.Queue == "" || len(r.Queue) > storage.MaxQueueNameLen:
		return fmt.Errorf("queue: queue name must be 1 to %d bytes", storage.MaxQueueNameLen)
	case r.TTL <= 0:
		return fmt.Errorf("queue: TTL must be positive")
	case r.Retry < 0 || r.Delay < 0:
		return fmt.Errorf("queue: RETRY and DELAY must not be negative")
	case r.Delay >= r.TTL:
		return fmt.Errorf("queue: DELAY must be less than TTL")
	case r.Replicate < 1 || r.Replicate > 65535:
		return fmt.Errorf("queue: REPLICATE must be between 1 and 65535")
	case r.Replicate-1 > reachable:
		return ErrNoRepl
	}
	return nil
}

// newJob builds the store's record of a new job created at now; the store
// gives it its id (Batch.AddNew). nodes, if not nil, is the job's node
// list, chosen already: an ASYNC job's (AsyncPlanner), which then needs
// no wait-repl, or a synchronous one's (SyncPlanner).
func (b *Broker) newJob(r AddRequest, now int64, nodes []string) *storage.Job {
	j := &storage.Job{
		Queue: r.Queue,
		Ctime: b.ctime.Next(now),
		Etime: now + secondsToMillis(r.TTL),
		Delay: uint32(min(r.Delay, 1<<32-1)),
		Retry: uint32(min(r.Retry, 1<<32-1)),
		Repl:  uint16(max(r.Replicate, 1)),
		Nodes: b.selfNodes,
	}
	if nodes != nil {
		j.Nodes = nodes
	}
	switch {
	case r.Replicate > 1 && (nodes == nil || !r.Async):
		// Two-phase: stored, then replicated, then queued (or left for its
		// DELAY, whose event fires once it is active). ASYNC too: it is
		// queued once the nodes its copies went to are recorded, so an
		// ACKJOB always knows where they are. A synchronous job's nodes,
		// if planned, are the ones its first REPLJOBs go to.
		j.State = storage.StateWaitRepl
		if r.Delay > 0 {
			j.AwakeTime = now + secondsToMillis(r.Delay)
		}
	case r.Delay > 0:
		j.State = storage.StateActive
		j.AwakeTime = now + secondsToMillis(r.Delay)
	default:
		j.State = storage.StateQueued
		j.QueueTime = retryTime(now, j.Retry)
	}
	return j
}
