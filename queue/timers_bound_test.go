package queue

import (
	"testing"
	"time"
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
