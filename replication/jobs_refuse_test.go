package replication

import (
	"errors"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

// setRefusing makes node id refuse copies (JobsConfig.RefuseCopies) for
// why, or take them again for "".
func (c *testCluster) setRefusing(id, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.refusing == nil {
		c.refusing = map[string]string{}
	}
	c.refusing[id] = why
}

// A node that refuses copies (leaving, short of memory or disk) stores no
// REPLJOB and answers no GOTJOB: REPLICATE 2 jobs all land on the node
// that takes them, and a REPLICATE 3 job, which needs the refusing node
// too, fails at its timeout with no copy there.
func TestRefusingNodeTakesNoCopies(t *testing.T) {
	c := newTestCluster(t, 3, 100*time.Millisecond)
	origin, taker, refuser := c.nodes[0], c.nodes[1], c.nodes[2]
	c.setRefusing(refuser.id, "leaving")

	var ids []string
	for range 20 {
		res := addJob(t, origin, queue.AddRequest{Replicate: 2, Timeout: 5000})
		if res.Err != nil {
			t.Fatalf("ADDJOB REPLICATE 2 with one node refusing: %v", res.Err)
		}
		ids = append(ids, res.ID)
	}
	for _, id := range ids {
		if got := taker.state(t, id); got != "active" {
			t.Errorf("job %s on the node that takes copies: %q, want active", id, got)
		}
		if got := refuser.state(t, id); got != "" {
			t.Errorf("job %s on the refusing node: %q, want no copy", id, got)
		}
	}

	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 300})
	if !errors.Is(res.Err, queue.ErrReplTimeout) {
		t.Fatalf("ADDJOB REPLICATE 3 needing the refusing node: %v, want ErrReplTimeout", res.Err)
	}
	if got := refuser.state(t, res.ID); got != "" {
		t.Errorf("timed-out job on the refusing node: %q, want no copy", got)
	}
	if n := refuser.jobs.Stats().CopiesRefused; n == 0 {
		t.Error("CopiesRefused is 0 on the refusing node")
	}

	// Taking copies again, it gets them.
	c.setRefusing(refuser.id, "")
	res = addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 5000})
	if res.Err != nil {
		t.Fatalf("ADDJOB REPLICATE 3 once every node takes copies: %v", res.Err)
	}
	if got := refuser.state(t, res.ID); got != "active" {
		t.Errorf("job on the node taking copies again: %q, want active", got)
	}
}
