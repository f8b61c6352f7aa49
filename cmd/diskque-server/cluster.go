package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/replication"
	"github.com/diskque/diskque/server"
)

// clusterBus is the node's cluster side: the bus port (one PortMux), the job
// transport and membership on it (shared/CLUSTER.md). It outlives the
// store's reopens after a disk failure: the node id, which membership
// gossips, is the data directory's and does not change with them.
//
// Start-up: listenBus binds the bus port early, so that a port that cannot
// be bound fails the start before the store opens, with a message naming
// the port and the directive; start, once the store has given the node id,
// runs the transport and membership on it and serves the port. Shutdown
// (close): membership first (gossip stops), then the transport (links
// close), then the port, all before the store closes, so that nothing the
// bus delivers reaches a closed store.
type clusterBus struct {
	log        *slog.Logger
	mux        *replication.PortMux
	transport  *replication.TCPTransport
	membership *replication.Membership
	served     chan error // Serve's result, once start ran

	// member is membership once start made it: the job protocol reads
	// the peers through it (Nodes, Reachable) from any goroutine.
	member atomic.Pointer[replication.Membership]
	// jobs is the job protocol of the current broker (one per store
	// open: a reopen after a disk failure makes another); the bus's
	// messages go to it. mu guards the hand-over between attachJobs,
	// detachJobs and start.
	mu         sync.Mutex
	jobs       atomic.Pointer[replication.Jobs]
	jobsBroker *queue.Broker // the broker of jobs, until start can Start it
	started    bool          // start ran: the transport exists
	// refuseCopies is the server's RefusesCopies, set before the first
	// store opens: no copies of other nodes' jobs while it says why.
	refuseCopies func() string
}

// listenBus listens on the bus port: where bind says, on cluster-bus-port
// (port + 10000 by default; 0 picks a free one).
func listenBus(cfg config, log *slog.Logger) (*clusterBus, error) {
	addr := net.JoinHostPort(cfg.Bind, strconv.Itoa(cfg.busPort()))
	mux, err := replication.ListenMux(addr, log)
	if err != nil {
		how := "set cluster-bus-port to a free port (0 picks one)"
		if cfg.ClusterBusPort < 0 {
			how = fmt.Sprintf("it is port + %d; set cluster-bus-port to a free port (0 picks one)", busPortOffset)
		}
		return nil, fmt.Errorf("cluster-bus-port %d: cannot listen on %s (%s): %w", cfg.busPort(), addr, how, err)
	}
	return &clusterBus{log: log, mux: mux}, nil
}

// busBatchHandler hands the job messages of the bus, as each link read
// them together, to the job protocol of the current broker (which applies
// consecutive REPLJOBs as one: Jobs.HandleBatch, on the sender's own
// goroutine so that the link goes on reading and a NEEDJOBS is answered
// at once: Jobs.HandleBatchQueued); while there is none (a store
// reopening) they are dropped, and the protocol's retries send again what
// matters.
func (b *clusterBus) busBatchHandler(from string, ms []replication.Message) {
	if j := b.jobs.Load(); j != nil {
		j.HandleBatchQueued(from, ms)
		return
	}
	b.log.Debug("cluster bus: messages dropped: no broker", "from", from, "messages", len(ms))
}

// Nodes implements replication.Peers: membership's, or nothing before it
// started (the job protocol then counts this node alone).
func (b *clusterBus) Nodes() []replication.NodeInfo {
	if m := b.member.Load(); m != nil {
		return m.Nodes()
	}
	return nil
}

// NodeCount is len(Nodes()) without building the list: the job protocol
// reads it for every ADDJOB without REPLICATE (its default) and every
// ACKJOB (Clustered), on a lone node too.
func (b *clusterBus) NodeCount() int {
	if m := b.member.Load(); m != nil {
		return m.NodeCount()
	}
	return 0
}

// Reachable implements replication.Peers.
func (b *clusterBus) Reachable() []replication.NodeInfo {
	if m := b.member.Load(); m != nil {
		return m.Reachable()
	}
	return nil
}

