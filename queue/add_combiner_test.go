package queue

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestAddCombinerMergesWaitingCalls: calls that arrive while a round runs
// are applied together in the next round, each exactly once, in arrival
// order, and no round exceeds maxAddRound requests (unless one call alone
// does).
func TestAddCombinerMergesWaitingCalls(t *testing.T) {
	var c addCombiner
	release := make(chan struct{})
	var mu sync.Mutex
	var rounds [][]*addCall
	apply := func(calls []*addCall) {
		mu.Lock()
		first := len(rounds) == 0
		rounds = append(rounds, calls)
		mu.Unlock()
		if first {
			<-release // hold the first round while the others queue up
		}
		for _, call := range calls {
			for i := range call.out {
				call.out[i].ID = fmt.Sprint(len(call.reqs))
			}
		}
	}
	sizes := []int{1, 300, 500, 200, 1, maxAddRound + 10, 2} // 1001 ≤ maxAddRound
	calls := make([]*addCall, len(sizes))
	var wg sync.WaitGroup
	start := func(i int) {
		calls[i] = &addCall{reqs: make([]AddRequest, sizes[i]), out: make([]AddResult, sizes[i])}
		wg.Go(func() { c.run(calls[i], apply) })
	}
	start(0)
	waitFor(t, "the first round never started", func() bool { mu.Lock(); defer mu.Unlock(); return len(rounds) == 1 })
	for i := 1; i < len(sizes); i++ {
		start(i)
		// One at a time, so that arrival order is known.
		waitFor(t, "a call never queued behind the round", func() bool { c.mu.Lock(); defer c.mu.Unlock(); return len(c.waiting) == i })
	}
	close(release)
	wg.Wait()

	var got [][]int
	seen := map[*addCall]bool{}
	for _, r := range rounds {
		var ids []int
		total := 0
		for _, call := range r {
			if seen[call] {
				t.Fatalf("a call was applied twice")
			}
			seen[call] = true
			total += len(call.reqs)
			for i := range sizes {
				if calls[i] == call {
					ids = append(ids, i)
				}
			}
		}
		if total > maxAddRound && len(r) > 1 {
			t.Fatalf("a round of %d calls holds %d requests, over %d", len(r), total, maxAddRound)
		}
		got = append(got, ids)
	}
	want := "[[0] [1 2 3 4] [5] [6]]"
	if fmt.Sprint(got) != want {
		t.Fatalf("rounds %v, want %s", got, want)
	}
	for i, call := range calls {
		for _, r := range call.out {
			if r.ID != fmt.Sprint(sizes[i]) {
				t.Fatalf("call %d returned before its round applied it: %+v", i, r)
			}
		}
	}
	if c.running || len(c.waiting) != 0 {
		t.Fatalf("the combiner did not go idle: running %v, %d waiting", c.running, len(c.waiting))
	}
}

// TestAddJobsConcurrentCallsAllLand: many goroutines adding at once through
// the combiner each get their own ids, and every job is in the store.
func TestAddJobsConcurrentCallsAllLand(t *testing.T) {
	f := newFixture(t, 8)
	const workers, perCall, callsEach = 16, 5, 20
	var wg sync.WaitGroup
	ids := make([][]string, workers)
	for w := range workers {
		wg.Go(func() {
			for range callsEach {
				reqs := make([]AddRequest, perCall)
				for i := range reqs {
					reqs[i] = AddRequest{Queue: fmt.Sprintf("q%d", w%3), Body: []byte(fmt.Sprintf("w%d", w)), TTL: 3600, Retry: 60, Replicate: 1}
				}
				for _, r := range f.b.AddJobs(reqs) {
					if r.Err != nil {
						t.Error(r.Err)
						return
					}
					ids[w] = append(ids[w], r.ID)
				}
			}
		})
	}
	wg.Wait()
	seen := map[string]bool{}
	for w, list := range ids {
		if len(list) != perCall*callsEach {
			t.Fatalf("worker %d got %d ids, want %d", w, len(list), perCall*callsEach)
		}
		for _, id := range list {
			if seen[id] {
				t.Fatalf("id %s handed out twice", id)
			}
			seen[id] = true
			j, err := f.st.Job(id)
			if err != nil || j == nil {
				t.Fatalf("job %s: %v, %v", id, j, err)
			}
			if body, err := f.st.Body(j); err != nil || string(body) != fmt.Sprintf("w%d", w) {
				t.Fatalf("job %s of worker %d has body %q, %v", id, w, body, err)
			}
		}
	}
	var total int64
	for q := range 3 {
		total += f.st.QueueLen(fmt.Sprintf("q%d", q))
	}
	if total != workers*perCall*callsEach {
		t.Fatalf("queues hold %d jobs, want %d", total, workers*perCall*callsEach)
	}
}

// waitFor polls cond until it holds, or fails the test with what after a
// deadline.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(what)
		}
		time.Sleep(time.Millisecond)
	}
}
