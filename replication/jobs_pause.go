package replication

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
	"github.com/diskque/diskque/storage"
)

// PAUSE … BCAST that converges. Disque sends a queue's pause state to
// every node once (clusterBroadcastPause): a node that was down or cut off
// then keeps its old state for ever. Here each broadcast state carries a
// version, a hybrid timestamp (ms << 16 | a counter, never below a
// version seen: pauseClock) and the id of the node whose PAUSE … BCAST set
// it; every node keeps, per queue whose state a broadcast set (and those
// only; an unpaused queue's only until every known node holds it:
// jobs_pause_forget.go), the newest version it knows (pauseBook). A
// receiver applies a state only if it is newer (version, then origin id, so two broadcasts of one
// millisecond have an order too): last writer wins, on every node alike,
// whatever order the messages arrive in. So of two concurrent,
// conflicting PAUSE … BCASTs, the later by hybrid clock (the larger
// origin id on a tie) is the state every node ends with, its own sender's
// included; the other is overwritten where it was applied.
//
// When a node becomes reachable with its link up (syncPauses, each
// ack-retry tick: membership alive again after a failure, a link that came
// back, this node's own start), it is sent every state in the book; what
// it has already it ignores. A PAUSE without BCAST or a FLUSHALL changes
// the local state only: the book is left alone, so the local state stands
// until a newer broadcast.
//
// The book is persisted beside the store (JobsConfig.PauseFile), written
// whole (durable.WriteFile) after each state it takes is durable in the
// store, which keeps the state itself. A crash between the two loses a
// version only: the state is re-sent, and taken again, at the next
// reconnection. A missing or damaged file starts the book empty (logged).
//
// A PAUSE from a node that sends no version (an older one) is applied as
// before and leaves the book alone.
//
// The book is bounded: an unpaused queue's entry goes once every known
// node holds it (jobs_pause_forget.go).

// PausesFileName is the pause book's file in the data directory.
const PausesFileName = "pauses.dq"

// pauseVersion is one queue's newest broadcast state known here.
type pauseVersion struct {
	State  storage.PauseState
	Ver    uint64 // hybrid timestamp: Unix ms << 16 | counter
	Origin string // the node whose PAUSE … BCAST set it
}

// newer reports whether a wins over b (last writer wins).
func (a pauseVersion) newer(b pauseVersion) bool {
	return a.Ver > b.Ver || (a.Ver == b.Ver && a.Origin > b.Origin)
}

// pauseBook is the broadcast states (Jobs.pauses). mu serialises taking
// a state: the check, the broker's Pause (a durable store write) and the
// file write, so two PAUSEs of one queue from two links never apply out of
// order. Lock order: pauseBook.mu, then the broker's locks; never taken
// under Jobs.mu, nor Jobs.mu across it (LOCKS.md).
type pauseBook struct {
	mu     sync.Mutex
	states map[string]pauseVersion // by queue
	last   uint64                  // the highest version made or seen
	file   string                  // "" = not persisted
	// linked: the nodes reachable with their link up at the last
	// syncPauses, nil while the book is empty.
	linked map[string]bool
	// has: for the entries this node is the origin of, the nodes known to
	// hold that version; forgotMax: the newest own version forgotten
	// (jobs_pause_forget.go). In memory only.
	has       map[string]map[string]bool
	forgotMax uint64
}

// next returns a new version, after every one made or seen.
func (pb *pauseBook) next(now time.Time) uint64 {
	v := uint64(max(now.UnixMilli(), 0)) << 16
	if v <= pb.last {
		v = pb.last + 1
	}
	pb.last = v
	return v
}