// newJobs returns the job protocol for a broker about to be made over a
// store of node id in dir (which keeps the broadcast pauses' versions too).
func (b *clusterBus) newJobs(id, dir string) (*replication.Jobs, error) {
	return replication.NewJobs(replication.JobsConfig{ID: id, Peers: b, Logger: b.log, RefuseCopies: b.refuseCopies,
		PauseFile: filepath.Join(dir, replication.PausesFileName)})
}

// attachJobs makes j, the protocol of broker, the one the bus feeds, and
// starts it once the transport exists (now, or when start runs).
func (b *clusterBus) attachJobs(j *replication.Jobs, broker *queue.Broker) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.jobsBroker = broker
	b.jobs.Store(j)
	if b.started {
		b.startJobsLocked(j, broker)
	}
}

// detachJobs stops feeding j (its broker is closing).
func (b *clusterBus) detachJobs(j *replication.Jobs) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.jobs.Load() == j {
		b.jobs.Store(nil)
		b.jobsBroker = nil
	}
}

func (b *clusterBus) startJobsLocked(j *replication.Jobs, broker *queue.Broker) {
	if err := j.Start(broker, b.transport); err != nil {
		// The protocol still answers new messages; what it could not
		// resume (ack collections, wait-repl jobs) is logged.
		b.log.Error("cluster: resuming the job protocol", "err", err)
	}
}

// clusterControl is what the server's CLUSTER commands act on: membership,
// and CLUSTER RESET HARD's new node id for the store and the bus too.
type clusterControl struct {
	*replication.Membership
	bus  *clusterBus
	node *node
}

// InfoLines implements server.ClusterInfoSource: the job protocol's
// counters of the current broker, in INFO's Cluster section.
func (c clusterControl) InfoLines() []string {
	j := c.bus.jobs.Load()
	if j == nil {
		return nil
	}
	s := j.Stats()
	kv := func(name string, v int64) string { return name + ":" + strconv.FormatInt(v, 10) }
	return []string{
		kv("cluster_pending_replications", int64(s.PendingRepl)),
		kv("cluster_pending_ack_collections", int64(s.PendingAcks)),
		kv("cluster_repljob_rtt_avg_ms", j.RoundTripMillis()),
		kv("cluster_repljob_rtt_p99_ms", j.RoundTripP99Millis()),
		kv("cluster_repljobs_sent", s.ReplJobsSent),
		kv("cluster_gotjobs_received", s.GotJobsReceived),
		kv("cluster_setacks_sent", s.SetAcksSent),
		kv("cluster_gotacks_received", s.GotAcksReceived),
		kv("cluster_deljobs_sent", s.DelJobsSent),
		kv("cluster_willqueues_sent", s.WillQueuesSent),
		kv("cluster_queued_sent", s.QueuedSent),
		kv("cluster_workings_sent", s.WorkingsSent),
		kv("cluster_pauses_sent", s.PausesSent),
		kv("cluster_enqueues_sent", s.EnqueuesSent),
		kv("cluster_enqueues_received", s.EnqueuesReceived),
		kv("cluster_queuelens_sent", s.QueueLensSent),
		kv("cluster_queuelen_answers_received", s.QueueLenAnswersReceived),
		kv("cluster_bad_payloads", s.BadPayloads),
		kv("cluster_copies_refused", s.CopiesRefused),
		kv("cluster_late_copies_dropped", s.LateCopiesDropped),
		kv("cluster_return_asks", s.ReturnAsks),
		kv("cluster_needjobs_sent", s.NeedJobsSent),
		kv("cluster_yourjobs_jobs_sent", s.YourJobsSent),
		kv("cluster_yourjobs_jobs_received", s.YourJobsReceived),
	}
}

// NodesConfirmed implements server.NodesConfirmer (SHOW's
// nodes-confirmed), from the current broker's job protocol.
func (c clusterControl) NodesConfirmed(id string) []string {
	if j := c.bus.jobs.Load(); j != nil {
		return j.NodesConfirmed(id)
	}
	return nil
}

