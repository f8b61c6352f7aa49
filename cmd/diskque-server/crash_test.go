package main

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCrashRecovery kills the server (SIGKILL) under load with appendfsync
// always and restarts it on the same directory. Every ADDJOB that got an id
// must survive, each producer's jobs must come out in the order it added
// them, and the delayed, in-flight and at-most-once jobs and the pause set
// before the kill must behave as if there had been no crash (SPEC.md
// "Persistence and restart").
//
// Not parallel: it loads both cores, and it runs alone before the parallel
// tests start.
func TestCrashRecovery(t *testing.T) {
	s := startServer(t, "--appendfsync", "always")
	c := s.client(t)

	const (
		producers = 8
		target    = 2000 // acknowledged adds before the kill
		queue     = "crash"
	)
	load := startProducers(t, s, producers, queue)
	defer load.stop()
	waitUntil(t, 60*time.Second, fmt.Sprintf("%d acknowledged ADDJOBs", target), func() bool {
		return load.total.Load() >= target
	})

	// While the producers run: a delayed job, an in-flight job, a delivered
	// at-most-once job and a pause.
	beforeAdd := time.Now()
	delayed := addJob(t, c, "crash-delayed", "delayed", "DELAY", 3)
	afterAdd := time.Now()
	inflight := addJob(t, c, "crash-inflight", "inflight", "RETRY", 2)
	beforeGet := time.Now()
	if got := getJobs(t, c, "FROM", "crash-inflight"); len(got) != 1 || got[0].ID != inflight {
		t.Fatalf("GETJOB crash-inflight = %v", got)
	}
	afterGet := time.Now()
	once := addJob(t, c, "crash-amo", "once", "RETRY", 0)
	if got := getJobs(t, c, "FROM", "crash-amo"); len(got) != 1 || got[0].ID != once {
		t.Fatalf("GETJOB crash-amo = %v", got)
	}
	doStr(t, c, "PAUSE", "crash-paused", "in")

	s.Kill()
	killed := time.Now()
	load.stop()
	t.Logf("killed after %d acknowledged ADDJOBs", load.total.Load())

	s.Start()
	restarted := time.Now()
	t.Logf("restart took %v", restarted.Sub(killed))
	c = s.client(t)

	// Watch the delayed and in-flight jobs from now on.
	type fired struct{ delayed, inflight time.Time }
	watch := make(chan fired, 1)
	wc := s.client(t)
	go func() {
		var f fired
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) && (f.delayed.IsZero() || f.inflight.IsZero()) {
			now := time.Now()
			if f.delayed.IsZero() && wc.Do(context.Background(), "QLEN", "crash-delayed").Val() == int64(1) {
				f.delayed = now
			}
			if f.inflight.IsZero() && wc.Do(context.Background(), "QLEN", "crash-inflight").Val() == int64(1) {
				f.inflight = now
			}
			time.Sleep(5 * time.Millisecond) // poll interval
		}
		watch <- f
	}()

	checkSurvivors(t, c, queue, load.acked)

	if st := doStr(t, c, "PAUSE", "crash-paused", "state"); st != "in" {
		t.Errorf("PAUSE state after the crash = %q, want in", st)
	}

	// Delayed and in-flight jobs fire near their original times.
	const tolerance = 2 * time.Second
	f := <-watch
	if f.delayed.IsZero() || f.inflight.IsZero() {
		t.Fatalf("after the crash the delayed job fired at %v and the in-flight job at %v (zero: never)", f.delayed, f.inflight)
	}
	t.Logf("delayed job fired %v after its ADDJOB, in-flight job requeued %v after its GETJOB",
		f.delayed.Sub(beforeAdd), f.inflight.Sub(beforeGet))
	if f.delayed.Before(beforeAdd.Add(3*time.Second-100*time.Millisecond)) || f.delayed.After(afterAdd.Add(3*time.Second+tolerance)) {
		t.Errorf("DELAY 3 job queued %v after its ADDJOB, want 3s (+%v)", f.delayed.Sub(beforeAdd), tolerance)
	}
	if f.inflight.Before(beforeGet.Add(1500*time.Millisecond-100*time.Millisecond)) ||
		f.inflight.After(afterGet.Add(2500*time.Millisecond+tolerance)) {
		t.Errorf("RETRY 2 in-flight job requeued %v after its GETJOB, want 2s ± 0.5s (+%v)", f.inflight.Sub(beforeGet), tolerance)
	}
	if got := getJobs(t, c, "WITHCOUNTERS", "FROM", "crash-inflight"); len(got) != 1 || got[0].ID != inflight || got[0].AdditionalDeliveries != 1 {
		t.Errorf("requeued in-flight job = %+v, want %s with additional-deliveries 1", got, inflight)
	}
	if got := getJobs(t, c, "FROM", "crash-delayed"); len(got) != 1 || got[0].ID != delayed {
		t.Errorf("delayed job = %+v, want %s", got, delayed)
	}

	// The delivered at-most-once job is never delivered again.
	if m := show(t, c, once); m == nil || m["state"] != "active" {
		t.Errorf("at-most-once job after the crash: %v, want active", m)
	}
	if n := doInt(t, c, "QLEN", "crash-amo"); n != 0 {
		t.Errorf("at-most-once job queued again after the crash: QLEN %d", n)
	}
}

