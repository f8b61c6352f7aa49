package replication

import (
	"sync"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// replJobSeen is one job of a REPLJOB a node received: the stamp of its
// message (0: not marked first).
type replJobSeen struct {
	to, id string
	first  uint64
}

// recordReplJobs records every REPLJOB job delivered in c.
func recordReplJobs(c *testCluster) func() []replJobSeen {
	var mu sync.Mutex
	var seen []replJobSeen
	c.mu.Lock()
	c.lose = func(to, from string, m Message) bool {
		if m.Type != MsgReplJob {
			return false
		}
		h, jobs, err := decodeReplJobs(m.Payload)
		if err != nil {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		for _, r := range jobs {
			seen = append(seen, replJobSeen{to: to, id: r.Job.ID, first: h.first})
		}
		return false
	}
	c.mu.Unlock()
	return func() []replJobSeen {
		mu.Lock()
		defer mu.Unlock()
		return append([]replJobSeen(nil), seen...)
	}
}

func wantFirst(t *testing.T, nd *jobsNode, fast, slow int64) {
	t.Helper()
	if f, s := nd.st.FirstAdds(); f != fast || s != slow {
		t.Fatalf("node %s: first adds %d fast, %d slow; want %d, %d", nd.id[:8], f, s, fast, slow)
	}
}

// TestFirstReplJobs: an origin marks the REPLJOBs a job's Replicate sends
// first with the receiver's incarnation (learned from its GOTJOBs), and
// only those: a resend is not marked; a receiver stores a marked copy
// without its index lookup, and one marked with the incarnation it had
// before a restart with the lookup.
func TestFirstReplJobs(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, b, d := c.nodes[0], c.nodes[1], c.nodes[2]
	seen := recordReplJobs(c)
	req := queue.AddRequest{Replicate: 3, Timeout: 10000}
	// No incarnation known yet: nothing marked.
	warm := addJob(t, origin, req)
	if warm.Err != nil {
		t.Fatal(warm.Err)
	}
	for _, s := range seen() {
		if s.first != 0 {
			t.Fatalf("a REPLJOB marked before any GOTJOB: %+v", s)
		}
	}
	wantFirst(t, b, 0, 0)
	// Known now: marked, and stored without the lookup.
	seen0 := len(seen())
	res := addJob(t, origin, req)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	wantFirst(t, b, 1, 0)
	wantFirst(t, d, 1, 0)
	for _, s := range seen()[seen0:] {
		nd := b
		if s.to == d.id {
			nd = d
		}
		if s.first != nd.st.ReplicaIncarnation() {
			t.Fatalf("first REPLJOB stamped %d, node's incarnation %d", s.first, nd.st.ReplicaIncarnation())
		}
	}
	// Lose the next job's first REPLJOB to d: its resend is not marked.
	c.mu.Lock()
	record := c.lose
	var lostOne sync.Once
	var lostID string
	c.lose = func(to, from string, m Message) bool {
		lost := record(to, from, m)
		if to == d.id && m.Type == MsgReplJob {
			if h, jobs, err := decodeReplJobs(m.Payload); err == nil && h.first != 0 {
				lostOne.Do(func() { lost, lostID = true, jobs[0].Job.ID })
			}
		}
		return lost
	}
	c.mu.Unlock()
	seen0 = len(seen())
	res = addJob(t, origin, req)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if lostID != res.ID {
		t.Fatalf("lost %q, want the job's first REPLJOB %q", lostID, res.ID)
	}
	var toD []replJobSeen
	for _, s := range seen()[seen0:] {
		if s.to == d.id && s.id == res.ID {
			toD = append(toD, s)
		}
	}
	if len(toD) < 2 || toD[0].first == 0 || toD[len(toD)-1].first != 0 {
		t.Fatalf("REPLJOBs to the node that lost the first: %+v, want a marked one then unmarked resends", toD)
	}
	if got := d.state(t, res.ID); got != "active" {
		t.Fatalf("the resent copy: %q", got)
	}
	wantFirst(t, b, 2, 0)
	wantFirst(t, d, 1, 0) // the resend took AddReplica's lookup
	// A restart of b: the origin's stamp is b's old incarnation until
	// b's next GOTJOB; that copy takes the lookup.
	c.mu.Lock()
	c.lose = nil
	c.mu.Unlock()
	c.close(b)
	c.open(b)
	eventually(t, "the link to the restarted node", func() bool {
		return origin.tr.Connected(b.id)
	})
	for i := range 3 {
		if res := addJob(t, origin, req); res.Err != nil {
			t.Fatal(res.Err)
		}
		if i == 0 {
			wantFirst(t, b, 0, 1)
		}
	}
	wantFirst(t, b, 2, 1)
}

// TestFirstReplJobAfterDummyAck: a SETACK that reached a node before a
// job's first REPLJOB left a dummy ack there (flushed to Pebble, where
// only the skipped lookup would find it); the marked REPLJOB must not
// resurrect the job — before and after the node restarts.
func TestFirstReplJobAfterDummyAck(t *testing.T) {
	c := newTestCluster(t, 2, -1)
	a, b := c.nodes[0], c.nodes[1]
	newJob := func() *storage.Job {
		return &storage.Job{ID: storage.NewJobID(a.id, 3600, 60), Queue: "q", Ctime: 1_000_000,
			Etime: time.Now().UnixMilli() + 3_600_000, Retry: 60, Repl: 2, Nodes: []string{a.id, b.id}}
	}
	x, y := newJob(), newJob()
	b.jobs.Handle(a.id, Message{Type: MsgSetAck, Payload: encodeSetAcks([]string{x.ID, y.ID}, []int{2, 2})})
	for _, j := range []*storage.Job{x, y} {
		if got, err := b.st.Job(j.ID); err != nil || !got.IsDummyAck() {
			t.Fatalf("SETACK of an unknown job: %+v, %v", got, err)
		}
	}
	if err := b.st.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	first := func(j *storage.Job) {
		t.Helper()
		p := encodeReplJobsHeader(replHeader{first: b.st.ReplicaIncarnation()}, []replJob{{Job: j, Body: []byte("b")}})
		b.jobs.Handle(a.id, Message{Type: MsgReplJob, Payload: p})
		if got, err := b.st.Job(j.ID); err != nil || !got.IsDummyAck() {
			t.Fatalf("a first REPLJOB after a dummy ack: %+v, %v", got, err)
		}
	}
	first(x)
	// Cut off, so that the restart's resume cannot collect the dummy ack
	// (a's GOTACK would let b delete it) before the REPLJOB comes.
	c.net.Cut(a.id, b.id)
	c.close(b)
	c.open(b)
	first(y)
	wantFirst(t, b, 0, 1)
}
