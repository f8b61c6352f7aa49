package replication

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// replJobsForTest returns n jobs as one Replicate call of REPLICATE 3 sends
// them: one queue, the same three nodes, 100-byte bodies.
func replJobsForTest(n int) []replJob {
	nodes := []string{storage.NewNodeID(), storage.NewNodeID(), storage.NewNodeID()}
	jobs := make([]replJob, n)
	for i := range jobs {
		jobs[i] = replJob{Job: &storage.Job{ID: storage.NewJobID(nodes[0], 3600, 60), Queue: "q", Ctime: uint64(1000 + i),
			Etime: 5000, Retry: 60, Repl: 3, Nodes: nodes}, Body: bytes.Repeat([]byte{'x'}, 100)}
	}
	return jobs
}

// TestReplJobCodecAllocations bounds what a REPLJOB of 16 jobs allocates:
// encoding, its one buffer (a body was copied into a string first: two
// more a job); decoding, per job its id, its body and its node list
// (the list's node ids and the queue name are shared by the jobs of one
// message), and per message the jobs' two arrays. Decoding allocated 132
// objects for 16 jobs (the body twice, each node id, the list grown three
// times), half of a replica's allocations at REPLICATE 3.
func TestReplJobCodecAllocations(t *testing.T) {
	const n = 16
	jobs := replJobsForTest(n)
	h := replHeader{first: 77}
	var p []byte
	if a := testing.AllocsPerRun(50, func() { p = encodeReplJobsHeader(h, jobs) }); a > 1 {
		t.Errorf("encoding %d jobs: %.0f allocations, want 1", n, a)
	}
	var got []replJob
	a := testing.AllocsPerRun(50, func() {
		var err error
		if _, got, err = decodeReplJobs(p); err != nil {
			t.Fatal(err)
		}
	})
	// id, body, node list per job; the three node ids and the queue name
	// once; the Job array and the replJob array once.
	if want := 3*n + 6; a > float64(want) {
		t.Errorf("decoding %d jobs: %.0f allocations, want at most %d", n, a, want)
	}
	for i := range jobs {
		if !reflect.DeepEqual(got[i].Job, jobs[i].Job) || !bytes.Equal(got[i].Body, jobs[i].Body) {
			t.Fatalf("job %d: decoded %+v %q, sent %+v", i, got[i].Job, got[i].Body, jobs[i].Job)
		}
	}
	checkDecodedShareNoArrays(t, got[0].Job, got[1].Job, got[0].Body, got[1].Body, jobs[1].Job.Nodes)
}

// TestPlannersAllocateOncePerRound checks that SyncNodes and AsyncNodes,
// called once per add round, allocate per round, not per job: pick grew
// a candidate list and returned its own slice for every job, a fifth of
// an origin's allocations at REPLICATE 3 pipeline 1. It also checks that
// each job gets its count of distinct nodes, this one never among them.
func TestPlannersAllocateOncePerRound(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	need := make([]int, 16)
	for i := range need {
		need[i] = 1 + i%2
	}
	for _, planner := range []struct {
		name string
		plan func([]int) [][]string
	}{{"SyncNodes", origin.jobs.SyncNodes}, {"AsyncNodes", origin.jobs.AsyncNodes}} {
		var out [][]string
		base := testing.AllocsPerRun(20, func() { out = planner.plan(nil) })
		a := testing.AllocsPerRun(20, func() { out = planner.plan(need) })
		// The result, its nodes' array, a scratch list: 3 beyond what an
		// empty call costs (the membership read).
		if a-base > 3 {
			t.Errorf("%s of %d jobs: %.0f allocations beyond an empty call's %.0f, want at most 3", planner.name, len(need), a-base, base)
		}
		for i, nodes := range out {
			if len(nodes) != need[i] || (len(nodes) == 2 && nodes[0] == nodes[1]) || slices.Contains(nodes, origin.id) {
				t.Fatalf("%s: job %d (need %d) got %v (self %s)", planner.name, i, need[i], nodes, origin.id)
			}
		}
		// A job's list is its own: appending to one leaves the next.
		next := slices.Clone(out[1])
		_ = append(out[0], "x")
		if !slices.Equal(out[1], next) {
			t.Fatalf("%s: appending to job 0's nodes changed job 1's", planner.name)
		}
	}
}

