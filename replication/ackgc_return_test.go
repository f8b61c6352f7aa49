package replication

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// manualClock is a clock the test moves (every node's, broker and Jobs).
type manualClock struct{ ms atomic.Int64 }

func newManualClock() *manualClock {
	c := &manualClock{}
	c.ms.Store(time.Now().UnixMilli())
	return c
}
func (c *manualClock) Now() time.Time { return time.UnixMilli(c.ms.Load()) }
func (c *manualClock) advance(d time.Duration) time.Time {
	return time.UnixMilli(c.ms.Add(d.Milliseconds()))
}

// partitionAfterAck adds a REPLICATE 3 job on node 0, cuts node 0 from
// the others, acks it there and lets its SETACK rounds back off for
// about 20 s of the test's clock. It returns the job's id.
func partitionAfterAck(t *testing.T, c *testCluster, clk *manualClock) string {
	t.Helper()
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	origin.jobs.AskReturning(clk.Now()) // every peer up
	c.net.Cut(origin.id, c.nodes[1].id)
	c.net.Cut(origin.id, c.nodes[2].id)
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		now := clk.advance(time.Second)
		origin.jobs.AskReturning(now)
		origin.jobs.RetryAcks(now)
	}
	for _, nd := range c.nodes[1:] {
		if got := nd.state(t, res.ID); got == "" || got == "acked" {
			t.Fatalf("under the partition node %s's copy is %q", nd.id[:6], got)
		}
	}
	return res.ID
}

// TestReturningNodeAskedAtOnce: after a partition of 20 s the collector's
// next round is up to 16 s away; the node that comes back is asked at the
// heal, and the job's copies are gone with no round run. Before, nothing
// asked it until that round.
func TestReturningNodeAskedAtOnce(t *testing.T) {
	clk := newManualClock()
	c := newTestClusterClock(t, 3, -1, clk.Now)
	origin := c.nodes[0]
	id := partitionAfterAck(t, c, clk)
	next, ok := origin.jobs.NextAckRetry(id)
	if !ok {
		t.Fatal("the collection ended under the partition")
	}
	c.net.Heal(origin.id, c.nodes[1].id)
	c.net.Heal(origin.id, c.nodes[2].id)
	healed := clk.Now()
	if d := next.Sub(healed); d < 2*time.Second {
		t.Fatalf("next round %v after the heal: the test needs a longer backoff", d)
	}
	if n := origin.jobs.RetryAcks(healed); n != 0 {
		t.Fatalf("a round of %d SETACKs ran at the heal: nothing to compare with", n)
	}
	if n := origin.jobs.AskReturning(healed); n != 2 {
		t.Fatalf("AskReturning sent %d SETACKs at the heal, want one to each returning node", n)
	}
	noTrace(t, c, id) // GOTACK, DELJOB: no clock needed
	if s := origin.jobs.Stats(); s.ReturnAsks != 2 {
		t.Fatalf("ReturnAsks = %d, want 2", s.ReturnAsks)
	}
}

// TestReturningNodeAskBounded: a node that comes back is asked alone —
// the collection's schedule, and so the other targets' backoff, stays —
// and a link that flaps is asked at most once per returnGap.
func TestReturningNodeAskBounded(t *testing.T) {
	clk := newManualClock()
	c := newTestClusterClock(t, 3, -1, clk.Now)
	origin, back, still := c.nodes[0], c.nodes[1], c.nodes[2]
	id := partitionAfterAck(t, c, clk)
	next, _ := origin.jobs.NextAckRetry(id)

	c.net.Heal(origin.id, back.id)
	if n := origin.jobs.AskReturning(clk.Now()); n != 1 {
		t.Fatalf("AskReturning sent %d SETACKs, want 1 (the node back only)", n)
	}
	eventually(t, "the returning node acked", func() bool { return back.state(t, id) == "acked" })
	eventually(t, "its GOTACK recorded", func() bool { return origin.jobs.Stats().GotAcksReceived == 1 })
	if got, _ := origin.jobs.NextAckRetry(id); !got.Equal(next) {
		t.Fatalf("the collection's next round moved from %v to %v", next, got)
	}
	if got := still.state(t, id); got == "" || got == "acked" {
		t.Fatalf("the node still cut off has %q", got)
	}

	// The link flaps: down, up again within returnGap: not asked again.
	c.net.Cut(origin.id, back.id)
	origin.jobs.AskReturning(clk.advance(time.Second))
	c.net.Heal(origin.id, back.id)
	if n := origin.jobs.AskReturning(clk.advance(time.Second)); n != 0 {
		t.Fatalf("a flapping link was asked again within returnGap: %d SETACKs", n)
	}

	// The other node comes back: the job is finished everywhere.
	c.net.Heal(origin.id, still.id)
	if n := origin.jobs.AskReturning(clk.advance(time.Second)); n != 1 {
		t.Fatalf("AskReturning sent %d SETACKs to the last node back, want 1", n)
	}
	noTrace(t, c, id)
}

// TestReturningNodeAskedSoonAfterItWasFirstSeen: the ask's rate limit
// (returnGap, 10 s) counts asks that sent something. The first sighting
// of a peer, when the cluster forms, asks nothing; when it counted, a
// partition healed within 10 s of it left the returning nodes to the
// collection's next round (CI: TestClusterPartitionAckAskedOnHeal, whose
// heal came 8.9 s after the nodes started, waited 6 s for it).
func TestReturningNodeAskedSoonAfterItWasFirstSeen(t *testing.T) {
	clk := newManualClock()
	c := newTestClusterClock(t, 3, -1, clk.Now)
	origin := c.nodes[0]
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	seen := clk.Now()
	origin.jobs.AskReturning(seen) // every peer up: the first sighting
	c.net.Cut(origin.id, c.nodes[1].id)
	c.net.Cut(origin.id, c.nodes[2].id)
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	// Two more rounds (1 s and 3 s after the ACKJOB, ± 0.5 s): the next
	// is then 4 s ± 0.5 s away, and the heal well within returnGap of
	// the first sighting.
	for rounds := 0; rounds < 2; {
		now := clk.advance(time.Second)
		origin.jobs.AskReturning(now)
		if origin.jobs.RetryAcks(now) > 0 {
			rounds++
		}
	}
	c.net.Heal(origin.id, c.nodes[1].id)
	c.net.Heal(origin.id, c.nodes[2].id)
	healed := clk.Now()
	if d := healed.Sub(seen); d >= returnGap {
		t.Fatalf("healed %v after the first sighting: the test needs it within returnGap", d)
	}
	if next, ok := origin.jobs.NextAckRetry(res.ID); !ok || next.Sub(healed) < 2*time.Second {
		t.Fatalf("next round %v after the heal (%v): the test needs a round further away", next.Sub(healed), ok)
	}
	if n := origin.jobs.AskReturning(healed); n != 2 {
		t.Fatalf("AskReturning sent %d SETACKs %v after the peers were first seen, want one to each returning node", n, healed.Sub(seen))
	}
	noTrace(t, c, res.ID)
}
