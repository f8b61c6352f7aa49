package replication

import (
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// drainOn consumes n jobs of q on nd (blocking GETJOBs, which ask other
// nodes) and returns their ids; it fails on a job delivered twice.
func drainOn(t *testing.T, nd *jobsNode, n int) []string {
	t.Helper()
	seen := map[string]bool{}
	var ids []string
	deadline := time.Now().Add(10 * time.Second)
	for len(ids) < n && time.Now().Before(deadline) {
		for _, d := range getWait(t, nd, "q", 10, 2*time.Second) {
			if seen[d.ID] {
				t.Fatalf("job %s delivered twice", d.ID)
			}
			seen[d.ID] = true
			ids = append(ids, d.ID)
		}
	}
	if len(ids) != n {
		t.Fatalf("got %d of %d jobs", len(ids), n)
	}
	return ids
}

// TestFederationFirstGiveSkipsTheLookup: once A knows B's incarnation
// (B's empty GOTJOB, sent when it sees A up and with its NEEDJOBS), the
// jobs A adds after that are moved to B marked first, and B stores every
// one without the index lookup (storage's fast adds); jobs A held before
// it learned it are not marked. Every job is still delivered once, B's
// copies name both nodes, and an ACKJOB on B collects A's copies.
func TestFederationFirstGiveSkipsTheLookup(t *testing.T) {
	c := fedCluster(t, 3)
	a, b := c.nodes[0], c.nodes[1]
	const early, n = 5, 40
	var ids []string
	ctimes := map[string]uint64{}
	add := func(body string) {
		r := addJob(t, a, queue.AddRequest{Body: []byte(body), Replicate: 1})
		if r.Err != nil {
			t.Fatal(r.Err)
		}
		ids = append(ids, r.ID)
		ctimes[r.ID] = a.job(t, r.ID).Ctime
	}
	for i := range early {
		add(fmt.Sprint("early ", i))
	}
	drainOn(t, b, early)
	eventually(t, "A learns B's incarnation", func() bool { return a.jobs.firstGive(b.id).Incarnation != 0 })
	for i := range n {
		add(fmt.Sprint("job ", i))
	}
	drainOn(t, b, n)
	mark := a.jobs.firstGive(b.id).After
	want := int64(0) // the jobs added after the mark (all n at least)
	for _, id := range ids {
		if ctimes[id] > mark {
			want++
		}
		bj := b.job(t, id)
		if bj == nil || !slices.Contains(bj.Nodes, a.id) || !slices.Contains(bj.Nodes, b.id) {
			t.Fatalf("B's copy of %s: %+v", id, bj)
		}
	}
	if fast, slow := b.broker.Store().FirstAdds(); want < n || fast != want || slow != 0 {
		t.Fatalf("B's first adds: %d fast, %d slow; want %d fast (jobs added after A's mark)", fast, slow, want)
	}
	ackCollected(t, b, ids, a, b)
}

// TestFederationGivenAgainIsNotFirst: a job A gave B once (B among its
// nodes from then on) and gives again after its RETRY is not marked
// first the second time, so B looks it up and finds its copy.
func TestFederationGivenAgainIsNotFirst(t *testing.T) {
	c := fedCluster(t, 3)
	a, b := c.nodes[0], c.nodes[1]
	addJob(t, a, queue.AddRequest{Body: []byte("warm"), Replicate: 1})
	drainOn(t, b, 1)
	eventually(t, "A learns B's incarnation", func() bool { return a.jobs.firstGive(b.id).Incarnation != 0 })
	// Another queue than the warm one: a NEEDJOBS of B's for "q" still
	// on its way (B asks again while its GETJOB waits) would take the job
	// before the direct gives below.
	id := addJob(t, a, queue.AddRequest{Queue: "q2", Body: []byte("x"), Replicate: 1}).ID
	fg := a.jobs.firstGive(b.id)
	give, err := a.broker.RemoteNeedJobsFirst(b.id, "q2", 5, fg)
	if err != nil || len(give) != 1 || give[0].Job.ID != id || give[0].First != fg.Incarnation {
		t.Fatalf("first give: %+v, %v", give, err)
	}
	// A requeues it (as after its RETRY) and is asked again.
	if n, err := a.broker.Enqueue([]string{id}); err != nil || n != 1 {
		t.Fatalf("ENQUEUE on A: %d, %v", n, err)
	}
	again, err := a.broker.RemoteNeedJobsFirst(b.id, "q2", 5, fg)
	if err != nil || len(again) != 1 || again[0].First != 0 {
		t.Fatalf("second give: %+v, %v", again, err)
	}
}

// TestYourJobsFirstCodec: version 2 carries each job's first mark and
// the incarnation, version 1 none; a bad mark, an incarnation 0 and a
// truncated payload are refused.
func TestYourJobsFirstCodec(t *testing.T) {
	j1 := &storage.Job{ID: "D-01234567-abcdefghijklmnopqrstuvwx-0e11", Queue: "q", Ctime: 5, Retry: 60, Repl: 1, Nodes: []string{"0123456789abcdef0123456789abcdef01234567"}}
	j2 := *j1
	j2.ID = "D-01234567-bbcdefghijklmnopqrstuvwx-0e11"
	mixed := []queue.Replica{{Job: j1, Body: []byte("a"), First: 9}, {Job: &j2, Body: []byte("b")}}
	p := encodeYourJobs(mixed)
	if p[0] != yourJobsVersionFirst {
		t.Fatalf("version %d, want %d", p[0], yourJobsVersionFirst)
	}
	got, err := decodeYourJobs(p)
	if err != nil || len(got) != 2 || got[0].First != 9 || got[1].First != 0 || got[0].Job.ID != j1.ID || string(got[1].Body) != "b" {
		t.Fatalf("decoded %+v, %v", got, err)
	}
	plain := encodeYourJobs([]queue.Replica{{Job: j1, Body: []byte("a")}})
	if plain[0] != codecVersion {
		t.Fatalf("unmarked YOURJOBS has version %d", plain[0])
	}
	if got, err := decodeYourJobs(plain); err != nil || len(got) != 1 || got[0].First != 0 {
		t.Fatalf("version 1: %+v, %v", got, err)
	}
	bad := slices.Clone(p)
	bad[len(bad)-1] = 2 // the last job's mark
	zero := append([]byte{yourJobsVersionFirst, 0}, p[2:]...)
	for name, q := range map[string][]byte{"bad mark": bad, "incarnation 0": zero, "truncated": p[:len(p)-1]} {
		if _, err := decodeYourJobs(q); err == nil {
			t.Errorf("%s: decoded", name)
		}
	}
}

// TestIncarnationToldAgainAfterAQuickRestart: a giver whose store opens
// again holds no mark of its askers; one that restarts between two looks
// of the asker's ack loop (seen up all along) learns the asker's
// incarnation again all the same. (It did not: the asker told it only at
// its first sighting and then with its NEEDJOBS, so the giver's first
// gives to it took the lookup until the asker next asked for jobs — and
// TestInboxKeepsOrderAndBound, which waits for that mark, timed out.)
func TestIncarnationToldAgainAfterAQuickRestart(t *testing.T) {
	c := fedCluster(t, 2)
	a, b := c.nodes[0], c.nodes[1]
	var tells atomic.Int64 // empty GOTJOBs either way
	c.mu.Lock()
	c.lose = func(to, from string, m Message) bool {
		if ids, _, err := decodeGotJobs(m.Payload); m.Type == MsgGotJob && err == nil && len(ids) == 0 {
			tells.Add(1)
		}
		return false
	}
	c.mu.Unlock()
	markOfA := func() bool {
		b.jobs.mu.Lock()
		defer b.jobs.mu.Unlock()
		_, ok := b.jobs.fedFirst[a.id]
		return ok
	}
	eventually(t, "a's incarnation told to b", markOfA)
	const restarts = 3
	for i := range restarts {
		c.close(b)
		c.open(b)
		eventually(t, fmt.Sprint("a's incarnation told to b again, restart ", i+1), markOfA)
	}
	eventually(t, "b's last incarnation heard by a", func() bool {
		a.jobs.mu.Lock()
		defer a.jobs.mu.Unlock()
		return a.jobs.peerInc[b.id] == b.st.ReplicaIncarnation()
	})
	// Told again about once per open, not back and forth: each open has
	// at most a sighting each way and a retell each way.
	if n := tells.Load(); n > 4*(restarts+1) {
		t.Fatalf("%d empty GOTJOBs for %d opens of b: told back and forth", n, restarts+1)
	}
}