// Paused implements queue.Cluster (PAUSE … BCAST): the state, with a new
// version, into the book and to every other known node; a node that does
// not get it now gets it when it is reachable again (syncPauses).
func (j *Jobs) Paused(name string, p storage.PauseState) {
	b := j.bound.Load()
	if b == nil {
		return // not started: no transport yet
	}
	pb := &j.pauses
	pb.mu.Lock()
	// The caller applied p before this (Broker.Pause, without pb.mu): a
	// broadcast from another node taken since then overwrote it, and the
	// version made here, newer, would leave this node alone with that
	// state. Applied again under pb.mu (a no-op in the common case), the
	// store and the book agree.
	if err := b.RemotePause(name, p); err != nil {
		j.log.Warn("replication: PAUSE BCAST", "queue", name, "err", err)
	}
	v := pauseVersion{State: p, Ver: pb.next(j.cfg.Now()), Origin: j.self()}
	pb.states[name] = v
	delete(pb.has, name) // nobody has heard of v yet
	j.savePausesLocked()
	pb.mu.Unlock()
	msg := encodePauseVersion(name, v)
	sent := 0
	for _, to := range j.otherIDs() {
		j.send(to, MsgPause, msg)
		sent++
	}
	j.count(func(s *JobsStats) { s.PausesSent += int64(sent) })
}

// pause handles PAUSE: a broadcast state (v, if versioned), applied here
// if newer than the book's, and sent on to nobody.
func (j *Jobs) pause(from, name string, v pauseVersion, versioned bool) {
	if !versioned {
		if err := j.broker.RemotePause(name, v.State); err != nil {
			j.log.Warn("replication: PAUSE", "from", from, "queue", name, "err", err)
		}
		return
	}
	pb := &j.pauses
	pb.mu.Lock()
	pb.last = max(pb.last, v.Ver)
	cur, ok := pb.states[name]
	if ok && !v.newer(cur) {
		// Known already (its origin hears that this node holds it), or
		// older than what we have.
		j.pauseHeardLocked(from, name, v)
		pb.mu.Unlock()
		if cur == v {
			j.tellOrigin(name, v)
		}
		return
	}
	if !ok && j.pauseHeardLocked(from, name, v) {
		// An own unpaused state this node forgot once every node held
		// it: the sender missed the PAUSEFORGET.
		pb.mu.Unlock()
		j.send(from, MsgPauseForget, encodePauseVersion(name, v))
		return
	}
	if err := j.broker.RemotePause(name, v.State); err != nil {
		// Not recorded: the state comes again at the next reconnection.
		pb.mu.Unlock()
		j.log.Warn("replication: PAUSE", "from", from, "queue", name, "err", err)
		return
	}
	pb.states[name] = v
	delete(pb.has, name)
	j.pauseHeardLocked(from, name, v) // an own state coming back: from has it
	j.savePausesLocked()
	pb.mu.Unlock()
	j.tellOrigin(name, v)
}

// syncPauses sends every broadcast state in the book to each node that is
// reachable with its link up now and was not at the last call (the
// ack-retry loop calls it each tick; tests call it). It returns how many
// PAUSE messages it sent.
func (j *Jobs) syncPauses() int {
	if j.boundTr.Load() == nil {
		return 0
	}
	pb := &j.pauses
	pb.mu.Lock()
	if len(pb.states) == 0 {
		pb.linked = nil
		pb.mu.Unlock()
		return 0
	}
	prev := pb.linked
	pb.mu.Unlock()
	now := j.peersUp()
	var fresh []string
	for id := range now {
		if !prev[id] {
			fresh = append(fresh, id)
		}
	}
	pb.mu.Lock()
	pb.linked = now
	var msgs [][]byte
	if len(fresh) > 0 {
		for name, v := range pb.states {
			msgs = append(msgs, encodePauseVersion(name, v))
		}
	}
	pb.mu.Unlock()
	sent := 0
	for _, to := range fresh {
		for _, m := range msgs {
			j.send(to, MsgPause, m)
			sent++
		}
	}
	if sent > 0 {
		j.count(func(s *JobsStats) { s.PausesSent += int64(sent) })
	}
	return sent
}

// BroadcastPauses returns the book: each queue whose pause state a
// broadcast set, with that state (what this node will send a node that
// comes back).
func (j *Jobs) BroadcastPauses() map[string]storage.PauseState {
	pb := &j.pauses
	pb.mu.Lock()
	defer pb.mu.Unlock()
	out := make(map[string]storage.PauseState, len(pb.states))
	for name, v := range pb.states {
		out[name] = v.State
	}
	return out
}

