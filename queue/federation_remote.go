package queue

import (
	"slices"

	"github.com/diskque/diskque/storage"
)

// The broker's side of incoming NEEDJOBS and YOURJOBS (federation.go has
// the asker's pacing). Like every Remote* method they apply under
// Broker.mu, wait for durability outside it and never call the cluster:
// what is to be sent is returned to the caller (package replication).

// maxYourJobsBytes bounds the bodies one NEEDJOBS moves (a first job is
// always taken, as by GETJOB; one job fits a bus frame as its REPLJOB did).
const maxYourJobsBytes = MaxGetBytes

// RemoteNeedJobs answers another node's NEEDJOBS for count jobs of queue
// (Disque's receiveNeedJobs). Nothing is given when the queue is empty
// here, paused for output, or importing itself (its import rate is not
// 0: two nodes must not pass jobs back and forth). Otherwise up to count
// jobs leave the queue — at most half of it when it holds fewer than
// 2×count, at least 1 — each as a delivery here (so a RETRY 0 job's is
// fsynced, whatever the policy, before it goes), with the asker added to
// its nodes by the delivery's own record. A RETRY > 0 job stays here, active, with its requeue timer
// (at-least-once: if the asker never queues it, it comes back here after
// its RETRY); a RETRY 0 job is deleted here. The jobs are returned, with
// their bodies, counters and merged node lists, once all that is durable:
// the caller sends them (YOURJOBS) to from. A job whose body cannot be
// read stays here, delivered (as GETJOB's).
func (b *Broker) RemoteNeedJobs(from, queue string, count int) ([]Replica, error) {
	return b.RemoteNeedJobsFirst(from, queue, count, FirstGive{})
}

