package replication

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
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
	// The decoded jobs share strings, never arrays: changing one job's
	// nodes or body leaves the others as they were.
	got[0].Job.Nodes[0] = "changed"
	got[0].Body[0] = 'y'
	if got[1].Job.Nodes[0] != jobs[1].Job.Nodes[0] || got[1].Body[0] != 'x' {
		t.Fatal("two decoded jobs share a node list or a body")
	}
	got[0].Job.Nodes = append(got[0].Job.Nodes, "more")
	if fmt.Sprint(got[1].Job.Nodes) != fmt.Sprint(jobs[1].Job.Nodes) {
		t.Fatal("appending to a decoded node list changed another job's")
	}
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
	got[0].Job.Nodes[0] = "changed"
	got[0].Body[0] = 'y'
	if got[1].Job.Nodes[0] != jobs[1].Job.Nodes[0] || got[1].Body[0] != 'x' {
		t.Fatal("two decoded jobs share a node list or a body")
	}
	got[0].Job.Nodes = append(got[0].Job.Nodes, "more")
	if fmt.Sprint(got[1].Job.Nodes) != fmt.Sprint(jobs[1].Job.Nodes) {
		t.Fatal("appending to a decoded node list changed another job's")
	}
}
