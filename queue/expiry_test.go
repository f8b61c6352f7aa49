package queue

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"
)

// addMany adds n jobs to queue in batches, all at the clock's current time:
// with the same TTL they all expire in the same millisecond.
func (f *fixture) addMany(queue string, n int, mod func(*AddRequest)) {
	f.t.Helper()
	reqs := make([]AddRequest, 0, 1000)
	for i := 0; i < n; i += cap(reqs) {
		reqs = reqs[:0]
		for k := i; k < min(n, i+cap(reqs)); k++ {
			r := AddRequest{Queue: queue, Body: fmt.Appendf(nil, "%s-%d", queue, k), TTL: 3600, Retry: 300}
			if mod != nil {
				mod(&r)
			}
			reqs = append(reqs, r)
		}
		for _, r := range f.b.AddJobs(reqs) {
			if r.Err != nil {
				f.t.Fatal(r.Err)
			}
		}
	}
}

// jobsLeft returns how many jobs the store holds per queue.
func (f *fixture) jobsLeft() map[string]int {
	f.t.Helper()
	left := map[string]int{}
	for after := ""; ; {
		jobs, err := f.b.ScanJobs(after, 1000)
		if err != nil {
			f.t.Fatal(err)
		}
		if len(jobs) == 0 {
			return left
		}
		for _, j := range jobs {
			left[j.Queue]++
		}
		after = jobs[len(jobs)-1].ID
	}
}

// TestMassExpiryFiresInBoundedChunks expires 20k jobs (3k under the race
// detector) due in the same
// millisecond, with delayed jobs waking in that millisecond among them, and
// a wheel that holds only a tenth of them (the loader refills it). One Tick
// must fire them all, in chunks of at most fireChunk events, with other
// clients served between chunks; none may be lost, including one a client
// takes while its expiry is pending.
func TestMassExpiryFiresInBoundedChunks(t *testing.T) {
	jobs, delayed, chunk, maxTimers := 20_000, 500, 300, 2_000
	if raceEnabled {
		jobs, delayed, chunk, maxTimers = 3_000, 100, 100, 500
	}
	f := newFixture(t, 64)
	f.mod = func(o *Options) { o.MaxTimers = maxTimers }
	f.restart()
	f.b.fireChunk = chunk
	start := f.clock.ms.Load()
	f.addMany("exp", jobs, nil)
	// Woken in the millisecond the others expire (and expiring an hour on).
	f.addMany("delayed", delayed, func(r *AddRequest) { r.TTL, r.Delay = 7200, 3600 })
	etime := start + 3600_000
	f.clock.set(etime)

	var chunks []int
	var taken string // an "exp" job a client took between chunks
	f.b.testChunkHook = func(fired int) {
		chunks = append(chunks, fired)
		f.b.mu.Lock()
		held := f.b.wheel.Len()
		f.b.mu.Unlock()
		if held > maxTimers {
			t.Errorf("chunk %d: the wheel holds %d events, more than MaxTimers", len(chunks), held)
		}
		if len(chunks) != 3 {
			return
		}
		// Another client, mid-expiry: it runs to completion while Tick
		// waits here, so it took the broker's lock between two chunks.
		type result struct {
			added string
			live  []Delivered
			exp   []Delivered
			err   error
		}
		done := make(chan result)
		go func() {
			var r result
			res := f.b.AddJobs([]AddRequest{{Queue: "live", Body: []byte("live"), TTL: 86400, Retry: 300}})
			if r.err = res[0].Err; r.err == nil {
				r.added = res[0].ID
				r.live, r.err = f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"live"}, Count: 1, NoHang: true})
			}
			if r.err == nil {
				r.exp, r.err = f.b.GetJobs(context.Background(), GetRequest{Queues: []string{"exp"}, Count: 1, NoHang: true})
			}
			done <- r
		}()
		r := <-done
		switch {
		case r.err != nil:
			t.Fatalf("client between chunks: %v", r.err)
		case len(r.live) != 1 || r.live[0].ID != r.added:
			t.Fatalf("GETJOB between chunks got %+v, want %s", r.live, r.added)
		case len(r.exp) != 1:
			t.Fatalf("GETJOB of a job yet to expire got %+v", r.exp)
		}
		taken = r.exp[0].ID
		if n := f.b.Stats().JobsExpired; n >= int64(jobs) || n > int64(3*chunk) {
			t.Fatalf("%d jobs expired after 3 chunks", n)
		}
	}
	if err := f.b.Tick(etime); err != nil {
		t.Fatal(err)
	}
	f.b.testChunkHook = nil

	total := 0
	for i, n := range chunks {
		if n > chunk {
			t.Fatalf("chunk %d fired %d events, more than %d", i, n, chunk)
		}
		total += n
	}
	if total != jobs+delayed || len(chunks) < (jobs+delayed)/chunk {
		t.Fatalf("%d chunks fired %d events, want %d", len(chunks), total, jobs+delayed)
	}
	if taken == "" {
		t.Fatal("no client ran between chunks")
	}
	if _, _, err := f.b.Job(taken); !errors.Is(err, ErrNoJob) {
		t.Fatalf("the job taken mid-expiry is still there: %v", err)
	}
	if st := f.b.Stats(); st.JobsExpired != int64(jobs) {
		t.Fatalf("%d jobs expired, want %d", st.JobsExpired, jobs)
	}
	left := f.jobsLeft()
	if left["exp"] != 0 || left["delayed"] != delayed || left["live"] != 1 || len(left) != 2 {
		t.Fatalf("jobs left by queue: %v", left)
	}
	if n := f.b.QueueLen("delayed"); n != int64(delayed) {
		t.Fatalf("%d delayed jobs queued, want %d", n, delayed)
	}
	// Nothing is left due: another Tick fires nothing.
	chunks = chunks[:0]
	f.b.testChunkHook = func(fired int) { chunks = append(chunks, fired) }
	if err := f.b.Tick(etime); err != nil || len(chunks) != 1 || chunks[0] != 0 {
		t.Fatalf("second Tick: %v, chunks %v", err, chunks)
	}
}

