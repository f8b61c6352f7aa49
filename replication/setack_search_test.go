package replication

import (
	"errors"
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// TestSetAckSearchLeavesNothingWhereUnknown: a SETACK with mayhave 0 (the
// search of a node holding a dummy ack) for a job this node does not have
// is answered "not known" and leaves nothing here; one for a job it has
// acks it. A dummy ack left by a search was collected by nobody: held up
// on a link to a restarting peer, the search reached holders after their
// copies were collected, and each kept an acked dummy until its TTL (Disque
// suite 05-acks, "It is possible to acknowledge jobs to nodes not
// knowing it").
func TestSetAckSearchLeavesNothingWhereUnknown(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	unknown := storage.NewJobID(a.id, 3600, 60) // at least once: a dummy would be kept
	res := addJob(t, a, queue.AddRequest{Replicate: 2, Timeout: 5000})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	before := a.jobs.Stats().GotAcksReceived
	b.jobs.Handle(a.id, Message{Type: MsgSetAck, Payload: encodeSetAcks([]string{unknown, res.ID}, []int{0, 0})})
	if _, err := b.st.Job(unknown); !errors.Is(err, storage.ErrNotFound) {
		t.Fatalf("the searched id unknown here: %v, want nothing stored", err)
	}
	eventually(t, "GOTACK for both ids", func() bool { return a.jobs.Stats().GotAcksReceived >= before+2 })
	// The job b holds is acked, and b collects it (a search leaves the
	// collection to a holder): gone from both.
	eventually(t, "the searched job collected from both nodes", func() bool {
		return a.state(t, res.ID) == "" && b.state(t, res.ID) == ""
	})
}
