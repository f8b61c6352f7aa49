package queue

import (
	"fmt"

	"github.com/diskque/diskque/storage"
)

// External replication (CLUSTER.md "External replication", Disque's
// addjobCommand with extrepl): an ADDJOB on a node that is leaving, or
// short of memory or disk, keeps no copy here. The job gets its id here
// (this node's prefix), is sent to Replicate *other* nodes and one of them
// is told to queue it (ENQUEUE); nothing is written to this node's store,
// not even a wait-repl entry, so a node out of disk can still take jobs.
// The reply is the id once Replicate other nodes confirmed a durable copy
// (or at once with ASYNC), as for any synchronous ADDJOB.
//
// What a crash of this node costs: nothing that was acknowledged (the
// copies are on the other nodes' disks before the reply). A job whose
// ADDJOB was never answered may survive on the nodes it reached (there is
// no wait-repl entry here whose restart would delete them): they requeue
// it after its RETRY, which at-least-once allows.

// External says why an ADDJOB keeps no copy on this node; the server sets
// it (AddRequest.External) from what it measures and from QUEUE-RANDOMLY.
// The values are ordered: of the option and a measured pressure the server
// keeps the larger, so a NOREPL names the pressure. In memory only (never
// stored or sent), so they may be renumbered.
type External uint8

const (
	// ExternalNo: a copy here, as usual.
	ExternalNo External = iota
	// ExternalPreferred: memory or disk is short (used memory over 75 %
	// of maxmemory, free disk under twice min-free-disk) but not
	// exhausted: replicate externally when Replicate other nodes are
	// reachable, else keep a copy here as usual.
	ExternalPreferred
	// ExternalQueueRandomly: ADDJOB … QUEUE-RANDOMLY (a Disque option from
	// after 1.0): the job is to be queued on another node, chosen at
	// random among those that hold a copy, so none is kept here: it is
	// replicated externally, or fails (a *NoReplError) when Replicate
	// other nodes are not reachable. On a node alone (no other node
	// known) it is queued here as usual, the only node there is.
	ExternalQueueRandomly
	// ExternalLeaving: this node is leaving the cluster: replicate
	// externally, or fail (a *NoReplError).
	ExternalLeaving
	// ExternalOutOfMemory: used memory is over maxmemory.
	ExternalOutOfMemory
	// ExternalOutOfDisk: free disk is under min-free-disk.
	ExternalOutOfDisk
)

// Required reports whether the job must not be kept here at all.
func (e External) Required() bool { return e >= ExternalQueueRandomly }

func (e External) reason() string {
	switch e {
	case ExternalQueueRandomly:
		return "QUEUE-RANDOMLY keeps every copy on other nodes"
	case ExternalLeaving:
		return "I'm leaving the cluster"
	case ExternalOutOfDisk:
		return "I'm out of disk space"
	}
	return "I'm out of memory"
}

// NoReplError is ErrNoRepl for an ADDJOB that had to replicate externally:
// one reachable node short, because this node cannot hold a copy itself
// (Disque's "-NOREPL … since I'm unable to hold a copy of the message for
// the following reason: …"). errors.Is(err, ErrNoRepl) holds.
type NoReplError struct{ Reason string }

func (e *NoReplError) Error() string {
	return "queue: not enough reachable nodes for the requested replication level, since I'm unable to hold a copy of the message for the following reason: " + e.Reason
}

// Is makes a NoReplError an ErrNoRepl.
func (e *NoReplError) Is(target error) bool { return target == ErrNoRepl }

// ExternalCluster is what external replication asks of the cluster beside
// Cluster; package replication's Jobs implements it. Like Cluster, the
// broker calls it with no lock of its own held. With a Cluster that lacks
// it, ADDJOBs keep their copy here (ExternalPreferred) or fail with
// ErrNoRepl.
type ExternalCluster interface {
	// ReplicateExternal sends each job, stored nowhere here, to Job.Repl
	// other nodes and returns once each is confirmed by that many or its
	// deadline passed (then it has deleted the copies sent: DELJOB). A
	// confirmed job is then given to one of the nodes that confirmed it to
	// queue (ENQUEUE, with the job's DELAY left). res[i].Nodes are the
	// nodes sent to (this one not among them).
	ReplicateExternal(jobs []Replication) []ReplicationResult
	// ReplicateExternalAsync sends the jobs to Job.Repl other nodes
	// without waiting for them, and ENQUEUE to one of them (after the
	// copy, on the same ordered link); it returns the nodes each went to.
	ReplicateExternalAsync(jobs []Replication) [][]string
}

// ReachablePeers is the number of other nodes a copy can be sent to now
// (the server refuses an ADDJOB with -OOM or -NOSPACE, rather than
// replicating it externally, when there is none).
func (b *Broker) ReachablePeers() int { return b.cluster.ReachablePeers() }

// addMixed is AddJobs for requests some of which may replicate externally:
// those go to addExternal, the others (a preferred external replication
// that cannot be had among them) take the usual path; the results keep the
// requests' order.
func (b *Broker) addMixed(reqs []AddRequest) []AddResult {
	known := max(b.cluster.KnownNodes(), 1)
	reachable := b.cluster.ReachablePeers()
	_, canExt := b.cluster.(ExternalCluster)
	out := make([]AddResult, len(reqs))
	var local, ext []AddRequest
	var localIdx, extIdx []int
	for i, r := range reqs {
		if r.Replicate == 0 {
			r.Replicate = min(3, known)
		}
		if r.External == ExternalQueueRandomly && known == 1 {
			r.External = ExternalNo // alone: this node is the only one to queue it
		}
		external := r.External != ExternalNo && canExt && r.Replicate <= reachable && !(r.Retry == 0 && r.Delay > 0)
		switch {
		case external:
			ext, extIdx = append(ext, r), append(extIdx, i)
		case r.External.Required():
			out[i].Err = b.externalRefusal(r, reachable, canExt)
		default:
			r.External = ExternalNo
			local, localIdx = append(local, r), append(localIdx, i)
		}
	}
	if len(local) > 0 {
		for k, res := range b.AddJobs(local) {
			out[localIdx[k]] = res
		}
	}
	if len(ext) > 0 {
		for k, res := range b.addExternal(ext) {
			out[extIdx[k]] = res
		}
	}
	return out
}

