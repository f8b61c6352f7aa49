package replication

import "time"

// A node that comes back is asked at once. The ack collection's rounds
// back off to 180 s however long a holder is down, so after a partition
// or a kill of some seconds the returning node would hear of the acks it
// missed only at each collection's next round: 16 s or more after the
// heal of a fault of 15 s. Disque waits the same; we need not. Each tick
// of the ack loop looks at which peers are up — reachable in membership
// and with their bus link connected — and for a peer that was not up at
// the last look, the collections still waiting on its answer send it
// their SETACK now (askReturning):
//
//   - to that peer only, in messages of idsPerMessage (one per chunk, as
//     a round does), with each collection's own mayhave; the collection's
//     schedule and backoff are left alone, so its other targets, still
//     down perhaps, are asked no sooner than before;
//   - only collections that have sent a round already (retries > 0) and
//     whose next round is more than returnSkip away: one still waiting
//     for its first round (a holder's, heldAcked) or due soon anyway
//     needs no extra message;
//   - at most once per returnGap per peer, so a flapping link costs at
//     most one extra SETACK per collection and peer per returnGap, far
//     below the 1 s rounds of a fresh collection; a look that found
//     nothing to send (a peer first seen as the cluster forms) does not
//     count.
//
// The GOTACK it brings is handled as any other (gotAcks): a collection
// whose last missing answer it was finishes then.

const (
	// returnGap is the least time between two asks of one peer.
	returnGap = 10 * time.Second
	// returnSkip: a collection whose next round is due within it is not
	// asked early.
	returnSkip = ackRetryMin
	// returnScanChunk is how many collections one hold of Jobs.mu scans:
	// after a long partition there may be millions, and the lock is the
	// message handlers' too.
	returnScanChunk = 4096
)

// AskReturning sends the SETACKs owed to the peers that came back (up now,
// not up at the last call: see above) and returns how many messages it
// sent. The ack loop calls it every AckRetryTick; tests call it with
// their own time. Before Start it does nothing.
func (j *Jobs) AskReturning(now time.Time) int {
	up := j.peersUp()
	if up == nil {
		return 0
	}
	var back, seen []string
	j.mu.Lock()
	if j.upPeers == nil {
		j.upPeers, j.askedAt = map[string]bool{}, map[string]time.Time{}
	}
	for id := range up {
		if !j.upPeers[id] {
			seen = append(seen, id)
			if last, ok := j.askedAt[id]; !ok || now.Sub(last) >= returnGap {
				back = append(back, id)
			}
		}
	}
	j.upPeers = up
	j.mu.Unlock()
	// A peer up again (or first seen) learns this store's incarnation,
	// so that the jobs it adds from now on can be given here marked
	// first (jobs_federation_first.go).
	j.tellIncarnation(seen, false)
	sent := 0
	for _, p := range back {
		// Only an ask that sent something counts for the gap: the first
		// sighting of a peer, as the cluster forms, owes it nothing, and
		// counting it made a heal within returnGap of it wait for the
		// collections' next round.
		if n := j.askReturned(p, now); n > 0 {
			sent += n
			j.mu.Lock()
			j.askedAt[p] = now
			j.mu.Unlock()
		}
	}
	if sent > 0 {
		j.count(func(s *JobsStats) {
			s.SetAcksSent += int64(sent)
			s.ReturnAsks += int64(sent)
		})
	}
	return sent
}

// peersUp returns the peers up now: reachable in membership (leaving ones
// too: they still hold copies and take pause states) with their bus link
// connected; nil before Start. AskReturning and syncPauses (jobs_pause.go)
// each compare it with what their last call saw.
func (j *Jobs) peersUp() map[string]bool {
	tr := j.boundTr.Load()
	if tr == nil {
		return nil
	}
	up := map[string]bool{}
	for _, n := range j.cfg.Peers.Reachable() {
		if n.ID != j.self() && !n.Myself && (*tr).Connected(n.ID) {
			up[n.ID] = true
		}
	}
	return up
}

// askReturned sends peer p the SETACK of every collection waiting on its
// answer (see above), and returns how many messages that was.
func (j *Jobs) askReturned(p string, now time.Time) int {
	var ids []string
	var mayhave []int
	for at := 0; ; at += returnScanChunk {
		// The heap may change between chunks: a collection moved across
		// a chunk's edge is missed (it waits for its round, as before)
		// or asked twice (a second GOTACK is harmless).
		j.mu.Lock()
		due := j.acks.due
		if at >= len(due) {
			j.mu.Unlock()
			break
		}
		for _, gc := range due[at:min(at+returnScanChunk, len(due))] {
			if gc.retries == 0 || !gc.next.After(now.Add(returnSkip)) || gc.confirmed[p] {
				continue
			}
			for _, n := range gc.targets {
				if n == p {
					ids, mayhave = append(ids, gc.id), append(mayhave, gc.mayhave)
					break
				}
			}
		}
		j.mu.Unlock()
	}
	sent := 0
	for i := 0; i < len(ids); i += idsPerMessage {
		k := min(i+idsPerMessage, len(ids))
		j.send(p, MsgSetAck, encodeSetAcks(ids[i:k], mayhave[i:k]))
		sent++
	}
	if sent > 0 {
		j.log.Debug("replication: asked a returning node for its acks", "node", p, "jobs", len(ids))
	}
	return sent
}
