package main

// Two cluster messages that Disque sends once, made to reach a node that
// was SIGKILLed when they went: FASTACK's deletion (retried until each
// holder answered) and PAUSE … BCAST (sent again to a node that is back).

import (
	"strconv"
	"testing"
)

// killAndWaitFailed SIGKILLs node i and waits until the others no longer
// reach it; it returns node from's count of dropped bus messages then.
func killAndWaitFailed(pc *procCluster, i, from int) int {
	pc.t.Helper()
	pc.kill(i)
	var live = pc.clients[:0:0]
	for k, c := range pc.clients {
		if k != i {
			live = append(live, c)
		}
	}
	waitReachable(pc.t, clusterWait, len(pc.clients)-2, live...)
	return droppedBus(pc, from)
}

func droppedBus(pc *procCluster, i int) int {
	pc.t.Helper()
	n, err := strconv.Atoi(info(pc.t, pc.clients[i], "cluster")["cluster_bus_messages_dropped"])
	if err != nil {
		pc.t.Fatal(err)
	}
	return n
}

// waitDropped waits until node i has dropped more bus messages than
// before: what it sent the dead node is gone, not waiting in a queue for
// its return.
func waitDropped(pc *procCluster, i, before int) {
	pc.t.Helper()
	waitUntil(pc.t, clusterWait, "the message to the dead node dropped", func() bool { return droppedBus(pc, i) > before })
}

// TestClusterProcessesFastAckReachesAKilledHolder: FASTACK on the origin
// while one holder is SIGKILLed; that holder comes back from its AOF with
// the copy, and the origin's retried deletion removes it (before, the copy
// stayed, to be requeued at its RETRY and delivered again).
func TestClusterProcessesFastAckReachesAKilledHolder(t *testing.T) {
	pc := startProcCluster(t, 3)
	id := addJob(t, pc.clients[0], "qf", "b", "REPLICATE", 3, "RETRY", 60)
	dropped := killAndWaitFailed(pc, 2, 0)
	if n := doInt(t, pc.clients[0], "FASTACK", id); n != 1 {
		t.Fatalf("FASTACK = %d, want 1", n)
	}
	waitDropped(pc, 0, dropped)
	pc.waitGone(id, []int{1})
	if got := pc.state(0, id); got != "acked" && got != "" {
		t.Fatalf("the origin's job after FASTACK: %q, want its acked placeholder (or gone)", got)
	}
	pc.restart(2)
	pc.waitMesh()
	pc.waitGone(id, all(3))
}

// TestClusterProcessesPauseBcastReachesAKilledNode: PAUSE … BCAST while a
// node is SIGKILLed; once it is back, it has the broadcast state.
func TestClusterProcessesPauseBcastReachesAKilledNode(t *testing.T) {
	pc := startProcCluster(t, 3)
	dropped := killAndWaitFailed(pc, 2, 0)
	if got := doStr(t, pc.clients[0], "PAUSE", "qp", "in", "bcast"); got != "in" {
		t.Fatalf("PAUSE qp in bcast = %q", got)
	}
	waitDropped(pc, 0, dropped)
	waitUntil(t, clusterWait, "node 1 paused in", func() bool { return doStr(t, pc.clients[1], "PAUSE", "qp", "state") == "in" })
	pc.restart(2)
	waitUntil(t, clusterWait, "node 2, back, paused in", func() bool { return doStr(t, pc.clients[2], "PAUSE", "qp", "state") == "in" })
}
