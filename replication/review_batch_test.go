package replication

import (
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// TestReviewReplJobRunWithAResend: a REPLJOB and its resend (the sender
// resends to a node that has not answered yet) read in one batch are
// applied in one ReplicaApply: the copy is stored once, answered, and the
// store keeps working.
func TestReviewReplJobRunWithAResend(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	r := replJob{Job: &storage.Job{ID: storage.NewJobID(a.id, 3600, 60), Queue: "q", Ctime: 1_000_000,
		Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 2, Nodes: []string{a.id, b.id}}, Body: []byte("b")}
	msg := Message{Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{r})}
	b.jobs.HandleBatch(a.id, []Message{msg, msg, {Type: MsgReplJob, Payload: encodeReplJobs(false, []replJob{r, r})}})
	if got := b.state(t, r.Job.ID); got != "active" {
		t.Fatalf("copy: state %q, want active", got)
	}
	if b.st.Failing() {
		t.Fatal("store failing")
	}
	eventually(t, "a GOTJOB", func() bool { return a.jobs.Stats().GotJobsReceived >= 1 })
	if n := b.st.Stats().Jobs; n != 1 {
		t.Fatalf("%d jobs stored", n)
	}
}
