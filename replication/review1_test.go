package replication

import (
	"sync"
	"testing"
	"time"
)

// TestSetAckOfACopyAckedAlreadyAnswersKnown: a SETACK for a copy acked
// here already (a retried round, a second collector, or the same id twice
// in one read) answers GOTACK "known", as RemoteSetAck did, and a copy
// this node knows more holders of is not answered (it collects it itself).
func TestSetAckOfACopyAckedAlreadyAnswersKnown(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	var mu sync.Mutex
	var known []bool
	c.mu.Lock()
	c.lose = func(dst, _ string, m Message) bool {
		if dst == a.id && m.Type == MsgGotAck {
			_, k, err := decodeGotAcks(m.Payload)
			if err != nil {
				t.Error(err)
			}
			mu.Lock()
			known = append(known, k...)
			mu.Unlock()
			return true
		}
		return false
	}
	c.mu.Unlock()
	// A third holder in the lists, so the copy is acked rather than
	// deleted as a pair's (ackgc_pair.go).
	ids := heldCopiesWith(t, a, b, 2, "0123456789abcdef0123456789abcdef01234567")
	set := Message{Type: MsgSetAck, Payload: encodeSetAcks(ids[:1], []int{3})}
	b.jobs.HandleBatch(a.id, []Message{set})
	b.jobs.HandleBatch(a.id, []Message{set})
	// The same id twice in one read, its sender knowing fewer holders
	// (mayhave 1): neither is answered.
	few := Message{Type: MsgSetAck, Payload: encodeSetAcks(ids[1:], []int{1})}
	b.jobs.HandleBatch(a.id, []Message{few, few})
	n := func() int { mu.Lock(); defer mu.Unlock(); return len(known) }
	eventually(t, "the GOTACKs", func() bool { return n() >= 2 })
	time.Sleep(200 * time.Millisecond) // a third, wrong one, would be here by now
	mu.Lock()
	defer mu.Unlock()
	if len(known) != 2 || !known[0] || !known[1] {
		t.Fatalf("GOTACKs' known = %v, want [true true] (the second SETACK of an acked copy is known; a copy with more holders is not answered)", known)
	}
}
