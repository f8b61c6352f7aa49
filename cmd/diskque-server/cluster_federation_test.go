package main

// Federation and leaving across real diskque-server processes
// (shared/CLUSTER.md "Federation", "Leaving"; README "A cluster", Draining
// a node): consumers on other nodes drain a leaving node's queues, and the
// node is then removed with CLUSTER FORGET, no job lost.

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
)

// TestClusterProcessesDrainLeavingNode follows README's drain procedure:
// CLUSTER LEAVING yes on node 0, consumers on nodes 1 and 2 only, wait
// until node 0's INFO queued_jobs is 0 (and its ack collections are done),
// stop it, CLUSTER FORGET it on the others. Every job added on node 0 —
// at-least-once with a copy elsewhere, at-least-once on node 0 alone, and
// at-most-once — is delivered, the at-most-once ones exactly once. Node 0
// itself still hands out a job it has queued, and answers -LEAVING once
// its queue is empty.
func TestClusterProcessesDrainLeavingNode(t *testing.T) {
	pc := startProcCluster(t, 3)
	leaver := pc.clients[0]
	want := map[string]bool{}
	atMostOnce := map[string]bool{}
	for i := range 45 {
		body := fmt.Sprint("job-", i)
		switch i % 3 {
		case 0:
			addJob(t, leaver, "drain", body, "REPLICATE", 2, "RETRY", 30)
		case 1:
			addJob(t, leaver, "drain", body, "REPLICATE", 1, "RETRY", 30)
		case 2:
			addJob(t, leaver, "drain", body, "REPLICATE", 1, "RETRY", 0)
			atMostOnce[body] = true
		}
		want[body] = true
	}
	if got := doStr(t, leaver, "CLUSTER", "LEAVING", "yes"); got != "OK" {
		t.Fatalf("CLUSTER LEAVING yes = %q", got)
	}

	var mu sync.Mutex
	delivered := map[string]int{}
	// A consumer of the leaving node still gets what it has queued.
	first := getJobs(t, leaver, "TIMEOUT", 100, "FROM", "drain")
	if len(first) != 1 {
		t.Fatalf("GETJOB on the leaving node, with jobs queued = %+v", first)
	}
	doInt(t, leaver, "ACKJOB", first[0].ID)
	delivered[first[0].Body]++

	// Consumers on the other nodes (a blocking GETJOB with TIMEOUT, as
	// a worker does) import the rest.
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, c := range pc.clients[1:] {
		wg.Go(func() {
			for ctx.Err() == nil {
				v, err := c.Do(ctx, "GETJOB", "TIMEOUT", 500, "COUNT", 10, "FROM", "drain").Result()
				if err != nil {
					continue // a timeout (nil), or the test ending
				}
				for _, j := range parseJobs(t, v) {
					if err := c.Do(ctx, "ACKJOB", j.ID).Err(); err != nil && ctx.Err() == nil {
						t.Errorf("ACKJOB %s: %v", j.ID, err)
					}
					mu.Lock()
					delivered[j.Body]++
					mu.Unlock()
				}
			}
		})
	}
	defer func() { stop(); wg.Wait() }()

	waitUntil(t, clusterWait, "node 0 to hold no queued job (INFO queued_jobs:0)", func() bool {
		return info(t, leaver, "jobs")["queued_jobs"] == "0"
	})
	waitUntil(t, clusterWait, "node 0's ack collections to finish", func() bool {
		return info(t, leaver, "cluster")["cluster_pending_ack_collections"] == "0"
	})
	// Empty now: a blocking GETJOB there is told to go elsewhere.
	_, err := leaver.Do(context.Background(), "GETJOB", "TIMEOUT", 100, "FROM", "drain").Result()
	if err == nil || !strings.HasPrefix(err.Error(), "LEAVING ") {
		t.Fatalf("GETJOB on the drained leaving node: %v, want -LEAVING", err)
	}
	waitUntil(t, clusterWait, "every job delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(delivered) == len(want)
	})

	// INFO cluster's federation counters: the consumers' nodes asked, the
	// leaving node never did (CLUSTER.md: a leaving node sends no
	// NEEDJOBS) and gave away the 44 jobs it did not deliver itself; every
	// job given was received (nothing is in flight once all are delivered).
	var sent, received int64
	for i, c := range pc.clients {
		in := info(t, c, "cluster")
		need, gave, got := atoi(t, in["cluster_needjobs_sent"]), atoi(t, in["cluster_yourjobs_jobs_sent"]), atoi(t, in["cluster_yourjobs_jobs_received"])
		switch {
		case i == 0 && need != 0:
			t.Errorf("the leaving node sent %d NEEDJOBS", need)
		case i == 0 && gave < int64(len(want)-1):
			t.Errorf("the leaving node gave %d jobs by YOURJOBS, want at least %d", gave, len(want)-1)
		case i > 0 && need == 0:
			t.Errorf("node %d consumed imported jobs with no NEEDJOBS sent", i)
		}
		sent += gave
		received += got
	}
	if sent != received {
		t.Errorf("YOURJOBS: %d jobs sent, %d received, over the cluster", sent, received)
	}

	// Remove node 0: stop it, FORGET it on the others.
	pc.kill(0)
	for _, c := range pc.clients[1:] {
		if got := doStr(t, c, "CLUSTER", "FORGET", pc.ids[0]); got != "OK" {
			t.Fatalf("CLUSTER FORGET = %q", got)
		}
	}
	for i, c := range pc.clients[1:] {
		if _, ok := clusterNodes(t, c)[pc.ids[0]]; ok {
			t.Errorf("node %d still lists the forgotten node", i+1)
		}
		if n := clusterInfoField(t, c, "cluster_known_nodes"); n != "2" {
			t.Errorf("node %d: cluster_known_nodes:%s, want 2", i+1, n)
		}
	}
	// Every job was delivered; the at-most-once ones once each.
	stop()
	wg.Wait()
	for body := range want {
		n := delivered[body]
		switch {
		case n == 0:
			t.Errorf("%s never delivered", body)
		case atMostOnce[body] && n != 1:
			t.Errorf("at-most-once %s delivered %d times", body, n)
		}
	}
	for _, c := range pc.clients[1:] {
		if n := doInt(t, c, "QLEN", "drain"); n != 0 {
			t.Errorf("QLEN drain = %d on a remaining node after every job was acked", n)
		}
	}
}
