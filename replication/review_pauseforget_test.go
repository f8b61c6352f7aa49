package replication

import (
	"slices"
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// TestPauseForgetAnswerUnpausesALaggardsOlderState: a node down and
// forgotten (CLUSTER FORGET) while a queue it holds paused is unpaused
// by broadcast does not hold the origin's forget back; the entry is
// forgotten everywhere. Back (met again), its book sends the older
// paused state: the node with no entry takes it, and the origin answers
// PAUSEFORGET to both. A PAUSEFORGET that finds a paused entry means a
// newer, unpaused state was forgotten (only those are): the queue must
// end unpaused on every node. Before, the entry went and the paused state
// stayed on the node that took it and on the one back, for ever (before
// the book was bounded, the unpaused entry would have won).
func TestPauseForgetAnswerUnpausesALaggardsOlderState(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a, b, lag := c.nodes[0], c.nodes[1], c.nodes[2]
	bcastPause(t, a, "q", storage.PauseIn)
	pauseIs(t, lag, "q", storage.PauseIn)
	eventually(t, "lag's entry", func() bool { return bookLen(lag) == 1 })
	c.setDown(lag.id, true)
	c.net.Cut(a.id, lag.id)
	c.net.Cut(b.id, lag.id)
	// CLUSTER FORGET lag on a and b.
	c.mu.Lock()
	all := append([]string(nil), c.ids...)
	c.ids = slices.DeleteFunc(append([]string(nil), c.ids...), func(id string) bool { return id == lag.id })
	c.mu.Unlock()
	bcastPause(t, a, "q", storage.PauseNone)
	pauseIs(t, b, "q", storage.PauseNone)
	eventually(t, "b heard of the unpaused state", func() bool {
		return heardBy(c, a, "q") || func() bool {
			pb := &a.jobs.pauses
			pb.mu.Lock()
			defer pb.mu.Unlock()
			return pb.has["q"][b.id]
		}()
	})
	if n := a.jobs.forgetPauses(time.Now().Add(pauseForgetAge + time.Second)); n != 1 {
		t.Fatalf("forgot %d entries, want 1", n)
	}
	eventually(t, "b forgot q", func() bool { return bookLen(b) == 0 })
	// lag meets the cluster again: its book goes to both.
	c.mu.Lock()
	c.ids = all
	c.mu.Unlock()
	c.setDown(lag.id, false)
	c.net.Heal(a.id, lag.id)
	c.net.Heal(b.id, lag.id)
	eventually(t, "lag's links", func() bool { return lag.tr.Connected(a.id) && lag.tr.Connected(b.id) })
	if n := lag.jobs.syncPauses(); n != 2 {
		t.Fatalf("lag sent %d PAUSEs, want its entry to each node", n)
	}
	for _, nd := range c.nodes {
		eventually(t, "node "+nd.id[:6]+" has no entry", func() bool { return bookLen(nd) == 0 })
		pauseIs(t, nd, "q", storage.PauseNone)
	}
}
