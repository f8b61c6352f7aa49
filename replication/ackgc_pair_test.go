package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// otherHolder returns the node other than origin that holds job id.
func otherHolder(t *testing.T, c *testCluster, origin *jobsNode, id string) *jobsNode {
	t.Helper()
	for _, nd := range c.nodes {
		if nd != origin && nd.state(t, id) != "" {
			return nd
		}
	}
	t.Fatalf("no other node holds %s", id)
	return nil
}

// TestTwoCopyHolderDeletesAtSetAck: a REPLICATE 2 job's other holder
// deletes its copy at the SETACK (both know the same two holders), and
// the collector finishes with no DELJOB; a REPLICATE 3 job still gets its
// DELJOBs. Before, the holder acked, waited for the DELJOB and deleted
// then: one DELJOB per holder.
func TestTwoCopyHolderDeletesAtSetAck(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	two := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
	if two.Err != nil {
		t.Fatal(two.Err)
	}
	holder := otherHolder(t, c, origin, two.ID)
	if _, err := origin.broker.Ack([]string{two.ID}); err != nil {
		t.Fatal(err)
	}
	noTrace(t, c, two.ID)
	if s := origin.jobs.Stats(); s.DelJobsSent != 0 || s.GotAcksReceived != 1 {
		t.Fatalf("collector: %d DELJOBs sent, %d GOTACKs received; want 0 and 1", s.DelJobsSent, s.GotAcksReceived)
	}
	if s := holder.jobs.Stats(); s.SetAcksSent != 0 || s.DelJobsSent != 0 {
		t.Fatalf("holder sent %d SETACKs and %d DELJOBs, want none", s.SetAcksSent, s.DelJobsSent)
	}

	three := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if three.Err != nil {
		t.Fatal(three.Err)
	}
	if _, err := origin.broker.Ack([]string{three.ID}); err != nil {
		t.Fatal(err)
	}
	noTrace(t, c, three.ID)
	if s := origin.jobs.Stats(); s.DelJobsSent != 2 {
		t.Fatalf("a three-copy job's collection sent %d DELJOBs, want one per holder (2)", s.DelJobsSent)
	}
}

// TestTwoCopyLostGotAckAfterDelete: the holder deleted its copy at the
// SETACK but its GOTACK is lost (as with a crash right after the
// delete): the collector's next round finds no job there, which leaves a
// dummy ack answered "not known"; the collector finishes and its DELJOB
// clears the dummy. Nothing is left anywhere and nothing was requeued.
func TestTwoCopyLostGotAckAfterDelete(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	origin, holder := c.nodes[0], c.nodes[1]
	res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	c.mu.Lock()
	lostOne := false
	c.lose = func(to, _ string, m Message) bool {
		if to == origin.id && m.Type == MsgGotAck && !lostOne {
			lostOne = true
			return true
		}
		return false
	}
	c.mu.Unlock()
	acked := time.Now()
	if _, err := origin.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the holder's copy deleted at the SETACK", func() bool { return holder.state(t, res.ID) == "" })
	if got := origin.state(t, res.ID); got != "acked" {
		t.Fatalf("collector: %q, want acked (its GOTACK was lost)", got)
	}
	if n := origin.jobs.RetryAcks(acked.Add(2 * time.Second)); n != 1 {
		t.Fatalf("the next round sent %d SETACKs, want 1", n)
	}
	noTrace(t, c, res.ID)
	if s := origin.jobs.Stats(); s.DelJobsSent != 1 {
		t.Fatalf("collector sent %d DELJOBs, want 1 (clearing the dummy ack)", s.DelJobsSent)
	}
}
