package queue

import (
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// TestLiveTimersBoundedByMaxTimers: timers that arrive with jobs (not from
// the loader) respect MaxTimers too. A thousand deliveries, each with a
// retry inside the horizon, leave at most MaxTimers events in the wheel
// (the rest wait on disk: the cursor moves back), and every one of them
// still requeues its job once due.
func TestLiveTimersBoundedByMaxTimers(t *testing.T) {
	const jobs, maxTimers = 1000, 100
	f := newFixture(t, 64)
	f.mod = func(o *Options) { o.MaxTimers = maxTimers }
	f.restart()
	if err := f.b.Tick(f.clock.ms.Load()); err != nil {
		t.Fatal(err)
	}
	f.addMany("q", jobs, func(r *AddRequest) { r.Retry = 60 })
	if got := len(f.get(jobs, "q")); got != jobs {
		t.Fatalf("delivered %d jobs, want %d", got, jobs)
	}
	held := func() int {
		f.b.mu.Lock()
		defer f.b.mu.Unlock()
		return f.b.wheel.Len()
	}
	if n := held(); n > maxTimers {
		t.Fatalf("after %d deliveries the wheel holds %d events, more than MaxTimers %d", jobs, n, maxTimers)
	}
	f.b.testChunkHook = func(int) {
		if n := held(); n > maxTimers {
			t.Errorf("the wheel holds %d events, more than MaxTimers %d", n, maxTimers)
		}
	}
	now := f.clock.advance(61 * time.Second)
	if err := f.b.Tick(now); err != nil {
		t.Fatal(err)
	}
	if n := f.st.QueueLen("q"); n != jobs {
		t.Fatalf("%d of %d jobs requeued after their retry", n, jobs)
	}
}

// TestFullWheelOfLaterEventsFiresAnEarlierOne: a wheel full (MaxTimers) of
// events not due yet, and a job arriving with an earlier one: the wheel
// takes none and the cursor moves back before it. Once that event is due,
// Tick must load and fire it — the later events the wheel holds past the
// cursor are on disk too, and give up their room — and return. It used to
// loop for good: the loader found no room, nothing in the wheel was due,
// and the cursor, due by now, said more was to come.
func TestFullWheelOfLaterEventsFiresAnEarlierOne(t *testing.T) {
	const maxTimers = 40
	f := newFixture(t, 64)
	f.mod = func(o *Options) { o.MaxTimers = maxTimers }
	f.restart()
	if err := f.b.Tick(f.clock.ms.Load()); err != nil {
		t.Fatal(err)
	}
	f.addMany("later", maxTimers, func(r *AddRequest) { r.Delay = 60 })
	early := f.add("early", "due first", func(r *AddRequest) { r.Delay = 1 })
	ticked := make(chan error, 1)
	go func() { ticked <- f.b.Tick(f.clock.advance(2 * time.Second)) }()
	select {
	case err := <-ticked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		f.b.mu.Lock()
		held, cursor := f.b.wheel.Len(), f.b.cursor.Due
		f.b.mu.Unlock()
		t.Fatalf("Tick did not return within 10 s (the wheel holds %d events, the cursor is %d ms before now)",
			held, f.clock.ms.Load()-cursor)
	}
	if j, err := f.st.Job(early); err != nil || j.State != storage.StateQueued {
		t.Fatalf("2 s after its DELAY 1 the job is %+v (%v), want queued", j, err)
	}
	if n := f.st.QueueLen("later"); n != 0 {
		t.Fatalf("%d jobs of DELAY 60 queued after 2 s", n)
	}
	// The later ones still fire, once each, at their time.
	if err := f.b.Tick(f.clock.advance(60 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := f.st.QueueLen("later"); n != maxTimers {
		t.Fatalf("%d of %d jobs of DELAY 60 queued after 62 s", n, maxTimers)
	}
}

// TestFullClusterWheelOfLaterRetriesFiresAnEarlierOne is the test above in
// a cluster, with the wheel full of the retry events of delivered
// REPLICATE 1 jobs. Such a retry has no WILLQUEUE companion (no other node
// holds the job), and a companion-less retry whose companion is not due
// yet was made without one: it is on disk like any other and must make way
// too. Keeping every companion-less retry, as if its companion had fired,
// held the earlier event back until the later retries fired (up to the
// loader's horizon) — here, still delayed 2 s after its DELAY 1.
func TestFullClusterWheelOfLaterRetriesFiresAnEarlierOne(t *testing.T) {
	const maxTimers = 40
	rc := &recCluster{willQueue: map[string]int{}, queued: map[string]int{}}
	f := newFixture(t, 64)
	f.mod = func(o *Options) { o.MaxTimers, o.Cluster = maxTimers, rc }
	f.restart()
	if err := f.b.Tick(f.clock.ms.Load()); err != nil {
		t.Fatal(err)
	}
	f.addMany("later", maxTimers, func(r *AddRequest) { r.Replicate, r.Retry = 1, 300 })
	if got := len(f.get(maxTimers, "later")); got != maxTimers {
		t.Fatalf("delivered %d jobs, want %d", got, maxTimers)
	}
	early := f.add("early", "due first", func(r *AddRequest) { r.Replicate, r.Delay = 1, 1 })
	if err := f.b.Tick(f.clock.advance(2 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if j, err := f.st.Job(early); err != nil || j.State != storage.StateQueued {
		t.Fatalf("2 s after its DELAY 1 the job is %+v (%v), want queued", j, err)
	}
	// The later retries still fire, once each, at their time.
	if err := f.b.Tick(f.clock.advance(300 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if n := f.st.QueueLen("later"); n != maxTimers {
		t.Fatalf("%d of %d delivered jobs requeued after their RETRY 300", n, maxTimers)
	}
}