// RemoteNeedJobsFirst is RemoteNeedJobs marking First (fg.Incarnation)
// the jobs the asker may store without its index lookup
// (federation_first.go).
func (b *Broker) RemoteNeedJobsFirst(from, queue string, count int, fg FirstGive) ([]Replica, error) {
	if count <= 0 || !storage.ValidNodeID(from) || from == b.NodeID() {
		return nil, nil
	}
	count = min(count, needJobsMaxCount)
	now := b.nowMillis()
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return nil, err
	}
	qlen := b.st.QueueLen(queue)
	q := b.queues[queue]
	switch {
	case b.st.Failing(), qlen == 0, b.st.PauseState(queue)&storage.PauseOut != 0,
		q != nil && q.fed != nil && q.fed.importRate(now) > 0:
		b.mu.Unlock()
		return nil, nil
	}
	n := int64(count)
	if qlen < 2*n {
		n = qlen / 2
	}
	n = max(n, 1)
	// The asker may hold a copy from now on: an ACKJOB here must reach it.
	// Each at-least-once job's delivery record adds the asker to its nodes
	// (one record a job: take.to); an at-most-once job's node list does
	// not matter here, where it is deleted, but goes with the asker in it.
	got, err := b.deliverLocked([]string{queue}, take{count: int(n), bytes: maxYourJobsBytes, first: true, moved: true, to: from}, now)
	if err != nil {
		b.mu.Unlock()
		return nil, err
	}
	sent := make(map[string]*storage.Job, len(got.jobs))
	var first map[string]bool
	self := b.NodeID()
	for k, j := range got.jobs {
		if givenFirst(got.before[k], self, fg) {
			if first == nil {
				first = map[string]bool{}
			}
			first[j.ID] = true
		}
		if merged, grew := mergeNodes(j.Nodes, []string{from}); grew {
			nj := *j
			nj.Nodes = merged
			j = &nj
		}
		sent[j.ID] = j
	}
	b.mu.Unlock()
	delivered, err := b.finish(got)
	if err != nil {
		return nil, err
	}
	out := make([]Replica, 0, len(delivered))
	var atMostOnce []string
	for _, d := range delivered {
		j := sent[d.ID]
		if j == nil {
			continue
		}
		if j.Retry == 0 {
			atMostOnce = append(atMostOnce, j.ID)
		}
		r := Replica{Job: j, Body: d.Body}
		if first[j.ID] {
			r.First = fg.Incarnation
		}
		out = append(out, r)
	}
	if len(atMostOnce) > 0 {
		// Delivered and fsynced already, so never queued here again; the
		// delete only frees its room. A failure here is a store failure:
		// the jobs are not sent, and stay delivered here until their TTL.
		if _, err := b.DelJob(atMostOnce); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// RemoteYourJobs queues the jobs another node moved here (YOURJOBS), as
// Disque's receiveYourJobs: a job unknown here is added queued, with its
// ctime (its place in the queue), TTL, retry and counters, and the node
// list it came with (this node in it); a copy already here learns the
// nodes and counters and is queued if it is active (a copy
// waiting for its requeue); one queued, acked or at-most-once delivered stays as it
// is, so a RETRY 0 job is queued here once, and only if never delivered
// here. An at-most-once copy here never delivered (a replica's, never
// queued: the sender dequeued and deleted the job) is queued: left, the
// job would be queued nowhere. Each imported job counts for the queue's import rate and
// makes from one of its sources. It returns, once the jobs are durable,
// the NEEDJOBS to send at once (an importing queue whose waiting clients
// emptied it again).
//
// The common case is one store operation a job: a queued replica add,
// which is a no-op for an id known here (storage.Batch.AddReplica), so no
// index lookup precedes it; only the known ones, and the new ones with
// counters to restore, take a second batch, in the same hold. A job the
// giver marked First is added with AddReplicaFirst, which skips the
// add's own lookup of Pebble when the store can prove the id new
// (federation_first.go).
func (b *Broker) RemoteYourJobs(from string, jobs []Replica) ([]NeedJobsRequest, error) {
	reqs, durable, err := b.ImportYourJobs(from, jobs)
	if err != nil {
		return nil, err
	}
	if err := durable.Wait(); err != nil {
		return nil, wrapStore(err)
	}
	return reqs, nil
}

// ImportYourJobs is RemoteYourJobs without the wait: it returns the
// NEEDJOBS to send at once as soon as the jobs are applied, and their
// durability, for the caller to wait for after it sent them (package
// replication: so the next NEEDJOBS of an importing queue its waiting
// clients emptied does not wait for this import's write, a whole fsync
// under appendfsync always, in every round trip). Asking before the
// import is durable risks nothing: a crash loses the import as it would
// after the NEEDJOBS, and the giver's at-least-once copies requeue after
// their RETRY. A blocked GETJOB served one of these jobs replies only
// after its own delivery record is durable, which is logged after the add.
func (b *Broker) ImportYourJobs(from string, jobs []Replica) ([]NeedJobsRequest, storage.Pending, error) {
	if len(jobs) == 0 || !storage.ValidNodeID(from) {
		return nil, storage.Pending{}, nil
	}
	self := b.NodeID()
	now := b.nowMillis()
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return nil, storage.Pending{}, err
	}
	adds := b.st.NewBatch()
	var sent []*storage.Job // adds' op → the job as sent
	seen := make(map[string]bool, len(jobs))
	for _, r := range jobs {
		in := r.Job
		if in == nil || seen[in.ID] || in.Queue == "" {
			continue
		}
		seen[in.ID] = true
		j := *in
		j.State = storage.StateQueued
		j.AwakeTime, j.Deliveries = 0, 0
		j.QueueTime = retryTime(now, j.Retry)
		nodes := slices.Clip(in.Nodes)
		if j.Retry == 0 {
			// The sender deleted its copy; the others' (replicas, never
			// queued) are collected by its ACKJOB here.
			nodes = slices.DeleteFunc(slices.Clone(nodes), func(n string) bool { return n == from })
		}
		j.Nodes, _ = mergeNodes(nodes, []string{self})
		var err error
		if r.First != 0 {
			// The giver minted it and never sent it anywhere: no lookup
			// unless the store's guard knows of another add of the id
			// (federation_first.go).
			err = adds.AddReplicaFirst(&j, r.Body, r.First)
		} else {
			err = adds.AddReplica(&j, r.Body)
		}
		if err != nil {
			continue // malformed: the sender's copy requeues after its RETRY
		}
		sent = append(sent, in)
	}
	if adds.Len() == 0 {
		b.mu.Unlock()
		return nil, storage.Pending{}, nil
	}
	touched := map[string]*queueState{}
	// queued hands an imported job to the queue, and so to a blocked
	// GETJOB, before the import is durable (the wait is at the end), and
	// that is safe for both kinds of job: the GETJOB replies only once its
	// own delivery record is durable, and that record is logged after the
	// add, so the add is durable first (for an at-most-once job the
	// delivery is fsynced whatever the policy). A crash before then loses
	// the import here, having told no consumer: an at-least-once job is
	// still active on the giver, which requeues it after its RETRY; an
	// at-most-once one is lost, as a YOURJOBS lost on the way would be,
	// never delivered twice. Waiting for the add before serving would
	// only add its write to the round trip the consumer waits for.
	queued := func(r storage.Result) {
		q := b.queueLocked(r.Job.Queue, now)
		q.jobsIn++
		q.fedLocked(now).imported(from, 1, now)
		touched[q.name] = q
		b.queuedLocked(r.Job, now)
	}
	res, pending := b.st.Apply(adds)
	// The new jobs are handed to waiting clients (queued) only once fix
	// has restored their counters.
	var added []storage.Result
	fix := b.st.NewBatch()
	for k, r := range res {
		if r.Err != nil {
			if errUnusable(r.Err) {
				b.mu.Unlock()
				return nil, storage.Pending{}, wrapStore(r.Err)
			}
			continue
		}
		in := sent[k]
		if r.Old == nil { // new here, and queued
			b.syncTimersLocked(r.Job.ID, r.Job)
			if in.Retry > 0 && (in.Nacks > 0 || in.AdditionalDeliveries > 0) {
				fix.Postpone(in.ID, r.Job.QueueTime, in.Nacks, in.AdditionalDeliveries)
			}
			added = append(added, r)
			continue
		}
		cur := r.Old
		if cur.IsDummyAck() || cur.State == storage.StateAcked || cur.State == storage.StateWaitRepl || cur.Retry == 0 && cur.Deliveries > 0 {
			continue
		}
		if merged, grew := mergeNodes(cur.Nodes, in.Nodes); grew {
			fix.SetNodes(cur.ID, merged)
		}
		if cur.State != storage.StateActive || cur.Delayed() {
			continue
		}
		// The counters the sender counted and this copy has not heard of
		// yet (a QUEUED still on its way).
		if dn, dd := sub(in.Nacks, cur.Nacks), sub(in.AdditionalDeliveries, cur.AdditionalDeliveries); cur.Retry > 0 && (dn > 0 || dd > 0) {
			fix.Postpone(cur.ID, 0, dn, dd)
		}
		fix.Queue(cur.ID, retryTime(now, cur.Retry))
	}
	if fix.Len() > 0 {
		fres, fpending := b.st.Apply(fix)
		pending = pending.Join(fpending)
		for _, r := range fres {
			if r.Err != nil {
				if errUnusable(r.Err) {
					b.mu.Unlock()
					return nil, storage.Pending{}, wrapStore(r.Err)
				}
				continue
			}
			b.syncTimersLocked(r.Job.ID, r.Job)
			if r.Job.State == storage.StateQueued && r.Old.State != storage.StateQueued {
				queued(r)
			}
		}
	}
	for _, r := range added {
		queued(r)
	}
	// Empty again: blocked clients took every job just imported.
	var reqs []NeedJobsRequest
	for name, q := range touched {
		if b.st.QueueLen(name) == 0 && b.mayImportLocked(name) {
			reqs = append(reqs, q.fed.plan(name, now, true)...)
		}
	}
	b.mu.Unlock()
	return reqs, pending, nil
}

// sub is a − b, or 0 when b is larger.
func sub(a, b uint32) uint32 {
	if a > b {
		return a - b
	}
	return 0
}