// body is producer p's seq-th job body.
func body(p, seq int) string { return fmt.Sprintf("p%d-%06d", p, seq) }

// TestCrashEverysec: with appendfsync everysec a process crash loses
// nothing either (the OS has every write): acknowledged adds survive a
// SIGKILL, and so do deliveries followed by acknowledged writes (their
// records come first in the AOF; a GETJOB of at-least-once jobs does not
// wait for its own: TestCrashRightAfterGetJob).
func TestCrashEverysec(t *testing.T) {
	s := startServer(t, "--appendfsync", "everysec")
	c := s.client(t)
	var delivered []string
	for i := range 50 {
		addJob(t, c, "ce-delivered", strconv.Itoa(i))
	}
	for _, j := range getJobs(t, c, "COUNT", 50, "FROM", "ce-delivered") {
		delivered = append(delivered, j.ID)
	}
	load := startProducers(t, s, 4, "ce")
	defer load.stop()
	waitUntil(t, 60*time.Second, "500 acknowledged ADDJOBs", func() bool { return load.total.Load() >= 500 })
	s.Kill()
	load.stop()
	t.Logf("killed after %d acknowledged ADDJOBs", load.total.Load())

	s.Start()
	c = s.client(t)
	checkSurvivors(t, c, "ce", load.acked)
	if n := doInt(t, c, "QLEN", "ce-delivered"); n != 0 {
		t.Errorf("%d delivered jobs queued again right after the crash: deliveries lost", n)
	}
	for _, id := range delivered {
		if m := show(t, c, id); m == nil || m["state"] != "active" {
			t.Fatalf("delivered job %s after the crash: %v, want active", id, m)
		}
	}
}

// producers add jobs to one queue from several connections, each in a
// loop, until stopped or an ADDJOB fails.
type producers struct {
	acked [][]string // per producer, the ids it got, in order
	total atomic.Int64
	done  chan struct{}
	once  sync.Once
	wg    sync.WaitGroup
}

// startProducers starts n producers adding body(p, seq) to queue.
func startProducers(t *testing.T, s *daemon, n int, queue string) *producers {
	l := &producers{acked: make([][]string, n), done: make(chan struct{})}
	for p := range n {
		pc := s.client(t)
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for seq := 0; ; seq++ {
				select {
				case <-l.done:
					return
				default:
				}
				id, err := pc.Do(context.Background(), "ADDJOB", queue, body(p, seq), 0).Text()
				if err != nil {
					// The server died or is stopping (a graceful stop
					// refuses new commands), or this is a bug: either way
					// the add is unknown and the producer stops.
					var rerr redis.Error
					if errors.As(err, &rerr) && rerr.Error() != "ERR server is shutting down" {
						t.Errorf("producer %d seq %d: error reply -%v", p, seq, err)
					}
					return
				}
				l.acked[p] = append(l.acked[p], id)
				l.total.Add(1)
			}
		}()
	}
	return l
}

// stop stops the producers and waits for them.
func (l *producers) stop() {
	l.once.Do(func() { close(l.done) })
	l.wg.Wait()
}