// externalRefusal is why a request that must replicate externally cannot.
func (b *Broker) externalRefusal(r AddRequest, reachable int, canExt bool) error {
	if err := b.validateAdd(r, 1<<30); err != nil {
		return err // its own fault first: a bad TTL, DELAY, …
	}
	switch {
	case !canExt:
		return ErrNoRepl
	case r.Retry == 0 && r.Delay > 0:
		// An at-most-once job has no requeue timer for the queueing node
		// to wait its DELAY with: it would have to be kept here.
		return fmt.Errorf("%w (an at-most-once job with DELAY is kept by the node that receives it)", &NoReplError{Reason: r.External.reason()})
	case r.Replicate == reachable+1:
		return &NoReplError{Reason: r.External.reason()}
	}
	return ErrNoRepl
}

// addExternal adds jobs that keep no copy here (see above). Each request's
// Replicate is resolved and at most the reachable peers.
func (b *Broker) addExternal(reqs []AddRequest) []AddResult {
	out := make([]AddResult, len(reqs))
	ec := b.cluster.(ExternalCluster)
	reachable := b.cluster.ReachablePeers()
	var sync, async []Replication
	var syncIdx, asyncIdx []int

	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		for i := range out {
			out[i].Err = err
		}
		return out
	}
	now := b.nowMillis()
	node := b.NodeID()
	added := map[string]int64{} // per queue: MAXLEN counts this call's jobs
	for i, r := range reqs {
		// reachable−1: validateAdd counts this node as a holder, and
		// it is none here.
		if err := b.validateAdd(r, reachable-1); err != nil {
			out[i].Err = err
			continue
		}
		if b.st.PauseState(r.Queue)&storage.PauseIn != 0 {
			out[i].Err = ErrPaused
			continue
		}
		// MAXLEN is the queue's length here, as in Disque: the nodes
		// that will queue the job are not asked.
		if r.MaxLen > 0 && b.st.QueueLen(r.Queue)+added[r.Queue] >= r.MaxLen {
			out[i].Err = ErrMaxLen
			continue
		}
		added[r.Queue]++
		j := b.newJob(r, now, nil)
		j.ID = storage.NewJobID(node, r.TTL, r.Retry)
		j.State, j.QueueTime, j.Nodes = storage.StateActive, 0, nil
		rep := Replication{Job: j, Body: r.Body}
		if r.Async {
			async, asyncIdx = append(async, rep), append(asyncIdx, i)
			continue
		}
		rep.Deadline = j.Etime
		if r.Timeout > 0 {
			rep.Deadline = min(rep.Deadline, now+r.Timeout)
		}
		sync, syncIdx = append(sync, rep), append(syncIdx, i)
	}
	b.stats.JobsExternal += int64(len(sync) + len(async))
	b.mu.Unlock()

	if len(async) > 0 {
		ec.ReplicateExternalAsync(async)
		for k, i := range asyncIdx {
			out[i].ID = async[k].Job.ID
		}
	}
	if len(sync) > 0 {
		for k, res := range ec.ReplicateExternal(sync) {
			i := syncIdx[k]
			if res.OK {
				out[i].ID = sync[k].Job.ID
			} else {
				out[i].Err = ErrReplTimeout
			}
		}
	}
	return out
}

// RemoteEnqueue queues jobs because the node that added them keeps no copy
// and chose this one to queue them (ENQUEUE, external replication). Each
// is queued after delays[i] ms (its DELAY left; 0 or less: now) if it is
// here, active (a copy not queued yet, or delivered already: a late
// ENQUEUE then changes nothing), not acked and its queue not paused for
// input; a delayed one waits as its requeue time, so at-most-once jobs are
// queued at once whatever their delay (the origin never sends them one).
// It returns how many jobs were queued or scheduled.
func (b *Broker) RemoteEnqueue(ids []string, delays []int64) (int, error) {
	if len(delays) != len(ids) {
		return 0, fmt.Errorf("queue: RemoteEnqueue: %d ids, %d delays", len(ids), len(delays))
	}
	delay := make(map[string]int64, len(ids))
	for i, id := range ids {
		delay[id] = delays[i]
	}
	return b.jobBatch(ids, func(batch *storage.Batch, j *storage.Job, now int64) {
		if j.State != storage.StateActive || j.Deliveries > 0 || j.Delayed() {
			return
		}
		if b.st.PauseState(j.Queue)&storage.PauseIn != 0 {
			return
		}
		if d := delay[j.ID]; d > 0 && j.Retry > 0 {
			batch.Working(j.ID, now+d) // the retry timer queues it then
			return
		}
		batch.Queue(j.ID, retryTime(now, j.Retry))
	}, func(old, nj *storage.Job, now int64) {
		if nj.State == storage.StateQueued {
			b.queueLocked(nj.Queue, now).jobsIn++
			b.queuedLocked(nj, now)
		}
	})
}
