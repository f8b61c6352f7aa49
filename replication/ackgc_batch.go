package replication

import "github.com/diskque/diskque/queue"

// The ack collection's incoming messages, a link read at a time. While a
// node consumes jobs that another node holds too (every job federation
// moved), each batch of acks costs both nodes a SETACK, a GOTACK and a
// DELJOB; handled one by one, each was a store commit of its own, beside
// the consumer's commits. Now:
//
//   - the SETACKs and DELJOBs one read brought are one store batch
//     (Broker.RemoteCollect), applied in their order, and the GOTACKs
//     answering its SETACKs wait for that batch's durability once; a
//     DELJOB's delete waits for nothing (the copy was acked durably when
//     its GOTACK went, or the DELJOB is FASTACK's or a timed-out
//     replication's, which a lost message would equal); their GOTACKs
//     are one message;
//   - an ack whose job a DELJOB of the same read deletes is not written:
//     the delete, durable before the GOTACK goes, promises as much;
//   - the GOTACKs one read brought are one, so the jobs they finish go in
//     one DELJOB per holder and are deleted here in one batch, not waited
//     for (Broker.DeleteCollected: the ack here is durable, a crash that
//     forgets the delete resumes the collection).
//
// Everything else happens as if the messages were handled one by one, in
// order: the bookkeeping of each (heldAcked, the GOTACK, Acked,
// endCollections) runs in message order once the batch is applied.

// collectRunEnd returns the end of the run of ack-collection messages
// that starts at ms[i] — consecutive SETACKs and DELJOBs, or consecutive
// GOTACKs — or i if ms[i] is none of them.
func collectRunEnd(ms []Message, i int) int {
	gotAck := ms[i].Type == MsgGotAck
	k := i
	for k < len(ms) {
		switch t := ms[k].Type; {
		case gotAck && t == MsgGotAck, !gotAck && (t == MsgSetAck || t == MsgDelJob):
			k++
			continue
		}
		break
	}
	return k
}

// collectMsg is one decoded SETACK (ids, mayhave) or DELJOB (del).
type collectMsg struct {
	del     bool
	ids     []string
	mayhave []int
	// at is where the message's ids start in the run's ops.
	at int
}

// handleCollectRun handles a run of collectRunEnd (or one such message,
// from Handle). A malformed message is dropped (logged and counted, as by
// Handle) and the others are handled.
func (j *Jobs) handleCollectRun(from string, ms []Message) {
	j.mu.Lock()
	ready := j.broker != nil && !j.closed
	j.mu.Unlock()
	if !ready || len(ms) == 0 {
		return
	}
	bad := func(m Message, err error) {
		j.count(func(s *JobsStats) { s.BadPayloads++ })
		j.log.Warn("replication: dropped a malformed message", "from", from, "type", m.Type, "bytes", len(m.Payload), "err", err)
	}
	if ms[0].Type == MsgGotAck {
		var ids []string
		var known []bool
		for _, m := range ms {
			i, k, err := decodeGotAcks(m.Payload)
			if err != nil {
				bad(m, err)
				continue
			}
			ids, known = append(ids, i...), append(known, k...)
		}
		if len(ids) > 0 {
			j.gotAcks(from, ids, known)
		}
		return
	}
	var msgs []collectMsg
	var ops []queue.CollectOp
	acks := false
	for _, m := range ms {
		c := collectMsg{del: m.Type == MsgDelJob, at: len(ops)}
		var err error
		if c.del {
			c.ids, err = decodeIDs(m.Payload)
		} else {
			c.ids, c.mayhave, err = decodeSetAcks(m.Payload)
		}
		if err != nil {
			bad(m, err)
			continue
		}
		var skip []bool
		if c.del {
			// Copies deleted here at from's SETACK, as a pair's: nothing
			// is left to delete (jobs_gone.go takePairs), unless a
			// client's ACKJOB here left a dummy ack since (those go to
			// the store: unskipCollecting). They still join the
			// bookkeeping below (gone, endCollections).
			skip = j.gone.takePairs(from, c.ids)
			j.unskipCollecting(c.ids, skip)
		}
		for k, id := range c.ids {
			if skip != nil && skip[k] {
				continue
			}
			op := queue.CollectOp{ID: id, Delete: c.del, Search: !c.del && c.mayhave[k] == 0}
			if !c.del && c.mayhave[k] == 2 {
				op.Pair = from // ackgc_pair.go
			}
			if !c.del && c.mayhave[k] != 0 && j.gone.has(id) {
				// Ended here (a pair's delete whose SETACK came
				// again, a DELJOB before a late SETACK): no dummy
				// ack is needed to turn a late copy away, the gone
				// set does, and one left would wait for a
				// collection of its own. Answered "not known".
				op.Search = true
			}
			ops = append(ops, op)
		}
		acks = acks || !c.del && len(c.ids) > 0
		msgs = append(msgs, c)
	}
	if len(msgs) == 0 {
		return
	}
	j.unpairCollected(ops) // ackgc_pair.go
	res, durable, err := j.broker.RemoteCollect(ops)
	if err == nil && acks {
		err = durable()
	}
	if err != nil {
		// No GOTACK (the senders try again), and the DELJOBs' copies
		// stay, acked, for their holders' own collection to finish.
		j.log.Warn("replication: SETACK/DELJOB", "from", from, "jobs", len(ops), "err", err)
		return
	}
	var answer []string
	var known []bool
	for _, c := range msgs {
		if c.del {
			j.gone.add(c.ids) // jobs_gone.go
			j.endCollections(c.ids)
			continue
		}
		a, k := j.answerSetAcks(from, c.ids, c.mayhave, res[c.at:c.at+len(c.ids)])
		answer, known = append(answer, a...), append(known, k...)
	}
	// One GOTACK for the run, in messages of idsPerMessage.
	for i := 0; i < len(answer); i += idsPerMessage {
		k := min(i+idsPerMessage, len(answer))
		j.send(from, MsgGotAck, encodeGotAcks(answer[i:k], known[i:k]))
	}
}
