package replication

import (
	"math/rand/v2"
	"time"

	"github.com/diskque/diskque/storage"
)

// Ack collection (Disque's ack.c): an acked job is deleted everywhere once
// every node that may hold a copy has it acked. SETACK goes to every
// holder not yet confirmed, again after 1 s, 2 s, … up to 180 s (± 500 ms)
// however long a holder is down; each answers GOTACK; once all have, DELJOB
// to all of them and the job is deleted here.
//
// Every node that holds an acked copy collects it too, as Disque's job
// cron does (job.c processJob → ack.c tryJobGC): a holder acked by
// another node's SETACK, and a dummy ack a SETACK left, get a collection
// whose first round waits the retry period (heldAcked). The collector's
// DELJOB usually comes first and ends it with no message sent; when the
// DELJOB was lost (a partition, a kill), the holder's own rounds finish
// the job's collection instead of leaving the copy until its TTL.

// Acked implements queue.Cluster: it starts the collection of the jobs
// (dummy acks: SETACK to every known node) and sends the first SETACKs.
func (j *Jobs) Acked(jobs []*storage.Job) {
	now := j.cfg.Now()
	others := j.otherIDs()
	var alone []string
	j.mu.Lock()
	for _, job := range jobs {
		if j.acks.get(job.ID) != nil {
			continue
		}
		gc := &ackGC{next: now, etime: job.Etime}
		if job.IsDummyAck() {
			gc.dummy, gc.targets = true, others
		} else {
			gc.mayhave = len(job.Nodes)
			for _, n := range job.Nodes {
				if n != j.self() {
					gc.targets = append(gc.targets, n)
				}
			}
		}
		if len(gc.targets) == 0 && !gc.dummy {
			alone = append(alone, job.ID) // no copy elsewhere to collect
			continue
		}
		j.acks.put(job.ID, gc)
	}
	j.mu.Unlock()
	if len(alone) > 0 {
		j.gone.add(alone) // jobs_gone.go
		if _, err := j.broker.DelJob(alone); err != nil {
			j.log.Warn("replication: deleting acked jobs", "jobs", len(alone), "err", err)
		}
	}
	j.RetryAcks(now)
}

// heldAcked starts the collection of copies acked here by the SETACK of
// collector from (jobs, which this node knows no more holders of than
// from does) and of the dummy acks that SETACK left (dummies: ids this
// node never had). Their first round waits the retry period (1 s ±
// 500 ms, then the usual backoff), as Disque's acknowledgeJob schedules
// it: the collector's DELJOB, following our GOTACK, normally ends them
// first, with no message sent. A job already being collected here keeps
// its collection.
func (j *Jobs) heldAcked(from string, jobs []*storage.Job, dummies []string, now time.Time) {
	if len(jobs) == 0 && len(dummies) == 0 {
		return
	}
	var others []string
	if len(dummies) > 0 {
		others = j.otherIDs()
	}
	self := j.self()
	j.mu.Lock()
	defer j.mu.Unlock()
	for _, job := range jobs {
		if j.acks.get(job.ID) != nil {
			continue
		}
		gc := &ackGC{mayhave: len(job.Nodes), next: now.Add(ackBackoff(0)), retries: 0, etime: job.Etime}
		sender := false
		for _, n := range job.Nodes {
			if n != self {
				gc.targets = append(gc.targets, n)
			}
			sender = sender || n == from
		}
		if !sender {
			// The sender had a copy, or its SETACK would not say so
			// (mayhave > 0): ask it too.
			gc.targets = append(gc.targets, from)
			gc.mayhave++
		}
		j.acks.put(job.ID, gc)
	}
	for _, id := range dummies {
		if j.acks.get(id) != nil || len(others) == 0 {
			continue
		}
		j.acks.put(id, &ackGC{dummy: true, targets: others, next: now.Add(ackBackoff(0)), etime: dummyEtime(id, now)})
	}
}

