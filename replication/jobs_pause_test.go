package replication

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/diskque/diskque/storage"
)

// bcastPause is PAUSE name state BCAST on nd.
func bcastPause(t *testing.T, nd *jobsNode, name string, p storage.PauseState) {
	t.Helper()
	if _, err := nd.broker.Pause(name, p); err != nil {
		t.Fatal(err)
	}
	nd.broker.BroadcastPause(name, p)
}

func pauseIs(t *testing.T, nd *jobsNode, name string, want storage.PauseState) {
	t.Helper()
	eventually(t, "node "+nd.id[:6]+" paused "+want.String(), func() bool { return nd.broker.PauseState(name) == want })
}

// TestPauseBcastReachesANodeThatWasDown: a PAUSE … BCAST while one node
// is down (and cut off) reaches it once it is reachable again, from the
// node that broadcast it. Before, the broadcast was sent once and the node
// kept its old state for ever.
func TestPauseBcastReachesANodeThatWasDown(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a, b, down := c.nodes[0], c.nodes[1], c.nodes[2]
	c.setDown(down.id, true)
	c.net.Cut(a.id, down.id)
	c.net.Cut(b.id, down.id)
	bcastPause(t, a, "q", storage.PauseIn)
	pauseIs(t, b, "q", storage.PauseIn)
	a.jobs.syncPauses() // down is not reachable: nothing for it
	if got := down.broker.PauseState("q"); got != storage.PauseNone {
		t.Fatalf("the down node's state %v before it came back", got)
	}
	c.setDown(down.id, false)
	c.net.Heal(a.id, down.id)
	c.net.Heal(b.id, down.id)
	if n := a.jobs.syncPauses(); n != 1 {
		t.Fatalf("syncPauses sent %d PAUSEs, want the one state to the node back", n)
	}
	pauseIs(t, down, "q", storage.PauseIn)
	if n := a.jobs.syncPauses(); n != 0 {
		t.Fatalf("syncPauses sent %d PAUSEs again with nobody new", n)
	}
}

// TestPauseBcastLastWriterWins: two conflicting broadcasts; every node
// ends with the later one, whatever the order the messages arrive in: an
// older PAUSE arriving late changes nothing.
func TestPauseBcastLastWriterWins(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	a, b, late := c.nodes[0], c.nodes[1], c.nodes[2]
	c.net.Cut(a.id, late.id)
	bcastPause(t, a, "q", storage.PauseIn)
	pauseIs(t, b, "q", storage.PauseIn)
	a.jobs.pauses.mu.Lock()
	older := a.jobs.pauses.states["q"]
	a.jobs.pauses.mu.Unlock()
	bcastPause(t, b, "q", storage.PauseOut)
	for _, nd := range c.nodes {
		pauseIs(t, nd, "q", storage.PauseOut)
	}
	// a's broadcast, delayed, reaches the late node after b's.
	late.jobs.Handle(a.id, Message{Type: MsgPause, Payload: encodePauseVersion("q", older)})
	if got := late.broker.PauseState("q"); got != storage.PauseOut {
		t.Fatalf("an older broadcast won: %v", got)
	}
	// The reconnection sends a's book, which now holds b's state.
	c.net.Heal(a.id, late.id)
	a.jobs.syncPauses()
	for _, nd := range c.nodes {
		if got := nd.jobs.BroadcastPauses()["q"]; got != storage.PauseOut {
			t.Fatalf("node %s's book says %v", nd.id[:6], got)
		}
		pauseIs(t, nd, "q", storage.PauseOut)
	}
}

// TestPauseBcastVersionSurvivesRestart: the node that broadcast a state
// restarts before a down node comes back; it still sends it (the book is
// in its data directory) — and a damaged book starts empty, not a failure.
func TestPauseBcastVersionSurvivesRestart(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, down := c.nodes[0], c.nodes[1]
	c.setDown(down.id, true)
	c.net.Cut(a.id, down.id)
	bcastPause(t, a, "q", storage.PauseAll)
	c.close(a)
	c.open(a)
	c.setDown(down.id, false)
	c.net.Heal(a.id, down.id)
	if n := a.jobs.syncPauses(); n != 1 {
		t.Fatalf("after a restart syncPauses sent %d PAUSEs, want 1", n)
	}
	pauseIs(t, down, "q", storage.PauseAll)

	c.close(a)
	if err := os.WriteFile(filepath.Join(a.dir, PausesFileName), []byte("DQP1garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.open(a)
	if got := a.jobs.BroadcastPauses(); len(got) != 0 {
		t.Fatalf("a damaged book read as %v", got)
	}
	if got := a.broker.PauseState("q"); got != storage.PauseAll {
		t.Fatalf("the store's pause state after a damaged book: %v", got)
	}
}

// TestPauseCodec: both PAUSE forms decode, and bad input is refused.
func TestPauseCodec(t *testing.T) {
	origin := "0123456789abcdef0123456789abcdef01234567"
	v := pauseVersion{State: storage.PauseOut, Ver: 42 << 16, Origin: origin}
	name, got, versioned, err := decodePauseVersion(encodePauseVersion("q", v))
	if err != nil || !versioned || name != "q" || got != v {
		t.Fatalf("versioned: %q %+v %v %v", name, got, versioned, err)
	}
	name, got, versioned, err = decodePauseVersion(encodePause("q", storage.PauseIn))
	if err != nil || versioned || name != "q" || got.State != storage.PauseIn {
		t.Fatalf("unversioned: %q %+v %v %v", name, got, versioned, err)
	}
	bad := encodePauseVersion("q", pauseVersion{State: storage.PauseIn, Ver: 1, Origin: "nope"})
	if _, _, _, err := decodePauseVersion(bad); err == nil {
		t.Fatal("a bad origin id decoded")
	}
	states := map[string]pauseVersion{"q": v, "r": {State: storage.PauseNone, Ver: 7, Origin: origin}}
	back, err := decodePauses(encodePauses(states))
	if err != nil || len(back) != 2 || back["q"] != v {
		t.Fatalf("book: %v %v", back, err)
	}
	b := encodePauses(states)
	b[6] ^= 1
	if _, err := decodePauses(b); err == nil {
		t.Fatal("a damaged book decoded")
	}
}
