package main

// The cluster under partitions (shared/CLUSTER.md "Beyond Disque"): real
// diskque-server processes, each bound to its own loopback address and
// announcing a fault proxy in front of its bus (internal/faultproxy), so
// that the bus between chosen nodes can be cut, delayed and healed.
//
// cluster-node-timeout is 1500 ms and RETRY 1 s to keep the whole file to
// some seconds; every wait is still polled with a generous deadline (the
// servers are -race builds on a loaded 2-core machine).

import (
	"flag"
	"strconv"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/faultproxy"
)

// partNodeTimeout is the cluster-node-timeout of a partition test cluster.
const partNodeTimeout = 1500 * time.Millisecond

// partCluster is a procCluster whose bus traffic goes through a
// faultproxy.Net.
type partCluster struct {
	*procCluster
	net *faultproxy.Net
}

// startPartCluster starts n nodes behind a faultproxy.Net: node i binds
// its client port, bus port and outgoing bus dials to its own address and
// announces its proxy; they MEET in a chain at the proxies' addresses and
// the function returns once every node reaches the others.
func startPartCluster(t *testing.T, n int) *partCluster {
	t.Helper()
	nt, err := faultproxy.New(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, e := range nt.Events() {
				t.Logf("fault: %s", e)
			}
		}
		nt.Close()
	})
	pc := &partCluster{procCluster: &procCluster{t: t}, net: nt}
	for i := range n {
		nd := nt.Node(i)
		flags := append(nd.Flags(), "--cluster-node-timeout", strconv.Itoa(int(partNodeTimeout.Milliseconds())))
		s := startServerConfig(t, serverConfig{flags: flags, host: nd.IP.String()})
		c := s.client(t)
		pc.nodes, pc.clients = append(pc.nodes, s), append(pc.clients, c)
		pc.ids, pc.busPort = append(pc.ids, myID(t, c)), append(pc.busPort, int(nd.Proxy.Port()))
	}
	for i := range n - 1 {
		next := nt.Node(i + 1)
		if got := doStr(t, pc.clients[i], "CLUSTER", "MEET", next.IP.String(),
			strconv.Itoa(pc.nodes[i+1].port), strconv.Itoa(pc.busPort[i+1])); got != "OK" {
			t.Fatalf("CLUSTER MEET = %q", got)
		}
	}
	pc.waitMesh()
	// Every peer is known by its proxy: all bus traffic goes through it.
	for i := range n {
		for _, l := range clusterNodes(t, pc.clients[i]) {
			if j := pc.index(l.id); j != i && l.addr != pc.nodes[j].addr {
				t.Fatalf("node %d gives node %d's client address as %s, want %s", i, j, l.addr, pc.nodes[j].addr)
			}
		}
		if s := nt.Stats(i); s.Accepted == 0 {
			t.Fatalf("node %d's proxy carried no connection: the bus bypasses it", i)
		}
	}
	return pc
}

// flagged reports whether node i's CLUSTER NODES gives node j flag.
func (pc *partCluster) flagged(i, j int, flag string) bool {
	return hasFlag(clusterNodes(pc.t, pc.clients[i])[pc.ids[j]].flags, flag)
}

