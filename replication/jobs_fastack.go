package replication

import (
	"github.com/diskque/diskque/storage"
)

// FASTACK's deletion, retried. Disque's FASTACK deletes the job here and
// sends one DELJOB to its holders (ack.c): a DELJOB lost to a partition,
// a kill or a dropped link queue leaves a holder's copy active, requeued
// at its RETRY and delivered again after the client FASTACKed it. Here
// FASTACK leaves an acked placeholder (queue.Broker.FastAck: the job
// acked, or a dummy ack for an id unknown here; durable, so a late
// REPLJOB does not bring the job back) and Jobs runs a deletion for it in
// the ack collection's table (ackTable: one small entry per job, rounds
// batched per target, the same backoff, the same expiry): each round
// sends FASTDEL (DELJOB that wants an answer) to the holders that have
// not answered; a holder deletes its copy (as for DELJOB) and, once that
// is durable, answers GOTACK; once every holder answered (or was
// forgotten) the placeholder is deleted, with no further message. A
// holder that knows more holders than the FASTDEL says (mayhave, as in
// SETACK) takes the rest over: fastDelJobs. In the
// common case that is one FASTDEL and one GOTACK per holder, against
// ACKJOB's SETACK, GOTACK and DELJOB.
//
// After a restart the placeholder is an acked job like any other, and
// resume collects it as an ACKJOB's (SETACK, GOTACK, DELJOB): holders that
// deleted their copy answer "not known", those that did not ack it first.
// An at-most-once id unknown here leaves no placeholder (its copies are
// never requeued): its deletion runs, but is not resumed.

// FastAcked implements queue.Cluster: the deletion of the jobs FASTACK
// acked here (their placeholders), to their holders, and of the ids
// unknown here, to every other known node. A job whose collection already
// runs (ACKJOB came first) keeps it: it ends in DELJOB to every holder. A
// job with no holder but this node, or an unknown id with no other node
// known, is deleted here at once.
func (j *Jobs) FastAcked(jobs []*storage.Job, unknown []string) {
	j.fastAcked(jobs, unknown, "")
}

// fastAcked is FastAcked; a holder that answered already (except: the
// sender of the FASTDEL a holder that knows more holders takes over,
// fastDelJobs) gets none.
func (j *Jobs) fastAcked(jobs []*storage.Job, unknown []string, except string) {
	now := j.cfg.Now()
	self := j.self()
	var others []string
	if len(unknown) > 0 {
		others = j.otherIDs()
	}
	var alone []string
	j.mu.Lock()
	for _, job := range jobs {
		if j.acks.get(job.ID) != nil {
			continue
		}
		gc := &ackGC{fast: true, next: now, mayhave: len(job.Nodes), etime: job.Etime}
		for _, n := range job.Nodes {
			if n != self && n != except {
				gc.targets = append(gc.targets, n)
			}
		}
		if len(gc.targets) == 0 {
			alone = append(alone, job.ID)
			continue
		}
		j.acks.put(job.ID, gc)
	}
	for _, id := range unknown {
		switch {
		case j.acks.get(id) != nil:
		case len(others) == 0:
			alone = append(alone, id)
		default:
			j.acks.put(id, &ackGC{fast: true, dummy: true, targets: others, next: now, etime: dummyEtime(id, now)})
		}
	}
	j.mu.Unlock()
	if len(alone) > 0 {
		j.gone.add(alone) // jobs_gone.go
		if _, err := j.broker.DelJob(alone); err != nil {
			j.log.Warn("replication: deleting fast-acked jobs", "jobs", len(alone), "err", err)
		}
	}
	j.RetryAcks(now)
}

// fastAnsweredLocked records that target from answered the FASTDEL of
// deletion gc, and reports whether every target now has: the deletion is
// then over (dropped from the table) and the caller deletes the
// placeholder. Any answer counts: a holder answers once its copy is
// deleted, a node that never had the job once it knows it has none.
func (j *Jobs) fastAnsweredLocked(gc *ackGC, from string) bool {
	gc.confirm(from)
	for _, n := range gc.targets {
		if !gc.confirmed[n] {
			return false
		}
	}
	j.acks.drop(gc.id)
	return true
}

// sendFastDels sends each target its FASTDEL ids, each with how many
// holders its deletion knows (mayhave, as SETACK's: 0 for an id unknown
// here, whose deletion goes to every node), in messages of idsPerMessage,
// counted with the DELJOBs; it returns how many it sent.
func (j *Jobs) sendFastDels(per map[string][]string, mayhave map[string][]int) int {
	sent := 0
	for n, ids := range per {
		for i := 0; i < len(ids); i += idsPerMessage {
			k := min(i+idsPerMessage, len(ids))
			j.send(n, MsgFastDel, encodeSetAcks(ids[i:k], mayhave[n][i:k]))
			sent++
		}
	}
	if sent > 0 {
		j.count(func(s *JobsStats) { s.DelJobsSent += int64(sent) })
	}
	return sent
}

