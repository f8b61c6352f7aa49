package main

// Jobs across a cluster of real diskque-server processes (shared/CLUSTER.md
// "Jobs across nodes"): synchronous replication, a job surviving the death
// of holders, ack GC (with a holder that was down), ACKJOB and FASTACK to a
// node that never had the job, and a whole cluster killed with SIGKILL and
// restarted on its directories.
//
// Every wait is polled with a generous deadline: the servers are -race
// builds on a loaded 2-core machine. cluster-node-timeout is 2 s, RETRY 1 s.

import (
	"context"
	"errors"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// procCluster is n diskque-server processes that met each other.
type procCluster struct {
	t       *testing.T
	nodes   []*daemon
	clients []*redis.Client
	ids     []string
	busPort []int
}

// clusterWait bounds every wait on the cluster: generous, the servers are
// -race builds on a loaded machine.
const clusterWait = 40 * time.Second

// startProcCluster starts n nodes with cluster-node-timeout 2000 and a
// fixed bus port each (so that a node restarted on its directory, on a new
// client port, is found at the bus address its peers saved), MEETs them in
// a chain and waits until every node reaches the others.
func startProcCluster(t *testing.T, n int, extra ...string) *procCluster {
	t.Helper()
	pc := &procCluster{t: t}
	used := map[int]bool{}
	for range n {
		bus := freePort(t)
		for used[bus] {
			bus = freePort(t)
		}
		used[bus] = true
		flags := append([]string{"--cluster-node-timeout", "2000", "--cluster-bus-port", strconv.Itoa(bus)}, extra...)
		s := startServer(t, flags...)
		c := s.client(t)
		pc.nodes, pc.clients = append(pc.nodes, s), append(pc.clients, c)
		pc.ids, pc.busPort = append(pc.ids, myID(t, c)), append(pc.busPort, bus)
	}
	for i := range n - 1 {
		if got := doStr(t, pc.clients[i], "CLUSTER", "MEET", "127.0.0.1",
			strconv.Itoa(pc.nodes[i+1].port), strconv.Itoa(pc.busPort[i+1])); got != "OK" {
			t.Fatalf("CLUSTER MEET = %q", got)
		}
	}
	pc.waitMesh()
	return pc
}

// waitMesh waits until every running node reaches every other running one.
func (pc *procCluster) waitMesh() {
	pc.t.Helper()
	var live []*redis.Client
	for i, s := range pc.nodes {
		if s.proc != nil {
			live = append(live, pc.clients[i])
		}
	}
	waitReachable(pc.t, clusterWait, len(live)-1, live...)
}

// kill SIGKILLs node i.
func (pc *procCluster) kill(i int) { pc.t.Helper(); pc.nodes[i].Kill() }

// restart starts node i again on its directory (a new client port, the same
// bus port) and gives it a new client.
func (pc *procCluster) restart(i int) {
	pc.t.Helper()
	pc.nodes[i].Start()
	pc.clients[i] = pc.nodes[i].client(pc.t)
	if got := myID(pc.t, pc.clients[i]); got != pc.ids[i] {
		pc.t.Fatalf("node %d's id after the restart = %s, want %s", i, got, pc.ids[i])
	}
}

// index is the node whose id is id; -1 if none.
func (pc *procCluster) index(id string) int { return slices.Index(pc.ids, id) }

// holders is the job's nodes-delivered, as node indexes, from SHOW on node
// i.
func (pc *procCluster) holders(i int, jobID string) []int {
	pc.t.Helper()
	m := show(pc.t, pc.clients[i], jobID)
	if m == nil {
		pc.t.Fatalf("SHOW %s on node %d: unknown job", jobID, i)
	}
	var out []int
	for _, v := range m["nodes-delivered"].([]any) {
		h := pc.index(v.(string))
		if h < 0 {
			pc.t.Fatalf("SHOW %s on node %d: nodes-delivered has %v, not a node of the cluster %v", jobID, i, v, pc.ids)
		}
		out = append(out, h)
	}
	slices.Sort(out)
	return out
}

// state is the job's SHOW state on node i ("" = unknown there).
func (pc *procCluster) state(i int, jobID string) string {
	pc.t.Helper()
	m := show(pc.t, pc.clients[i], jobID)
	if m == nil {
		return ""
	}
	return m["state"].(string)
}

// deliverFrom waits until one of the running nodes in among has the job
// queued, then GETJOBs it there and checks it is the job.
func (pc *procCluster) deliverFrom(jobID, queue, body string, among []int) int {
	pc.t.Helper()
	got := -1
	waitUntil(pc.t, clusterWait, "a live holder of "+jobID+" to queue it", func() bool {
		for _, i := range among {
			if pc.nodes[i].proc != nil && pc.state(i, jobID) == "queued" {
				got = i
				return true
			}
		}
		return false
	})
	jobs := getJobs(pc.t, pc.clients[got], "NOHANG", "FROM", queue)
	if len(jobs) != 1 || jobs[0].ID != jobID || jobs[0].Body != body || jobs[0].Queue != queue {
		pc.t.Fatalf("GETJOB on node %d, which had %s queued = %+v", got, jobID, jobs)
	}
	return got
}

// waitGone waits until no running node of among knows the job.
func (pc *procCluster) waitGone(jobID string, among []int) {
	pc.t.Helper()
	waitUntil(pc.t, clusterWait, "every copy of "+jobID+" to be deleted", func() bool {
		for _, i := range among {
			if pc.nodes[i].proc != nil && show(pc.t, pc.clients[i], jobID) != nil {
				return false
			}
		}
		return true
	})
}

func all(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// TestClusterProcessesReplicationSurvivesKills: a REPLICATE 3 job is on
// the disks of both other nodes (state active) when ADDJOB replies, and
// after its origin is killed a replica queues it (RETRY) and delivers it;
// a REPLICATE 2 job survives the death of either of its holders.
func TestClusterProcessesReplicationSurvivesKills(t *testing.T) {
	pc := startProcCluster(t, 3)
	a := pc.clients[0]

	// REPLICATE 3: the copies are there when ADDJOB replies.
	id := addJob(t, a, "q3", "body3", "REPLICATE", 3, "RETRY", 1)
	for _, i := range []int{1, 2} {
		if got := pc.state(i, id); got != "active" {
			t.Fatalf("right after ADDJOB REPLICATE 3 replied, node %d's copy is %q, want active", i, got)
		}
	}
	if got := pc.state(0, id); got != "queued" {
		t.Errorf("the origin's copy is %q, want queued", got)
	}
	if h := pc.holders(0, id); !slices.Equal(h, []int{0, 1, 2}) {
		t.Errorf("the origin's nodes-delivered = %v, want all three nodes", h)
	}
	// The origin dies; after RETRY a replica queues its copy.
	pc.kill(0)
	got := pc.deliverFrom(id, "q3", "body3", []int{1, 2})
	t.Logf("node %d delivered the job after its origin was killed", got)
	if n := doInt(t, pc.clients[got], "ACKJOB", id); n != 1 {
		t.Errorf("ACKJOB on node %d = %d, want 1", got, n)
	}
	pc.restart(0)
	pc.waitMesh()

	// REPLICATE 2: kill each holder in turn (one job each); the other
	// holder delivers it.
	for _, victim := range []string{"replica", "origin"} {
		origin := 1
		id := addJob(t, pc.clients[origin], "q2", "body2-"+victim, "REPLICATE", 2, "RETRY", 1)
		// nodes-delivered is every node REPLJOB went to: the one more
		// added while the first was slow to answer (a node just
		// restarted) too.
		h := pc.holders(origin, id)
		if len(h) < 2 || !slices.Contains(h, origin) {
			t.Fatalf("REPLICATE 2 job on node %d: nodes-delivered = %v, want the origin and one more at least", origin, h)
		}
		replica := -1
		for _, i := range h {
			if i != origin && pc.state(i, id) == "active" {
				replica = i
				break
			}
		}
		if replica < 0 {
			t.Fatalf("no node of nodes-delivered %v but the origin has an active copy", h)
		}
		dead := replica
		if victim == "origin" {
			dead = origin
		}
		pc.kill(dead)
		other := pc.deliverFrom(id, "q2", "body2-"+victim, h)
		if n := doInt(t, pc.clients[other], "ACKJOB", id); n != 1 {
			t.Errorf("ACKJOB on node %d = %d, want 1", other, n)
		}
		pc.restart(dead)
		pc.waitMesh()
	}
}

// TestClusterProcessesAckGC: ACKJOB deletes every copy on every holder,
// including one that was SIGKILLed before the ACKJOB and restarted some
// seconds later (its copy comes back from its AOF and ack GC reaches it);
// FASTACK on a holder and on a non-holder deletes every copy too.
func TestClusterProcessesAckGC(t *testing.T) {
	pc := startProcCluster(t, 3)
	a := pc.clients[0]

	// All holders up.
	id := addJob(t, a, "qa", "b", "REPLICATE", 3)
	if n := doInt(t, a, "ACKJOB", id); n != 1 {
		t.Errorf("ACKJOB = %d, want 1", n)
	}
	pc.waitGone(id, all(3))
	// INFO cluster counts the job protocol's work.
	in := info(t, a, "cluster")
	for _, f := range []string{"cluster_repljobs_sent", "cluster_gotjobs_received", "cluster_setacks_sent", "cluster_deljobs_sent"} {
		if n, err := strconv.Atoi(in[f]); err != nil || n < 1 {
			t.Errorf("INFO cluster %s = %q after a replicated, acked and collected job", f, in[f])
		}
	}
	if in["cluster_pending_ack_collections"] != "0" || in["cluster_pending_replications"] != "0" {
		t.Errorf("INFO cluster pending: collections %q, replications %q, want 0 and 0",
			in["cluster_pending_ack_collections"], in["cluster_pending_replications"])
	}

	// A holder down during the ACKJOB: the others keep the job acked
	// (ack GC cannot finish), and once it is back every copy goes.
	id = addJob(t, a, "qa", "b", "REPLICATE", 3)
	pc.kill(2)
	downAt := time.Now()
	if n := doInt(t, a, "ACKJOB", id); n != 1 {
		t.Errorf("ACKJOB with a holder down = %d, want 1", n)
	}
	for _, i := range []int{0, 1} {
		if got := pc.state(i, id); got != "acked" {
			waitUntil(t, clusterWait, "node "+strconv.Itoa(i)+" to show the job acked", func() bool {
				return pc.state(i, id) == "acked"
			})
		}
	}
	// Restarted about 5 s after it went down.
	waitUntil(t, 30*time.Second, "5 s with node 2 down", func() bool { return time.Since(downAt) >= 5*time.Second })
	for _, i := range []int{0, 1} {
		if got := pc.state(i, id); got != "acked" {
			t.Errorf("with holder 2 down for 5 s, node %d's copy is %q, want acked (kept until every holder confirmed)", i, got)
		}
	}
	pc.restart(2)
	pc.waitGone(id, all(3))

	pc.waitMesh()
	// FASTACK on a holder (not the origin) and on a non-holder.
	id = addJob(t, a, "qa", "b", "REPLICATE", 3)
	if n := doInt(t, pc.clients[1], "FASTACK", id); n != 1 {
		t.Errorf("FASTACK on a holder = %d, want 1", n)
	}
	pc.waitGone(id, all(3))
	id = addJob(t, a, "qa", "b", "REPLICATE", 2)
	stranger := nonHolder(t, pc, 0, id)
	if n := doInt(t, pc.clients[stranger], "FASTACK", id); n != 0 {
		t.Errorf("FASTACK on node %d, which never had the job = %d, want 0", stranger, n)
	}
	pc.waitGone(id, all(3))
}

// TestClusterProcessesAckToNonHolder: ACKJOB on a node that never had the
// job makes a dummy ack there (0 in the reply) and SETACK to every node;
// the holders then collect the job themselves and every copy goes (Disque
// 05-acks "It is possible to acknowledge jobs to nodes not knowing it").
func TestClusterProcessesAckToNonHolder(t *testing.T) {
	pc := startProcCluster(t, 3)
	id := addJob(t, pc.clients[0], "qa", "b", "REPLICATE", 2)
	stranger := nonHolder(t, pc, 0, id)
	if n := doInt(t, pc.clients[stranger], "ACKJOB", id); n != 0 {
		t.Errorf("ACKJOB on node %d, which never had the job = %d, want 0", stranger, n)
	}
	pc.waitGone(id, all(3))
}

// nonHolder is a node not in the job's nodes-delivered (seen from node
// origin), checked to know nothing of it.
func nonHolder(t *testing.T, pc *procCluster, origin int, id string) int {
	t.Helper()
	h := pc.holders(origin, id)
	for i := range pc.nodes {
		if !slices.Contains(h, i) {
			if m := show(t, pc.clients[i], id); m != nil {
				t.Fatalf("node %d is not in nodes-delivered %v but SHOW there = %v", i, h, m)
			}
			return i
		}
	}
	t.Fatalf("every node holds %s (nodes-delivered %v)", id, h)
	return -1
}

// TestClusterProcessesSurviveKillingEveryNode: 100 replicated jobs added
// across the nodes, then every node SIGKILLed at once and restarted on its
// directory with no MEET: the nodes find each other from their nodes files
// and every unacked job is delivered (Disque, whose copies are in memory,
// lost them all).
func TestClusterProcessesSurviveKillingEveryNode(t *testing.T) {
	pc := startProcCluster(t, 3)
	const jobs = 100
	want := map[string]bool{}
	for j := range jobs {
		id := addJob(t, pc.clients[j%3], "mass", "job-"+strconv.Itoa(j), "REPLICATE", 2, "RETRY", 1)
		want[id] = true
	}
	// Some consumed and acked before the crash: they must not come back.
	acked := map[string]bool{}
	for i := range 3 {
		for _, j := range getJobs(t, pc.clients[i], "NOHANG", "COUNT", 3, "FROM", "mass") {
			if n := doInt(t, pc.clients[i], "ACKJOB", j.ID); n != 1 {
				t.Fatalf("ACKJOB %s = %d", j.ID, n)
			}
			delete(want, j.ID)
			acked[j.ID] = true
		}
	}
	// Ack GC done before the crash: an acked job's copies are gone (one
	// whose GC was cut short may be delivered again: at least once).
	for id := range acked {
		pc.waitGone(id, all(3))
	}
	for i := range 3 {
		pc.kill(i)
	}
	for i := range 3 {
		pc.restart(i)
	}
	pc.waitMesh()
	got := map[string]bool{}
	waitUntil(t, 60*time.Second, "every unacked job to be delivered after the whole cluster restarted", func() bool {
		for i := range 3 {
			v, err := pc.clients[i].Do(context.Background(), "GETJOB", "NOHANG", "COUNT", 100, "FROM", "mass").Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				t.Fatalf("GETJOB on node %d: %v", i, err)
			}
			for _, j := range parseJobs(t, v) {
				if acked[j.ID] {
					t.Errorf("job %s, acked before the crash, was delivered again by node %d", j.ID, i)
				}
				got[j.ID] = true
				// Ack it, so no other holder requeues it meanwhile.
				doInt(t, pc.clients[i], "ACKJOB", j.ID)
			}
		}
		for id := range want {
			if !got[id] {
				return false
			}
		}
		return true
	})
	t.Logf("%d unacked jobs delivered after every node was killed and restarted", len(want))
}