// RetryAcks sends the SETACK rounds due at now (the first one of a job
// just acked included) and schedules each job's next: 1 s doubling to
// 180 s, ± 500 ms. The background loop calls it; tests call it with their
// own time. It returns how many SETACK messages it sent (and FASTDEL, for
// a FASTACK's deletion: jobs_fastack.go). A collection whose job expired
// here ends at its TTL, with no message.
func (j *Jobs) RetryAcks(now time.Time) int {
	type setAcks struct {
		ids     []string
		mayhave []int
	}
	per := map[string]*setAcks{}
	known := map[string]bool{}
	for _, n := range j.cfg.Peers.Nodes() {
		known[n.ID] = true
	}
	var done []string
	dels := map[string][]string{}
	fast := map[string][]string{} // FASTDEL ids per target (jobs_fastack.go)
	fastMay := map[string][]int{} // and the holders each id's deletion knows
	j.mu.Lock()
	for gc := j.acks.first(now); gc != nil; gc = j.acks.first(now) {
		id := gc.id
		if gc.expiredAt(now) {
			// The job expired here (the broker deletes it at its TTL,
			// as Disque drops expired jobs): rounds to a node that
			// stays down would otherwise go on until a restart.
			j.acks.drop(id)
			continue
		}
		if j.forgetTargetsLocked(gc, known) {
			// Every node left to confirm was forgotten (CLUSTER FORGET):
			// nobody will answer, and a forgotten node's copy is its own.
			j.acks.drop(id)
			if gc.fast {
				done = append(done, id) // the placeholder; the others deleted theirs
				continue
			}
			if !gc.dummy {
				done = append(done, id)
				for _, n := range gc.targets {
					if known[n] {
						dels[n] = append(dels[n], id)
					}
				}
			}
			continue
		}
		for _, n := range gc.targets {
			if !gc.confirmed[n] && gc.fast {
				fast[n] = append(fast[n], id)
				fastMay[n] = append(fastMay[n], gc.mayhave)
			} else if !gc.confirmed[n] {
				m := per[n]
				if m == nil {
					m = &setAcks{}
					per[n] = m
				}
				m.ids, m.mayhave = append(m.ids, id), append(m.mayhave, gc.mayhave)
			}
		}
		j.acks.reschedule(gc, gc.capNext(now.Add(ackBackoff(gc.retries)))) // after now: the loop ends
		gc.retries++
	}
	j.mu.Unlock()
	sent := 0
	for n, m := range per {
		// A node holding many acked copies (after a partition, a
		// restart) sends them in messages of idsPerMessage, far below
		// MaxFrame, one message per chunk and target per round.
		for i := 0; i < len(m.ids); i += idsPerMessage {
			k := min(i+idsPerMessage, len(m.ids))
			j.send(n, MsgSetAck, encodeSetAcks(m.ids[i:k], m.mayhave[i:k]))
			sent++
		}
	}
	if sent > 0 {
		j.count(func(s *JobsStats) { s.SetAcksSent += int64(sent) })
	}
	sent += j.sendFastDels(fast, fastMay)
	j.sendDelJobs(dels)
	if b := j.bound.Load(); b != nil && len(done) > 0 {
		j.gone.add(done) // jobs_gone.go
		if _, err := b.DelJob(done); err != nil {
			j.log.Warn("replication: deleting collected jobs", "jobs", len(done), "err", err)
		}
	}
	return sent
}

// forgetTargetsLocked counts the targets of gc that are no longer known
// (forgotten) as confirmed, and reports whether every target now is. With
// known empty (no membership answer) nothing is forgotten.
func (j *Jobs) forgetTargetsLocked(gc *ackGC, known map[string]bool) bool {
	if len(known) == 0 {
		return false
	}
	all := true
	for _, n := range gc.targets {
		if !gc.confirmed[n] && !known[n] {
			gc.confirm(n)
		}
		all = all && gc.confirmed[n]
	}
	return all
}

// ackBackoff is the wait after SETACK round retries (0 = the first):
// 1 s · 2^retries, at most 180 s, ± 500 ms.
func ackBackoff(retries int) time.Duration {
	d := ackRetryMax
	if retries < 8 {
		d = min(ackRetryMin<<retries, ackRetryMax)
	}
	return d + time.Duration(rand.Int64N(int64(2*ackRetryJitter)+1)) - ackRetryJitter
}

// NextAckRetry returns when the collection of job id sends its next
// SETACK round, or false if it is not being collected.
func (j *Jobs) NextAckRetry(id string) (time.Time, bool) {
	j.mu.Lock()
	defer j.mu.Unlock()
	gc := j.acks.get(id)
	if gc == nil {
		return time.Time{}, false
	}
	return gc.next, true
}

func (j *Jobs) ackLoop() {
	defer close(j.done)
	t := time.NewTicker(j.cfg.AckRetryTick)
	defer t.Stop()
	for {
		select {
		case <-j.stop:
			return
		case <-t.C:
			now := j.cfg.Now()
			j.AskReturning(now) // ackgc_return.go
			j.RetryAcks(now)
			j.syncPauses()      // jobs_pause.go
			j.forgetPauses(now) // jobs_pause_forget.go
		}
	}
}

