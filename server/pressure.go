package server

import (
	"github.com/diskque/diskque/queue"
)

// External replication (CLUSTER.md "External replication"): in a cluster,
// an ADDJOB on a node that is leaving, or short of memory or disk, keeps
// no copy here; it goes to REPLICATE other nodes and one of them queues it
// (queue/external.go). What the server measures decides, per command:
//
//   - over maxmemory or under min-free-disk: external, required; with no
//     other node reachable, -OOM or -NOSPACE as for a node alone;
//   - CLUSTER LEAVING yes: external, required (-NOREPL when too few
//     other nodes are reachable, as in Disque);
//   - used memory over 75 % of maxmemory, or free disk under twice
//     min-free-disk: external when REPLICATE other nodes are reachable,
//     else a copy here as usual.
//
// Pipelined ADDJOBs that run as one batch share the decision.

// addJobPressure returns how the ADDJOBs of one command replicate, or the
// error reply that refuses them.
func (s *Server) addJobPressure(b *queue.Broker) (queue.External, string) {
	g := &s.guard
	noSpace, oom := g.noSpace.Load(), g.oom.Load()
	if noSpace || oom {
		switch {
		case b.ReachablePeers() == 0 && noSpace:
			return queue.ExternalNo, errNoSpace
		case b.ReachablePeers() == 0:
			return queue.ExternalNo, errOOM
		case noSpace:
			return queue.ExternalOutOfDisk, ""
		}
		return queue.ExternalOutOfMemory, ""
	}
	if s.leaving() {
		return queue.ExternalLeaving, ""
	}
	if g.memHigh.Load() || g.diskLow.Load() {
		return queue.ExternalPreferred, ""
	}
	return queue.ExternalNo, ""
}

// RefusesCopies returns why this node takes no copies of other nodes' jobs
// now, or "" when it takes them (the job protocol's RefuseCopies): it is
// leaving, or over 75 % of maxmemory or under twice min-free-disk — the
// conditions under which its own ADDJOBs keep no copy here either. Disque
// drops a REPLJOB when it is leaving or over its memory warning level; a
// node short of disk does the same rather than fail the copy's write.
func (s *Server) RefusesCopies() string {
	g := &s.guard
	switch {
	case s.leaving():
		return "leaving"
	case g.noSpace.Load() || g.diskLow.Load():
		return "disk short"
	case g.oom.Load() || g.memHigh.Load():
		return "memory short"
	}
	return ""
}

// leaving reports whether this node is leaving the cluster (CLUSTER
// LEAVING yes).
func (s *Server) leaving() bool {
	if r := s.cluster.Load(); r != nil {
		return r.c.Leaving()
	}
	return s.loneLeaving.Load()
}

// evictIdleQueues forgets the queues that are empty and idle for
// queue.PressureQueueIdle (Disque evicts them under memory pressure, and
// its tests expect registered_queues to drop to 0 under maxmemory 1).
func (s *Server) evictIdleQueues() {
	ref := s.useBroker()
	if ref == nil {
		return
	}
	defer ref.done()
	if n := ref.broker().SweepIdleQueues(queue.PressureQueueIdle); n > 0 {
		s.opts.Logger.Debug("server: over maxmemory: evicted idle empty queues", "queues", n)
	}
}