// TestClusterPartitionFailureDetectionAndDelay: a node cut off from the
// others is flagged fail on both of them (and flags them fail too) within
// about twice cluster-node-timeout, and the flags clear after the heal;
// with 200 ms of latency each way on one link, ADDJOB REPLICATE 3 still
// succeeds, and takes at least that link's round trip.
func TestClusterPartitionFailureDetectionAndDelay(t *testing.T) {
	pc := startPartCluster(t, 3)

	pc.net.CutOff(2)
	cut := time.Now()
	failed := waitUntil(t, clusterWait, "nodes 0 and 1 to flag node 2 fail, and node 2 them", func() bool {
		return pc.flagged(0, 2, "fail") && pc.flagged(1, 2, "fail") && pc.flagged(2, 0, "fail") && pc.flagged(2, 1, "fail")
	})
	took := failed.Sub(cut)
	t.Logf("the isolated node flagged fail %v after the cut (cluster-node-timeout %v)", took.Round(time.Millisecond), partNodeTimeout)
	if took > 2*partNodeTimeout+5*time.Second {
		t.Errorf("fail %v after the cut, want within about %v", took, 2*partNodeTimeout)
	}
	if pc.flagged(0, 1, "fail") || pc.flagged(0, 1, "fail?") {
		t.Errorf("node 0 flags node 1, on its side of the cut: %q", clusterNodes(t, pc.clients[0])[pc.ids[1]].flags)
	}
	// The isolated node cannot replicate; the majority side can.
	wantErrPrefix(t, pc.clients[2], "NOREPL", "ADDJOB", "qd", "x", 2000, "REPLICATE", 2)
	addJob(t, pc.clients[0], "qd", "majority", "REPLICATE", 2)

	pc.net.HealAll()
	healed := time.Now()
	pc.waitMesh()
	waitUntil(t, clusterWait, "every flag to clear after the heal", func() bool {
		for i := range 3 {
			for j := range 3 {
				if i != j && clusterNodes(t, pc.clients[i])[pc.ids[j]].flags != "noflags" {
					return false
				}
			}
		}
		return true
	})
	t.Logf("flags cleared %v after the heal", time.Since(healed).Round(time.Millisecond))

	// 200 ms each way between nodes 0 and 1 only: REPLJOB to node 1 and
	// its GOTJOB each take 200 ms, gossip still finds node 1 alive through
	// node 2 (indirect probes), and the job is replicated within its
	// timeout.
	pc.net.Delay(0, 1, 200*time.Millisecond)
	for k := range 3 {
		start := time.Now()
		id := doStr(t, pc.clients[0], "ADDJOB", "qd", "slow-"+strconv.Itoa(k), 5000, "REPLICATE", 3)
		rtt := time.Since(start)
		t.Logf("ADDJOB REPLICATE 3 over a 200 ms link: %v", rtt.Round(time.Millisecond))
		if rtt < 400*time.Millisecond {
			t.Errorf("ADDJOB REPLICATE 3 replied in %v, under the 400 ms round trip to node 1", rtt)
		}
		if got := pc.state(1, id); got != "active" {
			t.Errorf("node 1's copy after ADDJOB replied is %q, want active", got)
		}
	}
	if s := pc.net.Stats(1); s.BytesUp == 0 {
		t.Errorf("node 1's proxy carried nothing: %+v", s)
	}
}

// partitionHold is how long TestClusterPartitionSplitHoldersThenHeal
// keeps the partition after its ACKJOB.
var partitionHold = flag.Duration("partition.hold", 2*time.Second, "how long the split-holders partition lasts after the ACKJOB")