// gotAcks records GOTACK answers from node from. A job whose holders have
// all answered is deleted on them (DELJOB) and here; a dummy ack that
// reached a node that knows the job leaves the collection to that node and
// is deleted here; so is a dummy ack that every node answered without
// knowing the job (Disque's "not known cluster-wide"): no copy is left
// anywhere, so no REPLJOB can come late, and kept it would last the id's
// TTL.
func (j *Jobs) gotAcks(from string, ids []string, known []bool) {
	var done, dropDummy []string
	dels := map[string][]string{}
	j.mu.Lock()
	j.stats.GotAcksReceived += int64(len(ids))
	for i, id := range ids {
		gc := j.acks.get(id)
		if gc == nil {
			continue
		}
		if gc.fast {
			if j.fastAnsweredLocked(gc, from) {
				done = append(done, id)
			}
			continue
		}
		if gc.dummy && known[i] {
			j.acks.drop(id)
			dropDummy = append(dropDummy, id)
			continue
		}
		gc.confirm(from) // "not known" too: it holds no copy
		all := true
		for _, n := range gc.targets {
			if !gc.confirmed[n] {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		j.acks.drop(id)
		if gc.dummy {
			dropDummy = append(dropDummy, id) // nobody has it
			continue
		}
		done = append(done, id)
		for _, n := range gc.targets {
			dels[n] = append(dels[n], id)
		}
	}
	j.mu.Unlock()
	j.sendDelJobs(dels)
	if ids := append(done, dropDummy...); len(ids) > 0 {
		j.gone.add(ids) // jobs_gone.go
		// Not waited for: acked here durably, so a delete a crash forgets
		// leaves a job whose collection resumes, never one queued again.
		if _, err := j.broker.DeleteCollected(ids); err != nil {
			j.log.Warn("replication: deleting collected jobs", "jobs", len(ids), "err", err)
		}
	}
}

// resume restarts what a restart interrupted: the collection of every
// acked job on disk, and the end of every job left in wait-repl (its
// ADDJOB was never answered): deleted here, and a dummy ack collected
// from every node in its place. It reads the store's resume set
// (storage.Store.ScanResumable: those jobs only), so its cost is theirs,
// not the backlog's.
func (j *Jobs) resume() error {
	var acked []*storage.Job
	var waiting []string
	after := ""
	st := j.broker.Store()
	for {
		page, err := st.ScanResumable(after, 1024)
		if err != nil {
			return err
		}
		for _, job := range page {
			switch {
			case job.State == storage.StateAcked:
				acked = append(acked, job)
			case job.State == storage.StateWaitRepl:
				waiting = append(waiting, job.ID)
			}
		}
		if len(page) < 1024 {
			break
		}
		after = page[len(page)-1].ID
	}
	if len(waiting) > 0 {
		// Where their copies went is not recorded: each leaves a dummy
		// ack (durable, as the ACKJOB of an unknown id does), whose
		// collection asks every node, retried, and leaves the job's to
		// a holder. A DELJOB to every node, once, could be lost, and the
		// copy requeued. An at-most-once job leaves none (RemoteSetAck):
		// its copies are never requeued, so a DELJOB suffices.
		if _, err := j.broker.DelJob(waiting); err != nil {
			return err
		}
		if _, err := j.broker.RemoteSetAck(waiting); err != nil {
			return err
		}
		var once []string
		for _, id := range waiting {
			if job, err := st.Job(id); err == nil && job.IsDummyAck() {
				acked = append(acked, job)
			} else {
				once = append(once, id)
			}
		}
		if len(once) > 0 {
			per := map[string][]string{}
			for _, n := range j.otherIDs() {
				per[n] = once
			}
			j.sendDelJobs(per)
		}
	}
	if len(acked) > 0 {
		j.log.Info("replication: resuming the collection of acked jobs", "jobs", len(acked))
		j.Acked(acked)
	}
	return nil
}

// sendDelJobs sends each node its DELJOB (the ids to delete), counted,
// in messages of idsPerMessage.
func (j *Jobs) sendDelJobs(per map[string][]string) {
	for n, ids := range per {
		for i := 0; i < len(ids); i += idsPerMessage {
			j.send(n, MsgDelJob, encodeIDs(ids[i:min(i+idsPerMessage, len(ids))]))
			j.count(func(s *JobsStats) { s.DelJobsSent++ })
		}
	}
}
