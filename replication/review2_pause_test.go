package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// TestPauseBcastRacingARemoteOneKeepsTheBookAndTheStoreTogether: PAUSE …
// BCAST applies the state to the store (Broker.Pause) and only then takes
// the book (Jobs.Paused). A versioned PAUSE from another node handled in
// between overwrites the store; Paused then records the local state, with
// a newer version, and sends it everywhere: every other node ends with
// it, but this one kept the remote state, and its book says otherwise, so
// nothing ever puts it right.
func TestPauseBcastRacingARemoteOneKeepsTheBookAndTheStoreTogether(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	if _, err := a.broker.Pause("q", storage.PauseIn); err != nil {
		t.Fatal(err)
	}
	// b's broadcast (older by a's clock) arrives between the two halves.
	remote := pauseVersion{State: storage.PauseOut, Ver: uint64(time.Now().Add(-time.Second).UnixMilli()) << 16, Origin: b.id}
	a.jobs.Handle(b.id, Message{Type: MsgPause, Payload: encodePauseVersion("q", remote)})
	a.broker.BroadcastPause("q", storage.PauseIn)
	pauseIs(t, b, "q", storage.PauseIn)
	if book := a.jobs.BroadcastPauses()["q"]; book != storage.PauseIn {
		t.Fatalf("a's book says %v", book)
	}
	if got := a.broker.PauseState("q"); got != storage.PauseIn {
		t.Fatalf("a's queue is %v while its book and every other node say %v", got, storage.PauseIn)
	}
}