// TestCloseBetweenExpiryChunks closes the broker after the first chunk of a
// mass expiry: Tick stops with ErrClosed, and after a restart the rest
// expire; none is lost.
func TestCloseBetweenExpiryChunks(t *testing.T) {
	const jobs, chunk = 1_000, 100
	f := newFixture(t, 64)
	f.b.fireChunk = chunk
	start := f.clock.ms.Load()
	f.addMany("exp", jobs, nil)
	etime := start + 3600_000

	// The test drives the timers itself: no Run (it would tick too, and
	// once the wheel's time has passed etime any Tick goes on with the
	// expiry), so Close has no Run to wait for.
	closed := false
	f.b.testChunkHook = func(fired int) {
		if !closed {
			closed = true
			f.b.Close()
		}
	}
	if err := f.b.Tick(etime); !errors.Is(err, ErrClosed) {
		t.Fatalf("Tick after Close between chunks: %v", err)
	}
	if n := f.b.Stats().JobsExpired; n != chunk {
		t.Fatalf("%d jobs expired before Close, want %d", n, chunk)
	}
	f.restart()
	f.clock.set(etime)
	if err := f.b.Tick(etime); err != nil {
		t.Fatal(err)
	}
	if n := f.b.Stats().JobsExpired; n != jobs-chunk {
		t.Fatalf("%d jobs expired after the restart, want %d", n, jobs-chunk)
	}
	if left := f.jobsLeft(); len(left) != 0 {
		t.Fatalf("jobs left: %v", left)
	}
}

// TestDelayAndTTLDueInOneTick: a job whose delay and TTL are both due when
// Tick runs is queued and then expired by that one Tick (one change per job
// per chunk; the TTL goes back to the wheel and fires in the next chunk).
func TestDelayAndTTLDueInOneTick(t *testing.T) {
	f := newFixture(t, 64)
	start := f.clock.ms.Load()
	id := f.add("q", "late", func(r *AddRequest) { r.TTL, r.Delay = 10, 5 })
	var chunks []int
	f.b.testChunkHook = func(fired int) { chunks = append(chunks, fired) }
	if err := f.b.Tick(start + 20_000); err != nil {
		t.Fatal(err)
	}
	if _, _, err := f.b.Job(id); !errors.Is(err, ErrNoJob) {
		t.Fatalf("job still there after its TTL: %v", err)
	}
	if st := f.b.Stats(); st.JobsExpired != 1 || len(chunks) != 2 {
		t.Fatalf("%d expired in chunks %v", st.JobsExpired, chunks)
	}
}

// TestNextChunk: chunks shrink toward chunkHold when events are slow, grow
// back at most twofold, and stay within [minChunk, most].
func TestNextChunk(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		last, fired int
		hold        time.Duration
		most, want  int
	}{
		{256, 256, 50 * ms, 256, 25},    // 10x too slow
		{256, 256, 500 * ms, 256, 16},   // never below minChunk
		{25, 25, 1 * ms, 256, 50},       // fast again: at most double
		{200, 200, 1 * ms, 256, 256},    // never above most
		{256, 0, 0, 256, 256},           // nothing fired: as before
		{100, 100, 100 * ms, 10, 10},    // a most below minChunk wins
		{256, 100, chunkHold, 256, 100}, // on target
	} {
		if got := nextChunk(c.last, c.fired, c.hold, c.most); got != c.want {
			t.Errorf("nextChunk(%d, %d, %v, %d) = %d, want %d", c.last, c.fired, c.hold, c.most, got, c.want)
		}
	}
}