// TestGotJobDecodingAllocations: a GOTJOB's ids are only looked up by the
// origin (gotJobs), so its decoding allocates the list and one string for
// all of them, not one string an id (two a job at REPLICATE 3: a tenth of
// the origin's allocations).
func TestGotJobDecodingAllocations(t *testing.T) {
	jobs := replJobsForTest(16)
	ids := make([]string, len(jobs))
	for i, r := range jobs {
		ids[i] = r.Job.ID
	}
	p := encodeGotJobs(ids, 99)
	var got []string
	a := testing.AllocsPerRun(50, func() {
		var err error
		var inc uint64
		if got, inc, err = decodeGotJobs(p); err != nil || inc != 99 {
			t.Fatal(inc, err)
		}
	})
	if a > 2 {
		t.Errorf("decoding a GOTJOB of %d ids: %.0f allocations, want 2", len(ids), a)
	}
	if !slices.Equal(got, ids) {
		t.Fatalf("decoded %v, sent %v", got, ids)
	}
	bad := slices.Clone(p)
	bad[len(bad)-storage.JobIDLen] = 'X' // the last id's "D-" prefix
	if _, _, err := decodeGotJobs(bad); err == nil {
		t.Fatal("a GOTJOB with a malformed id decoded")
	}
}

// TestGotJobsConfirmWithoutAllocating: a GOTJOB records each of its jobs'
// confirmations in the pendingRepls of their Replicate call, which the
// call allocated (one array for all its jobs): a map a job, made at its
// first GOTJOB, was two or three allocations a job on the origin, each
// GC work later. It also checks what the confirmations mean: a job
// confirmed by both nodes wakes its call, a second GOTJOB from the same
// node does not count twice, and SHOW's nodes-confirmed lists them.
func TestGotJobsConfirmWithoutAllocating(t *testing.T) {
	self, a, b := storage.NewNodeID(), storage.NewNodeID(), storage.NewNodeID()
	j, err := NewJobs(JobsConfig{ID: self, Peers: fixedPeers{[]string{self}, []string{a, b}}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	const n, runs = 16, 20
	// One Replicate call's jobs for each of AllocsPerRun's runs (and its
	// first, uncounted one): a job is confirmed once by a node.
	ids := make([][]string, runs+1)
	calls := make([][]*pendingRepl, runs+1)
	wakes := make([]chan struct{}, runs+1)
	for c := range calls {
		jobs := make([]queue.Replication, n)
		ids[c] = make([]string, n)
		for i := range jobs {
			jobs[i].Job = &storage.Job{ID: storage.NewJobID(self, 3600, 60), Queue: "q", Repl: 3, Nodes: []string{self, a, b}}
			ids[c][i] = jobs[i].Job.ID
		}
		wakes[c] = make(chan struct{}, 1)
		prs, short := j.newPendingRepls(jobs, false, 0, wakes[c])
		if short {
			t.Fatal("jobs stored with their two nodes are short of nodes")
		}
		calls[c] = prs
		j.mu.Lock()
		for i, id := range ids[c] {
			j.repl[id] = prs[i]
		}
		j.mu.Unlock()
	}
	// The nodes' incarnations, learned once (a later change allocates).
	j.gotJobs(a, nil, 7)
	j.gotJobs(b, nil, 8)
	c := 0
	allocs := testing.AllocsPerRun(runs, func() {
		j.gotJobs(a, ids[c], 7)
		j.gotJobs(a, ids[c], 7) // again: no second confirmation
		if len(wakes[c]) != 0 {
			t.Fatalf("call %d woken with one node of two confirmed", c)
		}
		j.gotJobs(b, ids[c], 8)
		c++
	})
	if allocs != 0 {
		t.Errorf("three GOTJOBs of %d jobs: %.0f allocations, want 0", n, allocs)
	}
	for c := range calls {
		if len(wakes[c]) != 1 {
			t.Fatalf("call %d not woken once both nodes confirmed", c)
		}
		for i, p := range calls[c] {
			if got := len(p.confirmed); got != 2 {
				t.Fatalf("call %d job %d: %d confirmations, want 2", c, i, got)
			}
		}
	}
	want := append([]string{self}, slices.Sorted(slices.Values([]string{a, b}))...)
	if got := j.NodesConfirmed(ids[3][5]); !slices.Equal(got, want) {
		t.Fatalf("nodes-confirmed %v, want %v", got, want)
	}
}

// TestPendingReplSharesThePlannedNodeList: a job stored with this node and
// the nodes its first REPLJOBs go to (SyncNodes) already holds the node
// list its copies carry and its Replicate returns, so nodeList makes none
// (one allocation a job on the origin, the node list built again); once a
// node is added, the list is a new one and the job's stays as it was.
func TestPendingReplSharesThePlannedNodeList(t *testing.T) {
	self, a, b, c := storage.NewNodeID(), storage.NewNodeID(), storage.NewNodeID(), storage.NewNodeID()
	j, err := NewJobs(JobsConfig{ID: self, Peers: fixedPeers{[]string{self}, []string{a, b, c}}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	planned := []string{self, a, b}
	// A job for each of AllocsPerRun's runs: each list is made once.
	const runs = 20
	jobs := make([]queue.Replication, runs+1)
	for i := range jobs {
		jobs[i].Job = &storage.Job{ID: storage.NewJobID(self, 3600, 60), Queue: "q", Repl: 3, Nodes: planned}
	}
	prs, _ := j.newPendingRepls(jobs, false, 0, make(chan struct{}, 1))
	k := 0
	if allocs := testing.AllocsPerRun(runs, func() {
		if list := j.nodeList(prs[k]); !slices.Equal(list, planned) {
			t.Fatalf("node list %v, want %v", list, planned)
		}
		k++
	}); allocs != 0 {
		t.Errorf("the node list of a job stored with its planned nodes: %.0f allocations, want 0", allocs)
	}
	p := prs[0]
	var list []string
	p.sent = append(p.sent, c) // a node added to a short replication
	if list = j.nodeList(p); !slices.Equal(list, []string{self, a, b, c}) {
		t.Fatalf("node list after adding a node: %v", list)
	}
	if !slices.Equal(jobs[0].Job.Nodes, planned) || !slices.Equal(planned, []string{self, a, b}) {
		t.Fatalf("the job's own node list changed to %v", jobs[0].Job.Nodes)
	}
}

// TestSendAsyncSharesTheStoredNodeList: an ASYNC job planned by AsyncNodes
// is stored with this node first, then its copies' nodes, which is the
// list SendAsync sends to and the copies carry: it allocates no list of
// its own a job (one a job on the origin), and a list that does not start
// with this node is still put right.
func TestSendAsyncSharesTheStoredNodeList(t *testing.T) {
	self, a, b := storage.NewNodeID(), storage.NewNodeID(), storage.NewNodeID()
	j, err := NewJobs(JobsConfig{ID: self, Peers: fixedPeers{[]string{self}, []string{a, b}}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	defer j.Close()
	// The other nodes on a memory network: while capture is off they
	// keep nothing (a decode there would count in the allocations).
	net := NewMemNetwork()
	var mu sync.Mutex
	var capture atomic.Bool
	sent := map[string][]replJob{}
	watch := map[string]bool{} // the ids of the last call, set before it
	for _, id := range []string{a, b} {
		tr := net.Join(id, func(_ string, m Message) {
			if !capture.Load() || m.Type != MsgReplJob {
				return
			}
			if _, jobs, err := decodeReplJobs(m.Payload); err == nil {
				mu.Lock()
				for _, r := range jobs {
					if watch[r.Job.ID] {
						sent[id] = append(sent[id], r)
					}
				}
				mu.Unlock()
			}
		})
		defer tr.Close()
	}
	var tr Transport = net.Join(self, func(string, Message) {})
	defer tr.Close()
	tr.SetPeer(a, "")
	tr.SetPeer(b, "")
	j.boundTr.Store(&tr)
	mk := func(n int, nodes []string) []queue.Replication {
		jobs := make([]queue.Replication, n)
		for i := range jobs {
			jobs[i] = queue.Replication{Job: &storage.Job{ID: storage.NewJobID(self, 3600, 60), Queue: "q", Repl: 3, Nodes: nodes}, Body: []byte("b")}
		}
		return jobs
	}
	planned := []string{self, a, b}
	one, sixteen := mk(1, planned), mk(16, planned)
	base := testing.AllocsPerRun(20, func() { j.SendAsync(one) })
	all := testing.AllocsPerRun(20, func() { j.SendAsync(sixteen) })
	// Each node's list of jobs grown to 16: four more arrays each.
	if extra := all - base; extra > 10 {
		t.Errorf("SendAsync of 16 jobs: %.0f allocations beyond one job's %.0f, want at most 10 (no node list a job)", extra, base)
	}
	// A planned job and one whose list does not start with this node,
	// both new (the REPLJOBs above may still be on their way).
	last, odd := mk(1, planned)[0], mk(1, []string{a, self})[0]
	mu.Lock()
	watch[last.Job.ID], watch[odd.Job.ID] = true, true
	mu.Unlock()
	capture.Store(true)
	j.SendAsync([]queue.Replication{last, odd})
	eventually(t, "the REPLJOBs", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(sent[a]) >= 2 && len(sent[b]) >= 1
	})
	mu.Lock()
	defer mu.Unlock()
	if len(sent[a]) != 2 || len(sent[b]) != 1 {
		t.Fatalf("REPLJOBs: %d jobs to a (want 2), %d to b (want 1)", len(sent[a]), len(sent[b]))
	}
	for _, r := range sent[a] {
		want := planned
		if r.Job.ID == odd.Job.ID {
			want = []string{self, a}
		}
		if !slices.Equal(r.Job.Nodes, want) {
			t.Fatalf("job %s sent with nodes %v, want %v", r.Job.ID, r.Job.Nodes, want)
		}
	}
}

// TestYourJobsCodecAllocations bounds what a YOURJOBS of 16 jobs allocates,
// as TestReplJobCodecAllocations does a REPLJOB's: encoding, its one
// buffer; decoding, per job its id, its body and its node list, and per
// message the jobs' two arrays, the queue name and the node ids, shared.
// Decoding allocated 8 objects a job (the body twice, the queue name and
// each node id again, the job alone), encoding one more per job (the body
// copied into a string).
func TestYourJobsCodecAllocations(t *testing.T) {
	const n = 16
	var jobs []queue.Replica
	for i, r := range replJobsForTest(n) {
		r.Job.State = storage.StateActive
		r.Job.Nacks, r.Job.AdditionalDeliveries = uint32(i), 2
		jobs = append(jobs, queue.Replica{Job: r.Job, Body: r.Body, First: uint64(i % 2 * 9)})
	}
	var p []byte
	if a := testing.AllocsPerRun(50, func() { p = encodeYourJobs(jobs) }); a > 1 {
		t.Errorf("encoding %d jobs: %.0f allocations, want 1", n, a)
	}
	var got []queue.Replica
	a := testing.AllocsPerRun(50, func() {
		var err error
		if got, err = decodeYourJobs(p); err != nil {
			t.Fatal(err)
		}
	})
	if want := 3*n + 6; a > float64(want) {
		t.Errorf("decoding %d jobs: %.0f allocations, want at most %d", n, a, want)
	}
	for i := range jobs {
		if !reflect.DeepEqual(got[i].Job, jobs[i].Job) || !bytes.Equal(got[i].Body, jobs[i].Body) || got[i].First != jobs[i].First {
			t.Fatalf("job %d: decoded %+v %q first %d, sent %+v first %d", i, got[i].Job, got[i].Body, got[i].First, jobs[i].Job, jobs[i].First)
		}
	}
	checkDecodedShareNoArrays(t, got[0].Job, got[1].Job, got[0].Body, got[1].Body, jobs[1].Job.Nodes)
}

// checkDecodedShareNoArrays: two decoded jobs (j0 with body b0, j1 with b1,
// sent with the nodes sent1 and a body starting 'x') share strings, never
// arrays: changing one job's nodes or body leaves the other as it was.
func checkDecodedShareNoArrays(t *testing.T, j0, j1 *storage.Job, b0, b1 []byte, sent1 []string) {
	t.Helper()
	j0.Nodes[0] = "changed"
	b0[0] = 'y'
	if j1.Nodes[0] != sent1[0] || b1[0] != 'x' {
		t.Fatal("two decoded jobs share a node list or a body")
	}
	j0.Nodes = append(j0.Nodes, "more")
	if fmt.Sprint(j1.Nodes) != fmt.Sprint(sent1) {
		t.Fatal("appending to a decoded node list changed another job's")
	}
}
