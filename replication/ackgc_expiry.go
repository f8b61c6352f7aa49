package replication

import (
	"time"

	"github.com/diskque/diskque/storage"
)

// A collection lives no longer than its job: the broker deletes an acked
// copy, a dummy ack and a FASTACK's placeholder at their TTL like any job
// (Disque drops expired jobs), and a collection left running after that
// would send its rounds, 180 s apart, to a node that stays down until
// this node restarts. So each collection keeps its job's expiry (etime)
// and ends then, with no message; its rounds are scheduled no later.

// expiredAt reports whether the job of gc has expired at now.
func (gc *ackGC) expiredAt(now time.Time) bool {
	return gc.etime > 0 && now.UnixMilli() >= gc.etime
}

// capNext returns next, or the job's expiry if that comes first, so the
// collection ends (expiredAt) when the job does, not a backoff later.
func (gc *ackGC) capNext(next time.Time) time.Time {
	if gc.etime > 0 && next.UnixMilli() > gc.etime {
		return time.UnixMilli(gc.etime)
	}
	return next
}

// dummyEtime is the expiry of a dummy ack of id left at now: its id's TTL
// (queue's idTTLMillis, as Broker.RemoteSetAck and Ack leave them).
func dummyEtime(id string, now time.Time) int64 {
	if !storage.ValidJobID(id) {
		return 0
	}
	return now.UnixMilli() + max(storage.IDTTLMinutes(id), 1)*60_000
}
