package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// bookLen is how many entries nd's pause book holds.
func bookLen(nd *jobsNode) int { return len(nd.jobs.BroadcastPauses()) }

// heardBy reports whether every other node told origin it holds its entry
// for name.
func heardBy(c *testCluster, origin *jobsNode, name string) bool {
	pb := &origin.jobs.pauses
	pb.mu.Lock()
	defer pb.mu.Unlock()
	for _, nd := range c.nodes {
		if nd != origin && !pb.has[name][nd.id] {
			return false
		}
	}
	return true
}

// TestPauseBookForgetsAQueueUnpausedEverywhere: a queue paused and then
// unpaused by broadcast leaves an entry in every node's book; once every
// node holds the unpaused state and it is pauseForgetAge old, its origin
// drops it and so does every other node. Before, the book never dropped
// an entry: it grew with every queue ever broadcast. A paused queue's
// entry stays, however old.
func TestPauseBookForgetsAQueueUnpausedEverywhere(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a := c.nodes[0]
	bcastPause(t, a, "q", storage.PauseIn)
	bcastPause(t, a, "kept", storage.PauseOut)
	bcastPause(t, a, "q", storage.PauseNone)
	for _, nd := range c.nodes {
		pauseIs(t, nd, "q", storage.PauseNone)
		pauseIs(t, nd, "kept", storage.PauseOut)
	}
	eventually(t, "every node heard of both states", func() bool { return heardBy(c, a, "q") && heardBy(c, a, "kept") })
	if n := a.jobs.forgetPauses(time.Now()); n != 0 {
		t.Fatalf("forgot %d entries before they were %v old", n, pauseForgetAge)
	}
	if n := a.jobs.forgetPauses(time.Now().Add(pauseForgetAge + time.Second)); n != 1 {
		t.Fatalf("forgot %d entries, want the unpaused queue's", n)
	}
	for _, nd := range c.nodes {
		eventually(t, "node "+nd.id[:6]+" forgot q", func() bool { return bookLen(nd) == 1 })
		if got := nd.jobs.BroadcastPauses()["kept"]; got != storage.PauseOut {
			t.Fatalf("node %s's book lost the paused queue: %v", nd.id[:6], got)
		}
	}
	if n := a.jobs.forgetPauses(time.Now().Add(time.Hour)); n != 0 {
		t.Fatalf("forgot %d more entries, want none: the paused queue stays", n)
	}
}

// TestPauseBookKeepsAnEntryWhileANodeIsDown: a node down when the queue
// was unpaused may hold the older paused state: the entry is not forgotten
// while it has not heard, and once it is back it converges to unpaused,
// and only then is the entry forgotten. Forgotten before, the down node's
// older state would have come back everywhere (a node with no entry takes
// any version).
func TestPauseBookKeepsAnEntryWhileANodeIsDown(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a, b, down := c.nodes[0], c.nodes[1], c.nodes[2]
	bcastPause(t, a, "q", storage.PauseIn)
	pauseIs(t, down, "q", storage.PauseIn)
	c.setDown(down.id, true)
	c.net.Cut(a.id, down.id)
	c.net.Cut(b.id, down.id)
	bcastPause(t, a, "q", storage.PauseNone)
	pauseIs(t, b, "q", storage.PauseNone)
	later := time.Now().Add(pauseForgetAge + time.Second)
	if n := a.jobs.forgetPauses(later); n != 0 {
		t.Fatalf("forgot %d entries while a node that holds an older state is down", n)
	}
	c.setDown(down.id, false)
	c.net.Heal(a.id, down.id)
	c.net.Heal(b.id, down.id)
	// b's reconnection sends down what it has; down sends a and b its
	// older state, which changes nothing.
	down.jobs.syncPauses()
	b.jobs.syncPauses()
	pauseIs(t, down, "q", storage.PauseNone)
	eventually(t, "the node back heard of the unpaused state", func() bool { return heardBy(c, a, "q") })
	if n := a.jobs.forgetPauses(later); n != 1 {
		t.Fatalf("forgot %d entries once every node held the unpaused state, want 1", n)
	}
	for _, nd := range c.nodes {
		eventually(t, "node "+nd.id[:6]+" forgot q", func() bool { return bookLen(nd) == 0 })
		pauseIs(t, nd, "q", storage.PauseNone)
	}
}

// TestPauseBookForgetMissedIsSentAgain: a node whose PAUSEFORGET was lost
// keeps the entry and sends it at its next reconnection: the node that
// takes it again and the origin both get it forgotten again, so no entry
// lingers and no state changes.
func TestPauseBookForgetMissedIsSentAgain(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a, b, laggard := c.nodes[0], c.nodes[1], c.nodes[2]
	bcastPause(t, a, "q", storage.PauseIn)
	bcastPause(t, a, "q", storage.PauseNone)
	pauseIs(t, laggard, "q", storage.PauseNone)
	eventually(t, "every node heard", func() bool { return heardBy(c, a, "q") })
	c.mu.Lock()
	c.lose = func(dst, _ string, m Message) bool { return dst == laggard.id && m.Type == MsgPauseForget }
	c.mu.Unlock()
	if n := a.jobs.forgetPauses(time.Now().Add(pauseForgetAge + time.Second)); n != 1 {
		t.Fatalf("forgot %d entries, want 1", n)
	}
	eventually(t, "b forgot q", func() bool { return bookLen(b) == 0 })
	if bookLen(laggard) != 1 {
		t.Fatal("the laggard's PAUSEFORGET was to be lost")
	}
	c.mu.Lock()
	c.lose = nil
	c.mu.Unlock()
	// The laggard's links come back: it sends its book to both.
	c.net.Cut(laggard.id, a.id)
	c.net.Cut(laggard.id, b.id)
	laggard.jobs.syncPauses()
	c.net.Heal(laggard.id, a.id)
	c.net.Heal(laggard.id, b.id)
	eventually(t, "the laggard's links", func() bool {
		return laggard.tr.Connected(a.id) && laggard.tr.Connected(b.id)
	})
	if n := laggard.jobs.syncPauses(); n != 2 {
		t.Fatalf("the laggard sent %d PAUSEs, want its entry to each node", n)
	}
	for _, nd := range c.nodes {
		eventually(t, "node "+nd.id[:6]+" has no entry", func() bool { return bookLen(nd) == 0 })
		pauseIs(t, nd, "q", storage.PauseNone)
	}
}
