package replication

import (
	"errors"
	"slices"
	"testing"

	"github.com/diskque/diskque/queue"
)

func TestRoundTripHistogram(t *testing.T) {
	var h rttHistogram
	if q := h.quantile(0.99); q != 0 {
		t.Fatalf("empty p99 = %d", q)
	}
	for range 990 {
		h.observe(1)
	}
	for range 10 {
		h.observe(100)
	}
	if q := h.quantile(0.99); q != 1 {
		t.Fatalf("p99 of 990×1 ms and 10×100 ms = %d, want 1", q)
	}
	for range 20 {
		h.observe(100)
	}
	if q := h.quantile(0.99); q != 128 {
		t.Fatalf("p99 with 3%% at 100 ms = %d, want 128 (its bucket's bound)", q)
	}
	h.observe(10_000_000)
	h.observe(-5)
	// Bounded: a flood of samples keeps the total under the decay mark.
	for range 2 * rttDecayAt {
		h.observe(3)
	}
	if tot := h.total.Load(); tot >= rttDecayAt {
		t.Fatalf("total %d after decay", tot)
	}
	if q := h.quantile(0.99); q != 3 {
		t.Fatalf("p99 after a flood of 3 ms = %d", q)
	}
}

// TestNodesConfirmed: SHOW's nodes-confirmed is, during a synchronous
// replication, the origin and the nodes that answered GOTJOB; during the
// ack's collection, the origin and those that answered GOTACK; otherwise
// empty (Disque's job.c and ack.c).
func TestNodesConfirmed(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, ok, cut := c.nodes[0], c.nodes[1], c.nodes[2]
	c.net.Cut(origin.id, cut.id)
	done := make(chan queue.AddResult, 1)
	go func() { done <- addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 2000}) }()
	eventually(t, "the copy on node 1", func() bool { return ok.st.Stats().Jobs == 1 })
	id := holderIDs(t, ok)[0]
	want := []string{origin.id, ok.id}
	eventually(t, "nodes-confirmed during the replication", func() bool {
		return slices.Equal(origin.jobs.NodesConfirmed(id), want)
	})
	if res := <-done; !errors.Is(res.Err, queue.ErrReplTimeout) {
		t.Fatalf("err %v", res.Err)
	}
	// A job replicated: nothing pending, nothing shown.
	c.net.Heal(origin.id, cut.id)
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if got := origin.jobs.NodesConfirmed(res.ID); len(got) != 0 {
		t.Fatalf("nodes-confirmed of a replicated job: %v", got)
	}
	if origin.jobs.RoundTripP99Millis() <= 0 && origin.jobs.rtt.total.Load() == 0 {
		t.Fatal("no round trip recorded")
	}
	c.net.Cut(origin.id, cut.id)
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "nodes-confirmed during the ack's collection", func() bool {
		return slices.Equal(origin.jobs.NodesConfirmed(res.ID), want)
	})
}
