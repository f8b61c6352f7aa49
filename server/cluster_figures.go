package server

import (
	"github.com/prometheus/client_golang/prometheus"
)

// The cluster's figures beyond membership and the bus (CLUSTER.md "Beyond
// Disque"): what the job protocol reports, for SHOW's nodes-confirmed and
// the Prometheus endpoint. The Cluster given to SetCluster may have them
// (the daemon's does); a server without them shows none.

// NodesConfirmer is an optional interface of the Cluster: the nodes that
// confirmed job id (SHOW's nodes-confirmed: GOTJOB while it replicates,
// GOTACK while its ack is collected; none otherwise).
type NodesConfirmer interface {
	NodesConfirmed(id string) []string
}

// JobsFigures are the job protocol's figures now.
type JobsFigures struct {
	PendingRepl  int64 // jobs whose synchronous replication runs (REPLJOBs pending)
	PendingAcks  int64 // acked jobs whose copies are being collected (SETACKs pending)
	RTTAvgMillis int64 // REPLJOB→GOTJOB round trip, moving average
	RTTP99Millis int64 // and its recent 99th percentile
}

// JobsFigurer is an optional interface of the Cluster: the job protocol's
// figures, false while it has none (a store reopening).
type JobsFigurer interface {
	JobsFigures() (JobsFigures, bool)
}

func (s *Server) nodesConfirmed(id string) []string {
	if r := s.cluster.Load(); r != nil {
		if nc, ok := r.c.(NodesConfirmer); ok {
			return nc.NodesConfirmed(id)
		}
	}
	return nil
}

// clusterCollectors are the cluster's Prometheus figures: nodes known,
// reachable and failed, the bus's messages and bytes each way, pending
// REPLJOBs and SETACKs, and the REPLJOB round trip.
func (s *Server) clusterCollectors() []prometheus.Collector {
	ref := func() *clusterRef { return s.cluster.Load() }
	nodes := func(f func(*clusterRef) int) func() float64 {
		return func() float64 {
			if r := ref(); r != nil {
				return float64(f(r))
			}
			return 1 // a lone node knows itself
		}
	}
	bus := func(f func(r *clusterRef) int64) func() float64 {
		return func() float64 {
			if r := ref(); r != nil && r.bus != nil {
				return float64(f(r))
			}
			return 0
		}
	}
	jobs := func(f func(JobsFigures) int64) func() float64 {
		return func() float64 {
			if r := ref(); r != nil {
				if jf, ok := r.c.(JobsFigurer); ok {
					if fig, ok := jf.JobsFigures(); ok {
						return float64(f(fig))
					}
				}
			}
			return 0
		}
	}
	gauge := func(name, help string, f func() float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, f)
	}
	return []prometheus.Collector{
		gauge("diskque_cluster_known_nodes", "Nodes known, this one included.",
			nodes(func(r *clusterRef) int { return len(r.c.Nodes()) })),
		gauge("diskque_cluster_reachable_nodes", "Other nodes neither suspected nor failed.",
			nodes(func(r *clusterRef) int { return len(r.c.Reachable()) })),
		gauge("diskque_cluster_failed_nodes", "Nodes flagged fail.",
			nodes(func(r *clusterRef) int {
				n := 0
				for _, x := range r.c.Nodes() {
					if x.Failed {
						n++
					}
				}
				return n
			})),
		counter("diskque_cluster_bus_messages_sent_total", "Job messages sent on the cluster bus.",
			bus(func(r *clusterRef) int64 { return r.bus.Stats().MessagesSent })),
		counter("diskque_cluster_bus_messages_received_total", "Job messages received on the cluster bus.",
			bus(func(r *clusterRef) int64 { return r.bus.Stats().MessagesReceived })),
		counter("diskque_cluster_bus_bytes_sent_total", "Bytes sent on the cluster bus's job links.",
			bus(func(r *clusterRef) int64 { return r.bus.Stats().BytesSent })),
		counter("diskque_cluster_bus_bytes_received_total", "Bytes received on the cluster bus's job links.",
			bus(func(r *clusterRef) int64 { return r.bus.Stats().BytesReceived })),
		gauge("diskque_cluster_pending_repljobs", "Jobs whose synchronous replication waits for GOTJOB.",
			jobs(func(f JobsFigures) int64 { return f.PendingRepl })),
		gauge("diskque_cluster_pending_setacks", "Acked jobs whose copies are being collected (SETACK until GOTACK).",
			jobs(func(f JobsFigures) int64 { return f.PendingAcks })),
		gauge("diskque_cluster_repljob_rtt_avg_seconds", "REPLJOB to GOTJOB round trip, moving average.",
			millisToSeconds(jobs(func(f JobsFigures) int64 { return f.RTTAvgMillis }))),
		gauge("diskque_cluster_repljob_rtt_p99_seconds", "REPLJOB to GOTJOB round trip, recent 99th percentile (histogram bucket bound).",
			millisToSeconds(jobs(func(f JobsFigures) int64 { return f.RTTP99Millis }))),
	}
}

func millisToSeconds(f func() float64) func() float64 {
	return func() float64 { return f() / 1000 }
}
