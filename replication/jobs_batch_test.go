package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// TestReplJobRunAppliedAsOne: consecutive REPLJOBs of one sender read
// together are applied as one — every good copy stored, one GOTJOB for
// those that want an answer — and a malformed REPLJOB among them, or a
// copy refused (a queue paused for input), costs only itself.
func TestReplJobRunAppliedAsOne(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	if _, err := b.broker.Pause("paused", storage.PauseIn); err != nil {
		t.Fatal(err)
	}
	copyOf := func(q string) replJob {
		return replJob{Job: &storage.Job{ID: storage.NewJobID(a.id, 3600, 60), Queue: q, Ctime: 1_000_000,
			Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 2, Nodes: []string{a.id, b.id}}, Body: []byte("b")}
	}
	sync1, sync2, refused, sync3, async := copyOf("q"), copyOf("q"), copyOf("paused"), copyOf("q"), copyOf("q")
	run := []Message{
		{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{sync1, sync2})},
		{Type: MsgReplJob, Payload: []byte{1, 0, 200}}, // malformed
		{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{refused, sync3})},
		{Type: MsgReplJob, Payload: encodeReplJobs(true, []replJob{async})}, // ASYNC: no answer
	}
	sentBefore := b.tr.Stats().MessagesSent
	b.jobs.HandleBatch(a.id, run)

	for _, r := range []replJob{sync1, sync2, sync3, async} {
		if got := b.state(t, r.Job.ID); got != "active" {
			t.Fatalf("copy %s: state %q, want active", r.Job.ID, got)
		}
	}
	if _, err := b.st.Job(refused.Job.ID); err == nil {
		t.Fatalf("the copy of a paused queue was stored")
	}
	if got := b.jobs.Stats().BadPayloads; got != 1 {
		t.Fatalf("BadPayloads = %d, want 1 (the malformed REPLJOB alone)", got)
	}
	eventually(t, "the GOTJOB of the three synchronous copies", func() bool { return a.jobs.Stats().GotJobsReceived == 3 })
	if sent := b.tr.Stats().MessagesSent - sentBefore; sent != 1 {
		t.Fatalf("the run was answered in %d messages, want one GOTJOB", sent)
	}
	// Not a REPLJOB in between: handled in its place, in order.
	late := copyOf("q")
	b.jobs.HandleBatch(a.id, []Message{
		{Type: MsgSetAck, Payload: encodeSetAcks([]string{late.Job.ID}, []int{2})},
		{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{late})},
		{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{copyOf("q")})},
	})
	if j, err := b.st.Job(late.Job.ID); err != nil || !j.IsDummyAck() {
		t.Fatalf("a REPLJOB after the SETACK of its job in the same batch: %+v, %v (want the dummy ack kept)", j, err)
	}
}
