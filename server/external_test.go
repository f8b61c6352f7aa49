package server

import (
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/replication"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// busNode is one node of an in-process cluster as the daemon wires it: a
// store on a real directory, a broker whose Cluster is the job protocol,
// real memberlist membership and the TCP job transport on one bus port.
type busNode struct {
	st     *storage.Store
	broker *queue.Broker
	jobs   *replication.Jobs
	member *replication.Membership
	mux    *replication.PortMux
}

func startBusNode(t *testing.T) *busNode {
	t.Helper()
	quiet := slog.New(slog.DiscardHandler)
	opts := storage.TestingOptions()
	opts.FS, opts.Sync, opts.Logger = vfs.Default, wal.SyncAlways, quiet
	st, err := storage.Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	n := &busNode{st: st}
	id := st.NodeID()
	if n.mux, err = replication.ListenMux("127.0.0.1:0", quiet); err != nil {
		t.Fatal(err)
	}
	var jobs atomic.Pointer[replication.Jobs]
	tr, err := replication.NewTCPTransport(replication.TCPConfig{ID: id, Mux: n.mux, Logger: quiet,
		Handler: func(from string, m replication.Message) {
			if j := jobs.Load(); j != nil {
				j.Handle(from, m)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	n.member, err = replication.NewMembership(replication.MembershipConfig{
		ID: id, Dir: t.TempDir(), ClientAddr: "127.0.0.1:1", Mux: n.mux, NodeTimeout: time.Second, Logger: quiet,
		OnChange: func(p replication.NodeInfo, gone bool) {
			switch {
			case p.Myself:
			case gone:
				tr.RemovePeer(p.ID)
			default:
				tr.SetPeer(p.ID, p.BusAddr)
			}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n.jobs, err = replication.NewJobs(replication.JobsConfig{ID: id, Peers: n.member, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	jobs.Store(n.jobs)
	if n.broker, err = queue.New(queue.Options{Store: st, Cluster: n.jobs, Logger: quiet}); err != nil {
		t.Fatal(err)
	}
	go n.broker.Run()
	if err := n.jobs.Start(n.broker, tr); err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- n.mux.Serve() }()
	t.Cleanup(func() {
		n.member.Close()
		n.jobs.Close()
		tr.Close()
		n.mux.Close()
		<-served
		n.broker.Close()
		st.Close()
	})
	return n
}

// state is the job's state on n, "" if n does not have it.
func (n *busNode) state(id string) string {
	j, err := n.st.Job(id)
	if err != nil {
		return ""
	}
	return j.State.String()
}

// TestAddJobReplicatesExternallyUnderPressure: a server over a node of a
// 3-node cluster (real memberlist and TCP bus). Over maxmemory — a tiny
// one, as Disque's suite sets — ADDJOB no longer answers -OOM: the job
// goes to REPLICATE other nodes, nothing is kept here (SHOW is nil), and
// exactly one other node queues it. The same when the node is leaving.
// Alone (its peers forgotten), the node answers -OOM again.
func TestAddJobReplicatesExternallyUnderPressure(t *testing.T) {
	nodes := []*busNode{startBusNode(t), startBusNode(t), startBusNode(t)}
	s, addr := startServer(t)
	self := nodes[0]
	s.SetBroker(self.broker)
	s.SetCluster(self.member, nil)
	for _, n := range nodes[1:] {
		if err := self.member.MeetBus("127.0.0.1", n.mux.Addr().Port); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "two reachable peers on every node", func() bool {
		for _, n := range nodes {
			if n.jobs.ReachablePeers() != 2 {
				return false
			}
		}
		return true
	})
	c := newClientOn(t, addr)

	// sent is how many copies this node had sent (REPLJOB) before the
	// ADDJOB at hand: a copy whose confirmation is late (past Disque's
	// 50 ms, on a loaded machine) is sent again, and to one more node, as
	// Disque does, so the job may then be held by more than REPLICATE
	// nodes — but only by as many more as copies were sent beyond them.
	var sent int64
	mark := func() { sent = self.jobs.Stats().ReplJobsSent }

	// queuedOnce waits until exactly one other node has the job queued
	// and want nodes hold it (more only if more copies were sent), and
	// fails if this node has any of it.
	queuedOnce := func(id string, want int) {
		t.Helper()
		if v, e := clusterDo(t, c, "SHOW", id); v != nil || e != "redis: nil" {
			t.Fatalf("SHOW %s on the adding node = %v %s, want nil", id, v, e)
		}
		eventually(t, "the job queued on one other node", func() bool {
			held, queued := 0, 0
			for _, n := range nodes[1:] {
				switch n.state(id) {
				case "":
				case "queued":
					held, queued = held+1, queued+1
				default:
					held++
				}
			}
			if queued > 1 {
				t.Fatalf("queued on %d nodes", queued)
			}
			extra := int(self.jobs.Stats().ReplJobsSent - sent - int64(want))
			return held >= want && held <= want+max(extra, 0) && queued == 1
		})
	}

	s.SetMaxMemory(1) // measured at once
	for _, repl := range []int{1, 2} {
		mark()
		v, e := clusterDo(t, c, "ADDJOB", "q", "body", 5000, "REPLICATE", repl)
		if e != "" {
			t.Fatalf("ADDJOB REPLICATE %d over maxmemory: %s", repl, e)
		}
		queuedOnce(fmt.Sprint(v), repl)
	}
	if v, e := clusterDo(t, c, "ADDJOB", "q", "body", 5000, "REPLICATE", 3); !strings.HasPrefix(e, "NOREPL") ||
		!strings.Contains(e, "I'm out of memory") {
		t.Fatalf("ADDJOB REPLICATE 3 of 3 over maxmemory = %v %q, want NOREPL … out of memory", v, e)
	}
	// ASYNC: the reply at once, the copies after.
	mark()
	v, e := clusterDo(t, c, "ADDJOB", "q", "body", 0, "REPLICATE", 2, "ASYNC")
	if e != "" {
		t.Fatal(e)
	}
	queuedOnce(fmt.Sprint(v), 2)
	s.SetMaxMemory(0)
	if n := self.st.Stats().Jobs; n != 0 {
		t.Fatalf("the node under pressure holds %d jobs", n)
	}

	// Leaving: the same, with no memory pressure.
	clusterDo(t, c, "CLUSTER", "LEAVING", "yes")
	mark()
	v, e = clusterDo(t, c, "ADDJOB", "q", "body", 5000, "REPLICATE", 2)
	if e != "" {
		t.Fatal(e)
	}
	queuedOnce(fmt.Sprint(v), 2)
	clusterDo(t, c, "CLUSTER", "LEAVING", "no")
	v, e = clusterDo(t, c, "ADDJOB", "q", "body", 5000, "REPLICATE", 2)
	if e != "" || self.state(fmt.Sprint(v)) != "queued" {
		t.Fatalf("ADDJOB without pressure: %v %s, state here %q; want queued here", v, e, self.state(fmt.Sprint(v)))
	}

	// Alone: over maxmemory is -OOM, as for a lone node.
	for _, n := range nodes[1:] {
		if err := self.member.Forget(n.member.ID()); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, "no reachable peer", func() bool { return self.jobs.ReachablePeers() == 0 })
	s.SetMaxMemory(1)
	if _, e := clusterDo(t, c, "ADDJOB", "q", "body", 0, "REPLICATE", 1); !strings.HasPrefix(e, "OOM") {
		t.Fatalf("ADDJOB alone over maxmemory: %q, want -OOM", e)
	}
}

// TestTinyMaxMemoryEvictsIdleQueues: registered_queues counts empty queues
// the broker still knows (Disque's meaning); over maxmemory, those idle
// for queue.PressureQueueIdle are evicted, so it drops to 0 (Disque's
// 04-ttl). DEBUG FLUSHALL forgets queues too.
func TestTinyMaxMemoryEvictsIdleQueues(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	c := newClientOn(t, addr)
	for i := range 20 {
		q := fmt.Sprintf("queue-%d", i)
		if _, e := clusterDo(t, c, "ADDJOB", q, "x", 0, "RETRY", 0); e != "" {
			t.Fatal(e)
		}
		if _, e := clusterDo(t, c, "GETJOB", "FROM", q); e != "" {
			t.Fatal(e)
		}
	}
	registered := func() string {
		v, _ := clusterDo(t, c, "INFO")
		for line := range strings.SplitSeq(fmt.Sprint(v), "\r\n") {
			if after, ok := strings.CutPrefix(line, "registered_queues:"); ok {
				return after
			}
		}
		return "?"
	}
	if got := registered(); got != "20" {
		t.Fatalf("registered_queues = %s, want 20 (empty queues count)", got)
	}
	start := time.Now()
	s.SetMaxMemory(1)
	eventually(t, "registered_queues 0 under maxmemory 1", func() bool {
		s.measure() // as the guard's loop does every GuardInterval
		return registered() == "0"
	})
	if took := time.Since(start); took < queue.PressureQueueIdle-100*time.Millisecond {
		t.Fatalf("queues evicted after %v, before they were idle %v", took, queue.PressureQueueIdle)
	}
	s.SetMaxMemory(0)
	if _, e := clusterDo(t, c, "ADDJOB", "other", "x", 0); e != "" {
		t.Fatal(e)
	}
	clusterDo(t, c, "GETJOB", "FROM", "other")
	if got := registered(); got != "1" {
		t.Fatalf("registered_queues = %s, want 1", got)
	}
	clusterDo(t, c, "DEBUG", "FLUSHALL")
	if got := registered(); got != "0" {
		t.Fatalf("registered_queues after DEBUG FLUSHALL = %s, want 0", got)
	}
}