// checkSurvivors checks that every acknowledged job is in queue and that
// GETJOB delivers each producer's jobs in the order it added them (the one
// add in flight at a crash may or may not be there). It drains the queue.
func checkSurvivors(t *testing.T, c *redis.Client, queue string, acked [][]string) {
	t.Helper()
	n := int64(0)
	for _, ids := range acked {
		n += int64(len(ids))
	}
	if qlen := doInt(t, c, "QLEN", queue); qlen < n || qlen > n+int64(len(acked)) {
		t.Errorf("QLEN after the crash = %d, want %d acknowledged (+ at most %d unacknowledged)", qlen, n, len(acked))
	}
	missing := 0
	for p, ids := range acked {
		pipe := c.Pipeline()
		cmds := make([]*redis.Cmd, len(ids))
		for i, id := range ids {
			cmds[i] = pipe.Do(context.Background(), "SHOW", id)
		}
		_, _ = pipe.Exec(context.Background())
		for i, cmd := range cmds {
			v, err := cmd.Result()
			if errors.Is(err, redis.Nil) {
				if missing++; missing <= 10 {
					t.Errorf("producer %d seq %d: acknowledged job %s lost in the crash", p, i, ids[i])
				}
				continue
			}
			if err != nil {
				t.Fatalf("SHOW %s: %v", ids[i], err)
			}
			arr := v.([]any)
			if arr[5] != "queued" || arr[29] != body(p, i) {
				t.Errorf("producer %d seq %d: SHOW state %v body %v, want queued %q", p, i, arr[5], arr[29], body(p, i))
			}
		}
	}
	if missing > 0 {
		t.Errorf("%d of %d acknowledged jobs lost", missing, n)
	}

	next := make([]int, len(acked)) // next expected seq per producer
	extra := 0
	for {
		got := getJobs(t, c, "COUNT", 1000, "NOHANG", "FROM", queue)
		if got == nil {
			break
		}
		for _, j := range got {
			var p, seq int
			if _, err := fmt.Sscanf(j.Body, "p%d-%d", &p, &seq); err != nil || p < 0 || p >= len(acked) {
				t.Fatalf("unexpected body %q", j.Body)
			}
			switch {
			case seq == next[p] && seq < len(acked[p]):
				if j.ID != acked[p][seq] {
					t.Errorf("producer %d seq %d: id %s, want %s", p, seq, j.ID, acked[p][seq])
				}
				next[p]++
			case seq == len(acked[p]) && next[p] == seq:
				// The add in flight at the kill: allowed to have survived.
				extra++
				next[p]++
			default:
				t.Fatalf("producer %d: got seq %d, want %d (acknowledged %d): out of order or duplicated",
					p, seq, next[p], len(acked[p]))
			}
		}
	}
	for p := range acked {
		if next[p] < len(acked[p]) {
			t.Errorf("producer %d: GETJOB delivered %d of its %d acknowledged jobs", p, next[p], len(acked[p]))
		}
	}
	t.Logf("%d acknowledged jobs survived in order; %d unacknowledged adds survived too", n, extra)
}

// TestCrashRightAfterGetJob: a GETJOB of an at-least-once job replies
// without waiting for its delivery's record (queue finishReply), an
// at-most-once job's GETJOB only once that record is fsynced. A SIGKILL
// right after each reply, under either fsync policy: the at-most-once job
// is never delivered again, and the at-least-once job is not lost — queued
// again (its delivery record did not make it) or in flight, it is delivered
// once more.
func TestCrashRightAfterGetJob(t *testing.T) {
	for _, mode := range []string{"everysec", "always"} {
		t.Run(mode, func(t *testing.T) {
			s := startServer(t, "--appendfsync", mode)
			c := s.client(t)
			once := addJob(t, c, "cg-amo", "once", "RETRY", 0)
			alo := addJob(t, c, "cg-alo", "again", "RETRY", 1)
			if got := getJobs(t, c, "NOHANG", "FROM", "cg-amo"); len(got) != 1 || got[0].ID != once {
				t.Fatalf("GETJOB cg-amo = %v", got)
			}
			if got := getJobs(t, c, "NOHANG", "FROM", "cg-alo"); len(got) != 1 || got[0].ID != alo {
				t.Fatalf("GETJOB cg-alo = %v", got)
			}
			s.Kill()

			s.Start()
			c = s.client(t)
			if m := show(t, c, once); m == nil || m["state"] != "active" {
				t.Errorf("at-most-once job after the crash: %v, want active", m)
			}
			if n := doInt(t, c, "QLEN", "cg-amo"); n != 0 {
				t.Errorf("at-most-once job queued again after the crash: QLEN %d", n)
			}
			m := show(t, c, alo)
			if m == nil || m["state"] != "active" && m["state"] != "queued" {
				t.Fatalf("at-least-once job after the crash: %v, want active or queued", m)
			}
			t.Logf("at-least-once job after the crash: %v", m["state"])
			var got []job
			waitUntil(t, 10*time.Second, "the at-least-once job delivered again", func() bool {
				got = getJobs(t, c, "NOHANG", "FROM", "cg-alo")
				return len(got) > 0
			})
			if len(got) != 1 || got[0].ID != alo || got[0].Body != "again" {
				t.Fatalf("GETJOB cg-alo after the crash = %v", got)
			}
			if got := getJobs(t, c, "NOHANG", "FROM", "cg-amo"); len(got) != 0 {
				t.Fatalf("GETJOB cg-amo after the crash = %v, want nothing", got)
			}
		})
	}
}
