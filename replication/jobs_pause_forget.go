package replication

import (
	"errors"
	"time"

	"github.com/diskque/diskque/storage"
)

// Bounding the pause book. Last writer wins needs the newest version of
// each queue's broadcast state: a node with no entry for a queue takes any
// version that comes, so an entry dropped while another node still held
// an older state would let that state come back. An entry can go only once
// no known node can hold anything older — every one holds it, or newer —
// and the node that knows when that is, is its origin:
//
//   - A node that takes a versioned PAUSE, or gets one it has already,
//     tells the state's origin it holds that version (PAUSEHAVE); the
//     origin records it beside its own entries (pauseBook.has, in memory:
//     after a restart the reconnection's book exchange fills it again).
//   - Each ack-loop tick (forgetPauses) the origin drops an own entry whose
//     state is none (the queue unpaused everywhere) once every other known
//     node said it holds that version and the version is pauseForgetAge old
//     (idle: no broadcast of the queue since; no message that old is still
//     on its way, the transport drops them within a second), and sends
//     PAUSEFORGET to every other known node, which drops its entry if it
//     is that very version (a newer one stays).
//   - A node that missed the PAUSEFORGET (down, its link broken) keeps the
//     entry, and sends it again at a reconnection: a node that dropped it
//     takes it again (state none: nothing changes) and tells the origin,
//     which, holding no entry for the queue and having forgotten a version
//     of its own at least that new, answers PAUSEFORGET again; so does the
//     origin when the returning node's book reaches it. So the book holds
//     the paused queues, and the unpaused ones only until every known node
//     has heard.
//
// A node that is down keeps the entries from going (it may hold an older
// state), as does a known node that never answers (an older diskque, which
// ignores both message types); a node forgotten (CLUSTER FORGET) whose
// book comes back later is not waited for. Such a node may hold an older
// paused state: met again, it sends it, the nodes with no entry take it,
// and the origin (no entry, a newer own version forgotten) answers each
// PAUSEFORGET, which, finding that paused version, unpauses the queue
// (only unpaused states are forgotten: a newer one was, and won). What an
// origin forgot (forgotMax) is in memory: after its restart a laggard's
// copy of an entry it forgot is taken again and stays until the next
// forget of that queue — harmless if unpaused, but an older paused state
// (a forgotten node's, above) is then taken by every node, as is one whose
// origin never forgot a version that new (a newer state of another origin
// was forgotten): only a per-queue record of what was forgotten would
// refuse those.

// errUnversionedPause: a PAUSEHAVE or PAUSEFORGET without a version.
var errUnversionedPause = errors.New("replication: a pause book message without a version")

// pauseForgetAge is how old an unpaused entry must be before its origin
// forgets it (a variable for tests).
var pauseForgetAge = time.Minute

// pauseHeard records, on the origin (this node) of v, that node from holds
// version v of queue name (pb.mu held): the answer to a PAUSE or a
// PAUSEHAVE. It reports whether from should be told to forget v instead:
// this node has no entry for the queue and forgot a version of its own at
// least as new.
func (j *Jobs) pauseHeardLocked(from, name string, v pauseVersion) (forget bool) {
	pb := &j.pauses
	if v.Origin != j.self() {
		return false
	}
	cur, ok := pb.states[name]
	if !ok {
		return v.Ver <= pb.forgotMax
	}
	if cur == v {
		if pb.has[name] == nil {
			pb.has[name] = map[string]bool{}
		}
		pb.has[name][from] = true
	}
	return false
}

// tellOrigin tells v's origin that this node holds version v of queue
// name (PAUSEHAVE), unless this node is the origin.
func (j *Jobs) tellOrigin(name string, v pauseVersion) {
	if v.Origin != j.self() {
		j.send(v.Origin, MsgPauseHave, encodePauseVersion(name, v))
	}
}

// pauseHave handles PAUSEHAVE: from holds version v of queue name.
func (j *Jobs) pauseHave(from, name string, v pauseVersion) {
	pb := &j.pauses
	pb.mu.Lock()
	forget := j.pauseHeardLocked(from, name, v)
	pb.mu.Unlock()
	if forget {
		j.send(from, MsgPauseForget, encodePauseVersion(name, v))
	}
}

// pauseForget handles PAUSEFORGET: the entry goes if it is version v. An
// origin forgets only unpaused states, so v paused means the answer to an
// older state sent back (a node forgotten, met again with its older book,
// or one that took that book from it): a newer, unpaused state was
// forgotten, and this node, which missed it, takes it now.
func (j *Jobs) pauseForget(name string, v pauseVersion) {
	pb := &j.pauses
	pb.mu.Lock()
	defer pb.mu.Unlock()
	if cur, ok := pb.states[name]; ok && cur == v {
		if v.State != storage.PauseNone {
			if err := j.broker.RemotePause(name, storage.PauseNone); err != nil {
				// The entry stays: sent again at a reconnection, it is
				// answered again.
				j.log.Warn("replication: PAUSEFORGET", "queue", name, "err", err)
				return
			}
		}
		delete(pb.states, name)
		delete(pb.has, name)
		j.savePausesLocked()
	}
}

// forgetPauses drops the own unpaused entries every other known node holds
// and that are pauseForgetAge old at now, and sends their PAUSEFORGET
// (see above). The ack loop calls it each tick; tests call it with their
// own time. It returns how many entries it dropped.
func (j *Jobs) forgetPauses(now time.Time) int {
	if j.boundTr.Load() == nil {
		return 0
	}
	others := j.otherIDs()
	self := j.self()
	limit := uint64(max(now.Add(-pauseForgetAge).UnixMilli(), 0)) << 16
	pb := &j.pauses
	pb.mu.Lock()
	var msgs [][]byte
	for name, v := range pb.states {
		if v.Origin != self || v.State != storage.PauseNone || v.Ver > limit {
			continue
		}
		has := pb.has[name]
		all := true
		for _, n := range others {
			if !has[n] {
				all = false
				break
			}
		}
		if !all {
			continue
		}
		delete(pb.states, name)
		delete(pb.has, name)
		pb.forgotMax = max(pb.forgotMax, v.Ver)
		msgs = append(msgs, encodePauseVersion(name, v))
	}
	if len(msgs) > 0 {
		j.savePausesLocked()
	}
	pb.mu.Unlock()
	for _, to := range others {
		for _, m := range msgs {
			j.send(to, MsgPauseForget, m)
		}
	}
	if n := len(msgs) * len(others); n > 0 {
		j.count(func(s *JobsStats) { s.PausesSent += int64(n) })
	}
	return len(msgs)
}
