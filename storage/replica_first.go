package storage

import (
	"fmt"
	"math/rand/v2"
)

// A replica's first copy of a job without the index lookup.
//
// AddReplica looks the id up before it adds, so that the same REPLJOB
// received twice, or one arriving after the job was acked here (a dummy
// ack), changes nothing. For a new copy — the common case — that lookup
// is a miss that walks the write buffer, both memtables and every L0
// table's bloom filter: a third of a replica's CPU per REPLJOB (bench/
// README.md). AddReplicaFirst skips it when the store can prove the id is
// not here.
//
// The proof has two halves. The caller's (package replication): the
// origin of a job marks the REPLJOB it sends a node first — the one sent
// by the job's Replicate call right after the job was stored, never a
// resend or a node added later; or an ASYNC job's one REPLJOB to the node
// — and stamps it with the incarnation of this store it last learned
// from that node (GOTJOB carries it). A job's id is minted by its origin,
// with 144 random bits, and is known to nobody before its first REPLJOBs
// are sent (a synchronous job: it waits unqueued and unanswered until
// they are confirmed) or before it was stored (an ASYNC job, queued at
// its commit: the origin stamps it only with an incarnation it learned
// before that commit); so when the stamp is this store's incarnation,
// every add of that id this store ever applied came after that
// incarnation began (the origin heard of it before the id was known)
// and was not a REPLJOB from the origin: a dummy ack (an ACKJOB or SETACK
// that got here first) or a federation import of a copy another node
// requeued (or, for an ASYNC job, the origin itself gave away). The
// store's half: firstGuard.others holds, exactly, the id of
// every job present that this incarnation added by any add but AddNew
// (its own ids) and the fast path here, plus every job in the resume set
// at Open (the acked ones, whose dummy acks a client may have made before
// the restart). An id in others, or a stamp that is not this incarnation,
// takes AddReplica's lookup; otherwise the write buffer and the job cache
// are still read (in memory), but Pebble is not.
//
// others is bounded (maxFirstGuard); a store that would pass the bound
// turns the fast path off for the rest of its life (incarnation 0, which
// no stamp equals), so the set never has to forget an id. A store opened
// on an index without a resume set (format 5 or older, read-only) starts
// with the fast path off.

// maxFirstGuard bounds firstGuard.others: about 100 bytes an id (a
// variable for tests).
var maxFirstGuard = 1 << 17

// firstGuard is the store's state for AddReplicaFirst, guarded by
// Store.mu.
type firstGuard struct {
	// incarnation is this store's, random and not 0; 0: the fast path is
	// off.
	incarnation uint64
	// others: see above. nil once the fast path is off.
	others map[string]struct{}
	// fast and slow count AddReplicaFirst adds that skipped Pebble and
	// those that looked the id up.
	fast, slow int64
}

// AddReplicaFirst is AddReplica for the REPLJOB its origin marked as the
// first it sent this node of the job, stamped with incarnation, this
// store's ReplicaIncarnation as the origin last learned it. The caller
// vouches that no add of the id reached this store from the origin before,
// and that the id was known to nobody before the origin learned
// incarnation; the store then skips the Pebble lookup unless another add
// of the id could be here (see replica_first.go). It is as idempotent as
// AddReplica either way.
func (b *Batch) AddReplicaFirst(j *Job, body []byte, incarnation uint64) error {
	o, err := b.s.addOp(j, body, false)
	if err != nil {
		return err
	}
	o.replica = true
	o.firstInc = incarnation
	b.ops = append(b.ops, o)
	return nil
}

// ReplicaIncarnation is the stamp AddReplicaFirst's fast path needs: a
// random number of this open store, 0 while the fast path is off. A node
// sends it to the origins of the copies it stores (GOTJOB).
func (s *Store) ReplicaIncarnation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first.incarnation
}

// FirstAdds counts the AddReplicaFirst adds that skipped the Pebble
// lookup (fast) and those that looked the id up (slow).
func (s *Store) FirstAdds() (fast, slow int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.first.fast, s.first.slow
}

// initFirstGuard starts the fast path after Open: a new incarnation and
// the resume set's ids (every acked job, dummy acks among them).
func (s *Store) initFirstGuard() error {
	s.first = firstGuard{}
	if s.noResumeSet || s.readOnly {
		return nil
	}
	others := map[string]struct{}{}
	lower := []byte{prefixResume}
	for {
		ids, err := scanPage(s, lower, []byte{prefixResume + 1}, false, 1024, func(k, _ []byte) (string, error) {
			if len(k) != 1+JobIDLen {
				return "", fmt.Errorf("%w: resume key of %d bytes", ErrIndexInvariant, len(k))
			}
			return string(k[1:]), nil
		})
		if err != nil {
			return err
		}
		for _, id := range ids {
			others[id] = struct{}{}
		}
		if len(others) >= maxFirstGuard {
			return nil // too many to track: the fast path stays off
		}
		if len(ids) < 1024 {
			break
		}
		lower = append(resumeKey(ids[len(ids)-1]), 0)
	}
	s.mu.Lock()
	s.first.others = others
	for s.first.incarnation == 0 {
		s.first.incarnation = rand.Uint64()
	}
	s.mu.Unlock()
	return nil
}

// firstFastLocked reports whether o, an add, may skip the Pebble lookup:
// an AddReplicaFirst stamped with this incarnation whose id no other add
// of this incarnation (or the resume set at Open) left here.
func (s *Store) firstFastLocked(o *op) bool {
	g := &s.first
	if o.firstInc == 0 {
		return false
	}
	if o.firstInc != g.incarnation || g.incarnation == 0 {
		g.slow++
		return false
	}
	if _, ok := g.others[o.id]; ok {
		g.slow++
		return false
	}
	g.fast++
	return true
}

// firstAddedLocked records a live add that may meet a first REPLJOB
// later: any but AddNew's and the fast path's.
func (s *Store) firstAddedLocked(o *op) {
	g := &s.first
	if g.others == nil || o.fresh || o.firstFast || o.replay || o.rebuild {
		return
	}
	if len(g.others) >= maxFirstGuard {
		g.incarnation, g.others = 0, nil // off for good: see above
		return
	}
	g.others[o.id] = struct{}{}
}

// firstDeletedLocked forgets a deleted job: a first REPLJOB of its id
// finds nothing here, with or without the lookup.
func (s *Store) firstDeletedLocked(id string) {
	if len(s.first.others) > 0 {
		delete(s.first.others, id)
	}
}

// firstFlushedLocked: FLUSHALL deleted every job.
func (s *Store) firstFlushedLocked() {
	if s.first.others != nil {
		clear(s.first.others)
	}
}
