package queue

import "github.com/diskque/diskque/storage"

// A moved job the asker may store without its index lookup.
//
// The asker queues a YOURJOBS job with a replica add, which looks the id
// up first so that a copy already there (a requeued job given again, one
// acked here meanwhile) is not written over: for the new ids of a drain
// that lookup is a miss through both memtables and every L0 table's
// bloom filter, the largest single item of the asker's CPU (bench/
// README.md, "issue 15: the import's lookup"). storage.Batch.
// AddReplicaFirst skips it when the sender vouches for what a job's
// origin vouches for in its first REPLJOB (storage/replica_first.go):
// no add of the id ever reached the asker from this node before, and the
// id was known to nobody before this node learned the asker's store
// incarnation. The store's half of the proof (every other add of the id
// since that incarnation began is in its guard set) is unchanged.
//
// A giver can vouch for exactly the jobs it minted itself after it
// learned the incarnation and never let out of its hands:
//   - minted here after the mark: its ctime is above FirstGive.After,
//     this broker's CtimeClock when the incarnation was learned. Every
//     ctime the clock issues later is above it; a job minted before, in
//     this process or an earlier one (the clock starts above the store's
//     highest ctime ever), is not; and the id carries this node's
//     8-character prefix (a job another node minted has its own clock);
//   - never sent anywhere: REPLICATE 1 (no REPLJOB ever went), at least
//     once (a RETRY 0 job's list is not kept), and its node list before
//     this delivery exactly this node. Every give and every copy sent
//     adds the receiver to the list, in this store's memory at once, and
//     lists only grow (mergeNodes) — and a restart that lost such a
//     record also ends the process that learned the mark, so the job is
//     then older than any mark.
//
// The replication layer learns the incarnation from the asker's
// GOTJOBs and keeps the mark with the store it was read from (a reopened
// store starts a new broker and clock: no mark of the old one applies).

// FirstGive is what RemoteNeedJobsFirst needs to mark jobs first: the
// asker's store incarnation as its GOTJOB said (0: mark nothing), and
// CtimeMark as it was when that was learned.
type FirstGive struct {
	Incarnation uint64
	After       uint64
}

// CtimeMark is the broker's ctime clock now: every job added from now on
// has a greater ctime (FirstGive.After).
func (b *Broker) CtimeMark() uint64 { return b.ctime.Last() }

// givenFirst says whether old, a job as it was before this delivery moved
// it, may be marked first under fg (see above).
func givenFirst(old *storage.Job, self string, fg FirstGive) bool {
	return fg.Incarnation != 0 && old != nil && old.Retry > 0 && old.Repl == 1 &&
		old.Ctime > fg.After && len(old.Nodes) == 1 && old.Nodes[0] == self &&
		len(self) >= 8 && len(old.ID) >= 10 && old.ID[2:10] == self[:8]
}
