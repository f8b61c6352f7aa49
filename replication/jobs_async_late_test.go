package replication

import (
	"fmt"
	"slices"
	"sync"
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// TestLateAsyncReplJobAfterCollection: an ASYNC job is queued at its
// commit, before its REPLJOBs go, and a REPLJOB to a node may wait on a
// stalled link. Meanwhile another holder acks the job and collects it:
// its SETACK leaves a dummy ack on the node the REPLJOB has not reached,
// which answers, and its DELJOB deletes that dummy. The REPLJOB that
// arrives then must not bring the acked job back as a live copy (it would
// be requeued at its RETRY and delivered again).
func TestLateAsyncReplJobAfterCollection(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin, holder, late := c.nodes[0], c.nodes[1], c.nodes[2]
	release := make(chan struct{})
	held := make(chan struct{})
	var once, released sync.Once
	free := func() { released.Do(func() { close(release) }) }
	t.Cleanup(free) // before the cluster's: a held link would block its close
	c.mu.Lock()
	c.hold = func(to, from string, ms []Message) {
		if to != late.id || from != origin.id {
			return
		}
		for _, m := range ms {
			if m.Type == MsgReplJob {
				once.Do(func() { close(held) })
				<-release
				return
			}
		}
	}
	c.mu.Unlock()
	res := addJob(t, origin, queue.AddRequest{Replicate: 3, Async: true})
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	<-held
	eventually(t, "the copy on the holder", func() bool { return holder.state(t, res.ID) == "active" })
	if _, err := holder.broker.Ack([]string{res.ID}); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the job collected on the origin and the holder", func() bool {
		return origin.state(t, res.ID) == "" && holder.state(t, res.ID) == "" && late.state(t, res.ID) == ""
	})
	before := origin.jobs.Stats().GotJobsReceived
	if n := late.jobs.Stats().LateCopiesDropped; n != 0 {
		t.Fatalf("%d late copies dropped before the REPLJOB arrived", n)
	}
	free()
	// Either the late node stored the copy and answered (the origin's
	// first REPLJOB to a node whose incarnation it does not know asks for
	// a GOTJOB: asyncHead), or it dropped it (jobs_gone.go).
	eventually(t, "the late REPLJOB answered or dropped", func() bool {
		return origin.jobs.Stats().GotJobsReceived > before || late.jobs.Stats().LateCopiesDropped > 0
	})
	if got := late.state(t, res.ID); got != "" {
		j, _ := late.st.Job(res.ID)
		t.Fatalf("the late node holds the collected job again: %s %+v", got, j)
	}
	if n := late.jobs.Stats().LateCopiesDropped; n != 1 {
		t.Fatalf("%d late copies dropped, want 1", n)
	}
}

// TestGoneIDsBounded: the set of ended ids forgets the oldest past its
// bound, and drops exactly the copies of the ids it holds.
func TestGoneIDsBounded(t *testing.T) {
	var g goneIDs
	ids := make([]string, maxGoneIDs+10)
	for i := range ids {
		ids[i] = fmt.Sprintf("id-%d", i)
	}
	g.add(ids[:5])
	g.add(ids[:5]) // again: no second slot
	g.add(ids[5:])
	if len(g.set) != maxGoneIDs || len(g.ring) != maxGoneIDs {
		t.Fatalf("set %d, ring %d: want %d", len(g.set), len(g.ring), maxGoneIDs)
	}
	job := func(id string) replJob { return replJob{Job: &storage.Job{ID: id}} }
	in := []replJob{job(ids[0]), job(ids[9]), job(ids[10]), job("new"), job(ids[len(ids)-1])}
	heads := []replHeader{{first: 1}, {first: 2}, {first: 3}, {first: 4}, {first: 5}}
	out, oh, n := g.dropGone(in, heads)
	if n != 2 || len(out) != 3 || out[0].Job.ID != ids[0] || out[1].Job.ID != ids[9] || out[2].Job.ID != "new" {
		t.Fatalf("dropped %d, kept %v: want the 10 oldest forgotten, ids[10] and the newest dropped", n, out)
	}
	if oh[0].first != 1 || oh[1].first != 2 || oh[2].first != 4 {
		t.Fatalf("headers %v do not follow their copies", oh)
	}
}

// TestGoneIDsPairMarks: an id deleted at a collector's SETACK as a pair's
// is taken once, by that collector's DELJOB only; an id the set forgot
// has no mark left.
func TestGoneIDsPairMarks(t *testing.T) {
	var g goneIDs
	g.add([]string{"plain"})
	g.addPairs("A", []string{"a1", "a2"})
	g.addPairs("B", []string{"b1", "plain"}) // plain keeps its (no) mark
	if got := g.takePairs("B", []string{"a1", "plain", "unknown"}); got != nil {
		t.Fatalf("B took %v of A's, a plain and an unknown id: want none", got)
	}
	if got := g.takePairs("C", []string{"a1", "b1"}); got != nil {
		t.Fatalf("a node with no marks took %v", got)
	}
	if got := g.takePairs("A", []string{"a2", "b1", "a1"}); !slices.Equal(got, []bool{true, false, true}) {
		t.Fatalf("A took %v, want its two", got)
	}
	if got := g.takePairs("A", []string{"a1"}); got != nil || !g.has("a1") {
		t.Fatalf("A's second DELJOB of a1 took %v (has %v): want nothing taken, the id still gone", got, g.has("a1"))
	}
	ids := make([]string, maxGoneIDs)
	for i := range ids {
		ids[i] = fmt.Sprintf("id-%d", i)
	}
	g.add(ids) // forgets every id above
	if got := g.takePairs("B", []string{"b1"}); got != nil {
		t.Fatalf("a forgotten id was taken: %v", got)
	}
}
