package main

// GLOBALQLEN and ADDJOB … QUEUE-RANDOMLY (Disque's commands from after 1.0;
// COMPATIBILITY.md) across real diskque-server processes on 127.0.0.1,
// one of them SIGKILLed.

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestClusterProcessesGlobalQLen: GLOBALQLEN on any node is the queue's
// length summed over the cluster, a QUEUE-RANDOMLY job included (queued
// on another node, not on the one that took it); with a node killed it
// still answers within its timeout, the dead node's jobs left out.
func TestClusterProcessesGlobalQLen(t *testing.T) {
	pc := startProcCluster(t, 3)
	counts := []int64{1, 2, 3} // jobs of gq queued on each node
	for i, n := range counts {
		for range n {
			addJob(t, pc.clients[i], "gq", "body", "REPLICATE", 1)
		}
	}
	addJob(t, pc.clients[0], "other", "body", "REPLICATE", 1)
	for i := range pc.clients {
		if got := doInt(t, pc.clients[i], "GLOBALQLEN", "gq"); got != 6 {
			t.Fatalf("GLOBALQLEN gq on node %d = %d, want 6", i, got)
		}
	}
	// INFO cluster counts the requests as the other bus requests: each
	// node asked the 2 others once, and both answered.
	for i := range pc.clients {
		in := info(t, pc.clients[i], "cluster")
		if in["cluster_queuelens_sent"] != "2" || in["cluster_queuelen_answers_received"] != "2" {
			t.Fatalf("INFO cluster on node %d: queuelens_sent %q, queuelen_answers_received %q, want 2 and 2",
				i, in["cluster_queuelens_sent"], in["cluster_queuelen_answers_received"])
		}
	}

	id := addJob(t, pc.clients[0], "gq", "random", "REPLICATE", 2, "QUEUE-RANDOMLY")
	if got := doInt(t, pc.clients[0], "QLEN", "gq"); got != 1 {
		t.Fatalf("QLEN on the node that took the QUEUE-RANDOMLY job = %d, want still 1", got)
	}
	if pc.state(0, id) != "" {
		t.Fatalf("the node that took the QUEUE-RANDOMLY job holds a copy (%s)", pc.state(0, id))
	}
	waitUntil(t, clusterWait, "GLOBALQLEN 7 once the QUEUE-RANDOMLY job is queued elsewhere", func() bool {
		return doInt(t, pc.clients[0], "GLOBALQLEN", "gq") == 7
	})
	queuer := -1
	for _, i := range []int{1, 2} {
		if pc.state(i, id) == "queued" {
			queuer = i
		}
	}
	if queuer < 0 {
		t.Fatal("no other node has the QUEUE-RANDOMLY job queued")
	}

	// A node stopped (SIGSTOP: its links stay up, it answers nothing) is
	// left out once the timeout passes: nodes 0 and 1's jobs, and the
	// QUEUE-RANDOMLY one if node 1 queued it.
	stopped := pc.nodes[2].proc.cmd.Process
	if err := stopped.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill(2) returns before every thread has stopped (CI: node 2 still
	// answered once): wait until the kernel says the process is stopped.
	waitUntil(t, clusterWait, "node 2 stopped", func() bool {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", stopped.Pid))
		if err != nil {
			return false
		}
		_, after, ok := strings.Cut(string(b), ") ")
		return ok && strings.HasPrefix(after, "T")
	})
	start := time.Now()
	got := doInt(t, pc.clients[0], "GLOBALQLEN", "gq")
	el := time.Since(start)
	if err := stopped.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wantStopped := counts[0] + counts[1]
	if queuer == 1 {
		wantStopped++
	}
	if got != wantStopped || el > 5*time.Second {
		t.Fatalf("GLOBALQLEN with node 2 stopped = %d after %v, want %d within the timeout", got, el, wantStopped)
	}
	t.Logf("GLOBALQLEN with node 2 stopped: %d after %v", got, el)
	waitUntil(t, clusterWait, "GLOBALQLEN 7 again once node 2 runs", func() bool {
		return doInt(t, pc.clients[0], "GLOBALQLEN", "gq") == 7
	})

	// Kill the node that queued it: every GLOBALQLEN still answers within
	// its timeout (1 s) plus slack, and soon without the dead node.
	pc.kill(queuer)
	live := 3 - queuer // the other one of nodes 1 and 2
	want := counts[0] + counts[live]
	waitUntil(t, clusterWait, "GLOBALQLEN without the killed node", func() bool {
		start := time.Now()
		got := doInt(t, pc.clients[0], "GLOBALQLEN", "gq")
		if el := time.Since(start); el > 5*time.Second {
			t.Fatalf("GLOBALQLEN took %v with a node killed", el)
		}
		return got == want
	})
}
