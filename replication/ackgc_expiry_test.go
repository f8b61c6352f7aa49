package replication

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// TestCollectionEndsAtTheJobsTTL: a job acked while one holder is down
// (cut off and never back): the collector's collection and a holder's
// held one would send their rounds to it until a restart. Once the job's
// TTL passes (the brokers delete their copies), both end with no message.
func TestCollectionEndsAtTheJobsTTL(t *testing.T) {
	var shift atomic.Int64
	now := func() time.Time { return time.Now().Add(time.Duration(shift.Load())) }
	c := newTestClusterClock(t, 3, -1, now)
	origin, holder, down := c.nodes[0], c.nodes[1], c.nodes[2]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000, TTL: 20})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.net.Cut(origin.id, down.id)
	c.net.Cut(holder.id, down.id)
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the holder acked its copy", func() bool { return holder.state(t, res.ID) == "acked" })
	for _, nd := range []*jobsNode{origin, holder} {
		// A holder's collection starts once its ack is durable, just
		// after the ack shows in its state.
		eventually(t, fmt.Sprintf("node %s collects the job", nd.id[:6]), func() bool {
			_, ok := nd.jobs.NextAckRetry(res.ID)
			return ok
		})
	}
	// Before the TTL the rounds go on (to the down node).
	if n := origin.jobs.RetryAcks(now().Add(4 * time.Second)); n == 0 {
		t.Fatal("the collector sent no round before the TTL")
	}
	shift.Store(int64(21 * time.Second))
	for i, nd := range []*jobsNode{origin, holder} {
		eventually(t, fmt.Sprintf("node %d deleted the expired job", i), func() bool { return nd.state(t, res.ID) == "" })
		if n := nd.jobs.RetryAcks(now()); n != 0 {
			t.Fatalf("node %d sent %d SETACKs for an expired job", i, n)
		}
		if p := nd.jobs.Stats().PendingAcks; p != 0 {
			t.Fatalf("node %d: %d collections pending after the job expired", i, p)
		}
	}
}