// PeersQueueLen implements server.QueueLenAsker (GLOBALQLEN), through the
// current broker's job protocol; none asked while there is none.
func (c clusterControl) PeersQueueLen(queue string, timeout time.Duration) replication.QueueLenResult {
	if j := c.bus.jobs.Load(); j != nil {
		return j.PeersQueueLen(queue, timeout)
	}
	return replication.QueueLenResult{}
}

// JobsFigures implements server.JobsFigurer (the Prometheus endpoint's
// pending REPLJOBs and SETACKs and round trips).
func (c clusterControl) JobsFigures() (server.JobsFigures, bool) {
	j := c.bus.jobs.Load()
	if j == nil {
		return server.JobsFigures{}, false
	}
	s := j.Stats()
	return server.JobsFigures{
		PendingRepl: int64(s.PendingRepl), PendingAcks: int64(s.PendingAcks),
		RTTAvgMillis: j.RoundTripMillis(), RTTP99Millis: j.RoundTripP99Millis(),
	}, true
}

// ResetNodeID implements server.NodeIDResetter: after the flush, the store
// (through the broker: job ids carry the id) and the bus's handshakes take
// the new id.
func (c clusterControl) ResetNodeID(newID string) error {
	if err := c.node.setNodeID(newID); err != nil {
		return err
	}
	return c.bus.transport.SetID(newID)
}

// start runs the transport and membership (as node id, with its nodes file
// in dir) and serves the bus port.
func (b *clusterBus) start(cfg config, id, dir string, clientPort int) error {
	tr, err := replication.NewTCPTransport(replication.TCPConfig{
		ID: id, Mux: b.mux, Secret: cfg.ClusterSecret, BatchHandler: b.busBatchHandler, Logger: b.log,
		SourceAddr: cfg.sourceAddr(),
	})
	if err != nil {
		return fmt.Errorf("cluster bus: %w", err)
	}
	b.transport = tr
	m, err := replication.NewMembership(replication.MembershipConfig{
		ID:           id,
		Dir:          dir,
		ClientAddr:   cfg.announcedClientAddr(clientPort),
		AdvertiseBus: cfg.announcedBusAddr(b.mux.Addr().Port),
		SourceAddr:   cfg.sourceAddr(),
		Mux:          b.mux,
		NodeTimeout:  time.Duration(cfg.ClusterNodeTimeout) * time.Millisecond,
		Secret:       cfg.ClusterSecret,
		Logger:       b.log,
		// Every node membership knows has a link on the transport (dialled
		// at once, redialled with backoff while it is down); a forgotten
		// one loses it.
		OnChange: func(n replication.NodeInfo, gone bool) {
			switch {
			case n.Myself:
			case gone:
				tr.RemovePeer(n.ID)
			default:
				tr.SetPeer(n.ID, n.BusAddr)
			}
		},
	})
	if err != nil {
		return fmt.Errorf("cluster membership: %w", err)
	}
	b.membership = m
	b.member.Store(m)
	b.mu.Lock()
	b.started = true
	if j := b.jobs.Load(); j != nil {
		b.startJobsLocked(j, b.jobsBroker)
	}
	b.mu.Unlock()
	b.served = make(chan error, 1)
	go func() { b.served <- b.mux.Serve() }()
	b.log.Info("cluster bus listening", "addr", b.mux.Addr().String(), "node", id,
		"announced", m.Nodes()[0].BusAddr, "source_addr", cfg.sourceAddr().String(),
		"cluster_node_timeout_ms", cfg.ClusterNodeTimeout)
	return nil
}

// close stops membership, the transport and the port, in that order, and
// returns their errors joined. Safe when start did not run (or failed).
func (b *clusterBus) close() error {
	if b == nil {
		return nil
	}
	var errs []error
	if b.membership != nil {
		errs = append(errs, b.membership.Close())
	}
	if b.transport != nil {
		errs = append(errs, b.transport.Close())
	}
	errs = append(errs, b.mux.Close())
	if b.served != nil {
		errs = append(errs, <-b.served)
	}
	return errors.Join(errs...)
}