// delJobs deletes the copies a FASTDEL from from names, as a DELJOB does
// (one DELJOB alone; those a link read brings together go through
// handleCollectRun), and ends their collections here. An id it names
// with holders (held[i]: mayhave > 0, so this node is one) that this node
// does not have leaves a dummy ack (Broker.RemoteFastDel), as SETACK's
// rule has it: the copy sent here may still be on its way (a REPLJOB
// held by a link being redialled, a resend), and arriving after the
// deletion it would be queued, a FASTACKed job delivered again. The
// dummy is collected as a SETACK's is (heldAcked: its round, after the
// retry period, asks every node; none knowing the job, it is dropped).
// A dummy ack found here (an earlier FASTDEL's, its GOTACK lost, or a
// SETACK's) stays and keeps its collection: deleted, the late REPLJOB
// would queue the copy. A FASTDEL for an id that ended here lately (the
// ended ids, jobs_gone.go: a FASTDEL sent again because its GOTACK was
// late or lost, for a copy the first deleted) leaves nothing: a REPLJOB
// of an ended id is dropped, so no dummy is needed to stop it. Every id
// a FASTDEL deletes joins the ended ids, so a REPLJOB that comes again
// after the deletion (a resend, a duplicate a redialled link brings) does
// not store the FASTACKed job again. An
// unknown id sent with mayhave 0 (a FASTACK on a node that never had the
// job, to every node) leaves nothing, as SETACK's search does. It returns
// the broker's error: the FASTDEL is then not answered.
func (j *Jobs) delJobs(from string, ids []string, held []bool) error {
	now := j.cfg.Now()
	for i, id := range ids {
		if held[i] && j.gone.has(id) {
			// Ended here already (a FASTDEL again, its GOTACK late or
			// lost): a late REPLJOB of it is dropped.
			held[i] = false
		}
	}
	dummies, err := j.broker.RemoteFastDel(ids, held)
	if err != nil {
		j.log.Warn("replication: FASTDEL", "jobs", len(ids), "err", err)
	}
	ended := ids
	if len(dummies) > 0 {
		dummy := make(map[string]bool, len(dummies))
		for _, id := range dummies {
			dummy[id] = true
		}
		ended = make([]string, 0, len(ids))
		for _, id := range ids {
			if !dummy[id] {
				ended = append(ended, id)
			}
		}
	}
	j.endCollections(ended)
	j.heldAcked(from, nil, dummies, now)
	if err == nil {
		j.gone.add(ended) // jobs_gone.go
	}
	return err
}

// fastDelJobs handles FASTDEL: the copies are deleted as by DELJOB
// (delJobs, which also ends a collection of them here) and, once that is
// durable, from is answered GOTACK ("not known": nothing is left here).
// A failed delete is not answered: from's next round asks again.
//
// A copy whose holders here are more than the sender's deletion knows
// (mayhave; a copy given on, by federation or to a WILLQUEUE's sender) is
// FASTACKed here instead, as ACKJOB's SETACK has the holder that knows
// more collect the job: acked, a placeholder, and this node's own
// deletion goes to its other holders (not from); from is answered once
// the ack is durable. Deleted, the copy only this node knew of would stay
// active, requeued at its RETRY and delivered again.
func (j *Jobs) fastDelJobs(from string, ids []string, mayhave []int) {
	var del, more []string
	var held []bool // per del: the sender counts this node a holder
	for i, id := range ids {
		if mayhave[i] > 0 {
			if job, err := j.broker.Store().Job(id); err == nil && job.State != storage.StateAcked && len(job.Nodes) > mayhave[i] {
				more = append(more, id)
				continue
			}
		}
		del, held = append(del, id), append(held, mayhave[i] > 0)
	}
	var answer []string
	if len(more) > 0 {
		acked, unknown, err := j.broker.FastAckFor(more)
		if err != nil {
			j.log.Warn("replication: FASTDEL", "jobs", len(more), "err", err)
		} else {
			// Any not acked here (a state FASTACK leaves alone) is
			// deleted, as before.
			taken := map[string]bool{}
			for _, job := range acked {
				taken[job.ID] = true
			}
			for _, id := range unknown {
				taken[id] = true
			}
			for _, id := range more {
				if taken[id] {
					answer = append(answer, id)
				} else {
					del, held = append(del, id), append(held, true)
				}
			}
			j.fastAcked(acked, unknown, from)
		}
	}
	if len(del) > 0 && j.delJobs(from, del, held) == nil {
		answer = append(answer, del...)
	}
	if len(answer) > 0 {
		j.send(from, MsgGotAck, encodeGotAcks(answer, make([]bool, len(answer))))
	}
}
