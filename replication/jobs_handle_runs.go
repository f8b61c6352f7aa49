package replication

// Runs of acks: consecutive SETACKs (or GOTACKs, or DELJOBs) of one sender
// that a link read together are handled as one message of that kind, the
// way a run of REPLJOBs is (HandleBatch): one store operation and one
// durable write for the run, and for SETACKs one GOTACK answering them
// all.
//
// Why: each of these handlers waits for its own durable write on the
// goroutine that handles the sender's messages (under appendfsync always,
// an fsync each). A consumer on another node acks every job that
// federation moved here, so each of its ACKJOBs brings a SETACK, and the
// collection a DELJOB: in the cross-node benchmark under always that link
// spent 8.9 s of 8.9 s in such waits, one message after the other
// (bench/README.md "Cross-node latency under appendfsync always"), and
// every NEEDJOBS behind them waited for them.
//
// Merging changes nothing a sender can see but the number of GOTACKs:
// each handler treats its ids one by one, and the run is cut before an id
// already in it, so no id is seen twice in one call where the messages
// would have seen it twice in turn. A malformed message in a run is
// dropped alone (logged and counted, as by Handle).

// ackRunEnd returns where the run of ack-family messages starting at
// ms[i] ends (exclusive): i+1 when ms[i] is not one or starts no run.
func ackRunEnd(ms []Message, i int) int {
	t := ms[i].Type
	if t != MsgSetAck && t != MsgGotAck && t != MsgDelJob {
		return i + 1
	}
	k := i + 1
	for k < len(ms) && ms[k].Type == t {
		k++
	}
	return k
}

// handleAckRun handles ms (two or more messages of one ack kind, from
// one sender) as runs of as many as have no id in common.
func (j *Jobs) handleAckRun(from string, ms []Message) {
	j.mu.Lock()
	ready := j.broker != nil && !j.closed
	j.mu.Unlock()
	if !ready {
		return
	}
	t := ms[0].Type
	var (
		ids     []string
		mayhave []int  // SETACK
		known   []bool // GOTACK
		seen    = map[string]bool{}
	)
	flush := func() {
		if len(ids) == 0 {
			return
		}
		switch t {
		case MsgSetAck:
			j.setAcks(from, ids, mayhave)
		case MsgGotAck:
			j.gotAcks(from, ids, known)
		case MsgDelJob:
			j.delJobs(ids)
		}
		ids, mayhave, known = nil, nil, nil
		clear(seen)
	}
	for _, m := range ms {
		var (
			mids []string
			mh   []int
			kn   []bool
			err  error
		)
		switch t {
		case MsgSetAck:
			mids, mh, err = decodeSetAcks(m.Payload)
		case MsgGotAck:
			mids, kn, err = decodeGotAcks(m.Payload)
		case MsgDelJob:
			mids, err = decodeIDs(m.Payload)
		}
		if err != nil {
			j.count(func(s *JobsStats) { s.BadPayloads++ })
			j.log.Warn("replication: dropped a malformed message", "from", from, "type", m.Type, "bytes", len(m.Payload), "err", err)
			continue
		}
		for _, id := range mids {
			if seen[id] {
				flush() // this message sees the id again, after the run
				break
			}
		}
		for k, id := range mids {
			seen[id] = true
			ids = append(ids, id)
			switch t {
			case MsgSetAck:
				mayhave = append(mayhave, mh[k])
			case MsgGotAck:
				known = append(known, kn[k])
			}
		}
	}
	flush()
}