// TestClusterPartitionSplitHoldersThenHeal: a REPLICATE 3 job whose
// holders are split 1|2 is delivered on both sides once RETRY passes
// (at-least-once holds on each side); ACKJOB on one side during the
// partition; after the heal ack GC deletes every copy within a bound that
// follows from the SETACK backoff, and the job is never delivered again.
func TestClusterPartitionSplitHoldersThenHeal(t *testing.T) {
	pc := startPartCluster(t, 3)
	const queue, body = "qsplit", "split"
	id := addJob(t, pc.clients[0], queue, body, "REPLICATE", 3, "RETRY", 1)
	if h := pc.holders(0, id); len(h) != 3 {
		t.Fatalf("nodes-delivered = %v, want all three", h)
	}
	pc.net.Partition([]int{0}, []int{1, 2})

	// Side {0}: the origin has it queued, and delivers it.
	if jobs := getJobs(t, pc.clients[0], "NOHANG", "FROM", queue); len(jobs) != 1 || jobs[0].ID != id {
		t.Fatalf("GETJOB on node 0 = %+v, want the job", jobs)
	}
	// Side {1, 2}: after RETRY with no word from node 0, a holder there
	// queues its copy, and delivers it.
	b := pc.deliverFrom(id, queue, body, []int{1, 2})
	t.Logf("node %d delivered the job on the other side of the partition", b)
	// And side {0} requeues it again after RETRY: node 1 and 2's QUEUED
	// cannot reach it.
	pc.deliverFrom(id, queue, body, []int{0})

	// ACKJOB on side {0}: acked there, side {1, 2} cannot hear of it.
	if n := doInt(t, pc.clients[0], "ACKJOB", id); n != 1 {
		t.Fatalf("ACKJOB on node 0 = %d, want 1", n)
	}
	acked := time.Now()
	if got := pc.state(0, id); got != "acked" {
		t.Fatalf("node 0's copy after ACKJOB is %q, want acked", got)
	}
	for _, i := range []int{1, 2} {
		if got := pc.state(i, id); got == "" || got == "acked" {
			t.Fatalf("under the partition, node %d's copy is %q: the ack crossed the cut", i, got)
		}
	}
	// Let the SETACK rounds back off a little under the partition
	// (-partition.hold: longer, to measure the collection after the heal).
	waitUntil(t, clusterWait+*partitionHold, "the partition after the ACKJOB", func() bool { return time.Since(acked) >= *partitionHold })

	pc.net.HealAll()
	healed := time.Now()
	// SETACK rounds run at ack + 1, 3, 7, 15 … s (each gap 1 s·2^k ± 0.5
	// s), so the first round after the heal comes at most the partition's
	// length after the ACKJOB (E), plus 1.5 s, plus 0.5 s per round
	// already run, after the heal. The link must also be back: its redial
	// backoff is at most 3 s (TCPConfig.BackoffMax), and a round sent
	// while it is down waits in its queue. Then GOTACK and DELJOB, a
	// round trip each. Slack of 10 s for -race builds on a loaded machine.
	e := healed.Sub(acked)
	rounds := 0
	for at := time.Second; at <= e; at = 2*at + time.Second {
		rounds++
	}
	bound := e + 1500*time.Millisecond + time.Duration(rounds)*500*time.Millisecond + 3*time.Second + 10*time.Second
	gone := waitUntil(t, bound, "ack GC to delete every copy after the heal", func() bool {
		for i := range 3 {
			if show(t, pc.clients[i], id) != nil {
				return false
			}
		}
		return true
	})
	t.Logf("partition of %v after the ACKJOB; every copy gone %v after the heal (bound %v)",
		e.Round(time.Millisecond), gone.Sub(healed).Round(time.Millisecond), bound.Round(time.Millisecond))

	// Never delivered again: for three RETRY periods no node gives it.
	quiet := time.Now()
	for time.Since(quiet) < 3*time.Second {
		for i := range 3 {
			if jobs := getJobs(t, pc.clients[i], "NOHANG", "FROM", queue); len(jobs) > 0 {
				t.Fatalf("node %d delivered %+v after ack GC completed", i, jobs)
			}
		}
		time.Sleep(50 * time.Millisecond) // polling over the window, not synchronising
	}
	if got := clusterInfoField(t, pc.clients[0], "cluster_reachable_nodes"); got != "2" {
		t.Errorf("after the heal node 0 reaches %s nodes, want 2", got)
	}
}

// TestClusterPartitionBlackHoleAndRestart: a node whose bus traffic is
// black-holed both ways (connections stay open, bytes stop: a lost route
// rather than a reset) is flagged fail too, and clears once the held bytes
// flow again; a node SIGKILLed and restarted behind its proxy, on a new
// client port, rejoins from its nodes file through the proxies.
func TestClusterPartitionBlackHoleAndRestart(t *testing.T) {
	pc := startPartCluster(t, 3)

	for _, other := range []int{0, 1} {
		pc.net.Hold(2, other)
		pc.net.Hold(other, 2)
	}
	held := time.Now()
	waitUntil(t, clusterWait, "nodes 0 and 1 to flag the black-holed node 2 fail", func() bool {
		return pc.flagged(0, 2, "fail") && pc.flagged(1, 2, "fail")
	})
	t.Logf("the black-holed node flagged fail %v after the hold", time.Since(held).Round(time.Millisecond))
	if s := pc.net.Stats(2); s.Reset != 0 || s.Refused != 0 {
		t.Errorf("a hold reset or refused connections: %+v", s)
	}
	pc.net.HealAll()
	pc.waitMesh()
	waitUntil(t, clusterWait, "node 0's flags on node 2 to clear", func() bool {
		return clusterNodes(t, pc.clients[0])[pc.ids[2]].flags == "noflags"
	})

	pc.kill(1)
	waitUntil(t, clusterWait, "node 0 to flag the killed node 1 fail", func() bool { return pc.flagged(0, 1, "fail") })
	pc.restart(1)
	pc.waitMesh()
	waitUntil(t, clusterWait, "node 0 to give node 1's new client address with no flag", func() bool {
		l := clusterNodes(t, pc.clients[0])[pc.ids[1]]
		return l.flags == "noflags" && l.addr == pc.nodes[1].addr
	})
	// The restarted node replicates through the proxies like the others.
	id := addJob(t, pc.clients[1], "qr", "after-restart", "REPLICATE", 3)
	for _, i := range []int{0, 2} {
		if got := pc.state(i, id); got != "active" {
			t.Errorf("node %d's copy of a job added on the restarted node is %q, want active", i, got)
		}
	}
}
