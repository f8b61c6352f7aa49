package replication

import (
	"slices"
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// TestAckRunsShareOneAnswer: consecutive SETACKs one link read together
// are applied as one and answered by one GOTACK (before, one each); an id
// seen again cuts the run (two GOTACKs, as the messages would have
// brought); a malformed SETACK in a run is dropped alone; a run of
// DELJOBs deletes every job of it.
func TestAckRunsShareOneAnswer(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	var gotAcks [][]string // GOTACKs from B to A, in order
	c.mu.Lock()
	c.lose = func(to, from string, m Message) bool {
		if to == a.id && from == b.id && m.Type == MsgGotAck {
			ids, _, err := decodeGotAcks(m.Payload)
			if err != nil {
				t.Error(err)
			}
			c.mu.Lock() // lose is called without c.mu held
			gotAcks = append(gotAcks, ids)
			c.mu.Unlock()
		}
		return false
	}
	c.mu.Unlock()
	answers := func() [][]string {
		c.mu.Lock()
		defer c.mu.Unlock()
		return slices.Clone(gotAcks)
	}
	var ids []string
	for range 4 {
		r := addJob(t, b, queue.AddRequest{Replicate: 1})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.ID)
	}
	setAck := func(ids ...string) Message {
		return Message{Type: MsgSetAck, Payload: encodeSetAcks(ids, slices.Repeat([]int{2}, len(ids)))}
	}

	b.jobs.HandleBatch(a.id, []Message{setAck(ids[0]), {Type: MsgSetAck, Payload: []byte{0xff}}, setAck(ids[1], ids[2])})
	eventually(t, "one GOTACK", func() bool { return len(answers()) == 1 })
	if got := answers()[0]; !slices.Equal(got, ids[:3]) {
		t.Fatalf("GOTACK for %v, want %v", got, ids[:3])
	}
	for _, id := range ids[:3] {
		if s := b.state(t, id); s != storage.StateAcked.String() {
			t.Fatalf("job %s on B: %s, want acked", id, s)
		}
	}
	if n := b.jobs.Stats().BadPayloads; n != 1 {
		t.Fatalf("BadPayloads = %d, want 1", n)
	}

	b.jobs.HandleBatch(a.id, []Message{setAck(ids[3]), setAck(ids[3])})
	eventually(t, "two more GOTACKs", func() bool { return len(answers()) == 3 })
	for _, got := range answers()[1:] {
		if !slices.Equal(got, ids[3:]) {
			t.Fatalf("GOTACKs %v, want two for %v", answers(), ids[3:])
		}
	}

	b.jobs.HandleBatch(a.id, []Message{
		{Type: MsgDelJob, Payload: encodeIDs(ids[:2])},
		{Type: MsgDelJob, Payload: encodeIDs(ids[2:])},
	})
	for _, id := range ids {
		if s := b.state(t, id); s != "" {
			t.Fatalf("job %s on B after DELJOB: %s", id, s)
		}
	}
}
