package main

import (
	"flag"
	"testing"
	"time"
)

// returnHold is how long TestClusterPartitionAckAskedOnHeal keeps its
// partition after the ACKJOB.
var returnHold = flag.Duration("partition.return-hold", 8*time.Second, "how long the ack-on-heal partition lasts after the ACKJOB (at least 8s)")

// TestClusterPartitionAckAskedOnHeal: an ACKJOB on one side of a
// partition, of a job whose holders on the other side do not requeue it
// meanwhile (RETRY 300: no WILLQUEUE reaches the collector to be
// answered with a SETACK), is collected everywhere soon after the heal —
// the returning nodes are asked when their link and membership are back
// (replication/ackgc_return.go) — not at the collector's next SETACK
// round: after 8 s of partition that is 15 s after the ACKJOB (rounds at
// 0, 1, 3, 7, 15 s, ± 0.5 s each), 5 s or more after the heal. Before,
// the copies stayed until then.
func TestClusterPartitionAckAskedOnHeal(t *testing.T) {
	if *returnHold < 8*time.Second {
		t.Fatalf("-partition.return-hold %v: at least 8s, or the next round comes too soon to tell", *returnHold)
	}
	pc := startPartCluster(t, 3)
	id := addJob(t, pc.clients[0], "qheal", "heal", "REPLICATE", 3, "RETRY", 300)
	if h := pc.holders(0, id); len(h) != 3 {
		t.Fatalf("nodes-delivered = %v, want all three", h)
	}
	pc.net.Partition([]int{0}, []int{1, 2})
	if n := doInt(t, pc.clients[0], "ACKJOB", id); n != 1 {
		t.Fatalf("ACKJOB on node 0 = %d, want 1", n)
	}
	acked := time.Now()
	waitUntil(t, clusterWait+*returnHold, "the partition after the ACKJOB", func() bool { return time.Since(acked) >= *returnHold })
	for _, i := range []int{1, 2} {
		if got := pc.state(i, id); got == "" || got == "acked" {
			t.Fatalf("under the partition, node %d's copy is %q", i, got)
		}
	}
	pc.net.HealAll()
	healed := time.Now()
	// The earliest the round after the heal can come (rounds back off
	// 1 s·2^k ± 0.5 s from the ACKJOB).
	round := time.Duration(0)
	for at := time.Second; round <= *returnHold; at *= 2 {
		round += at
	}
	rounds := 0
	for at := time.Second; at <= round; at = 2*at + time.Second {
		rounds++
	}
	earliest := acked.Add(round - time.Duration(rounds)*500*time.Millisecond)
	gone := waitUntil(t, 2*clusterWait+*returnHold, "ack GC to delete every copy after the heal", func() bool {
		for i := range 3 {
			if show(t, pc.clients[i], id) != nil {
				return false
			}
		}
		return true
	})
	t.Logf("partition of %v after the ACKJOB; every copy gone %v after the heal (next round no sooner than %v after it)",
		healed.Sub(acked).Round(time.Millisecond), gone.Sub(healed).Round(time.Millisecond), earliest.Sub(healed).Round(time.Millisecond))
	if !gone.Before(earliest) {
		t.Fatalf("the copies went %v after the heal, at or after the next SETACK round (%v): the returning nodes were not asked",
			gone.Sub(healed).Round(time.Millisecond), earliest.Sub(healed).Round(time.Millisecond))
	}
}