// The PAUSE payload: version, state, queue name (jobs_queueing_codec.go),
// then, from a node that versions its broadcasts, the version (uvarint)
// and the origin's id.
func encodePauseVersion(name string, v pauseVersion) []byte {
	b := encodePause(name, v.State)
	b = binary.AppendUvarint(b, v.Ver)
	return appendString(b, v.Origin)
}

// decodePauseVersion decodes either form; versioned says which.
func decodePauseVersion(p []byte) (name string, v pauseVersion, versioned bool, err error) {
	d := msgDecoder{b: p}
	d.version()
	v.State = storage.PauseState(d.byte())
	name = d.queueName()
	if d.err == nil && v.State > storage.PauseAll {
		d.fail("bad pause state")
	}
	if d.err == nil && len(d.b) > 0 {
		versioned = true
		v.Ver = d.uvarint()
		v.Origin = d.str()
		if d.err == nil && !storage.ValidNodeID(v.Origin) {
			d.fail("bad origin node id")
		}
	}
	if err := d.end(); err != nil {
		return "", pauseVersion{}, false, err
	}
	return name, v, versioned, nil
}

// The pause book's file: "DQP1", the entries (a count, then per entry the
// PAUSE payload's versioned form, length-prefixed), and the CRC-32C of
// all that before it.
var pausesMagic = []byte("DQP1")

// maxPausesFile bounds what loadPauses reads.
const maxPausesFile = 64 << 20

func encodePauses(states map[string]pauseVersion) []byte {
	b := append([]byte(nil), pausesMagic...)
	b = binary.AppendUvarint(b, uint64(len(states)))
	for name, v := range states {
		e := encodePauseVersion(name, v)
		b = binary.AppendUvarint(b, uint64(len(e)))
		b = append(b, e...)
	}
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b, crcTable))
}

func decodePauses(b []byte) (map[string]pauseVersion, error) {
	if len(b) < len(pausesMagic)+4 || string(b[:len(pausesMagic)]) != string(pausesMagic) {
		return nil, errors.New("not a pause book")
	}
	body, sum := b[:len(b)-4], binary.BigEndian.Uint32(b[len(b)-4:])
	if crc32.Checksum(body, crcTable) != sum {
		return nil, errors.New("checksum mismatch")
	}
	d := msgDecoder{b: body[len(pausesMagic):]}
	n := d.count(1)
	states := make(map[string]pauseVersion, n)
	for k := 0; k < n && d.err == nil; k++ {
		e := d.str()
		if d.err != nil {
			break
		}
		name, v, versioned, err := decodePauseVersion([]byte(e))
		if err != nil || !versioned {
			return nil, fmt.Errorf("entry %d: %v", k, err)
		}
		states[name] = v
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return states, nil
}

// loadPauses reads the book's file into pb (before Start).
func (j *Jobs) loadPauses() {
	pb := &j.pauses
	pb.states, pb.has = map[string]pauseVersion{}, map[string]map[string]bool{}
	if pb.file == "" {
		return
	}
	f, err := os.Open(pb.file)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	var b []byte
	if err == nil {
		b, err = io.ReadAll(io.LimitReader(f, maxPausesFile+1))
		f.Close()
		if err == nil && len(b) > maxPausesFile {
			err = errors.New("too large")
		}
	}
	var states map[string]pauseVersion
	if err == nil {
		states, err = decodePauses(b)
	}
	if err != nil {
		j.log.Warn("replication: the pause book is unreadable; starting it empty (other nodes send their broadcast states again)",
			"file", pb.file, "err", err)
		return
	}
	pb.states = states
	for _, v := range states {
		pb.last = max(pb.last, v.Ver)
	}
}

// savePausesLocked writes the book (pb.mu held). A failure is logged: the
// state is in the store, only its version is at stake (re-sent at the next
// reconnection).
func (j *Jobs) savePausesLocked() {
	pb := &j.pauses
	if pb.file == "" {
		return
	}
	if err := durable.WriteFile(vfs.Default, pb.file, encodePauses(pb.states), 0o644); err != nil {
		j.log.Warn("replication: writing the pause book", "file", pb.file, "err", err)
	}
}
