package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var (
	soakFor  = flag.Duration("soak", 0, "run TestKillLoopSoak this long (default: a few short cycles, as CI runs it)")
	soakSeed = flag.Uint64("soak.seed", 0, "seed of TestKillLoopSoak (0: from the clock)")
)

// soakJob is what the soak knows of one job it added.
type soakJob struct {
	body  string
	retry int
	// ackSent: an ACKJOB naming it was sent; acked: its reply came, at
	// ackedAt. deliveries counts the GETJOB replies that carried it.
	ackSent, acked bool
	ackedAt        time.Time
	deliveries     int
	// known: its ADDJOB's reply named it (else only a consumer saw it so
	// far, or its ADDJOB's reply was lost in a kill).
	known bool
}

// jobLocked returns the record of id, making it if needed. h.mu is held.
func (h *soakHistory) jobLocked(id string) *soakJob {
	j := h.jobs[id]
	if j == nil {
		j = &soakJob{}
		h.jobs[id] = j
	}
	return j
}

// soakHistory is every job an ADDJOB reply named, and what happened to it.
type soakHistory struct {
	mu   sync.Mutex
	jobs map[string]*soakJob
	// violations are broken guarantees, one line each.
	violations []string
	adds, acks int
}

func (h *soakHistory) violate(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.violations) < 20 {
		h.violations = append(h.violations, fmt.Sprintf(format, args...))
	}
}

// TestKillLoopSoak kills the server with SIGKILL again and again under
// appendfsync always while producers and consumers run, with segments small
// and the collector eager (64 KiB segments, rewrite below 90% live, every
// second, and a BGREWRITEAOF in every cycle), so that segments are rewritten
// and removed between kills and kills land in the middle of rewrites. After
// every restart: no job an ADDJOB reply named has vanished unless it was
// acked, no acked job is back, and no at-most-once job was delivered twice;
// at the end every at-least-once job was delivered. It fails if the
// collector never rewrote a segment. `go test -run TestKillLoopSoak
// ./cmd/diskque-server -args -soak=5m` runs it longer; by default it runs a
// few short cycles (about 5 s, 25 s under -race), more if the collector has
// not rewritten a segment yet (for at most 2 minutes more).
func TestKillLoopSoak(t *testing.T) {
	seed := *soakSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -soak.seed=%d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	s := startServer(t, "--appendfsync", "always", "--aof-segment-size", "64kb",
		"--gc-interval", "1", "--gc-min-live-ratio", "0.9")
	h := &soakHistory{jobs: map[string]*soakJob{}}
	deadline := time.Now().Add(*soakFor)
	cycles, minCycles := 0, 4
	var rewritten, removed int64
	// Until the collector has rewritten a segment too, within a bound: on
	// a loaded machine four cycles may add too few jobs to seal and
	// rewrite one (318 acknowledged adds in one -race run beside a CPU
	// hog), and the soak would not have tested what it is for.
	rewriteBy := time.Now().Add(2 * time.Minute)
	for cycles < minCycles || time.Now().Before(deadline) || rewritten == 0 && time.Now().Before(rewriteBy) {
		cycles++
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		for p := range 3 {
			wg.Add(1)
			go func() { defer wg.Done(); soakProduce(ctx, s, h, p) }()
		}
		for range 2 {
			wg.Add(1)
			go func() { defer wg.Done(); soakConsume(ctx, s, h, "soak") }()
		}
		// The load runs this long before the kill (a duration, not a
		// synchronisation), with a full collection (BGREWRITEAOF: a
		// checkpoint, then every sealed segment's live bodies copied
		// forward) started at a random moment, so that kills land before,
		// during and after rewrites; the background collector runs too.
		run := time.Duration(800+rng.IntN(1500)) * time.Millisecond
		time.Sleep(run / 2)
		if _, err := s.client(t).Do(context.Background(), "BGREWRITEAOF").Result(); err != nil {
			t.Logf("BGREWRITEAOF: %v", err)
		}
		time.Sleep(run / 2)
		st := info(t, s.client(t), "storage")
		r, _ := strconv.ParseInt(st["gc_segments_rewritten"], 10, 64)
		d, _ := strconv.ParseInt(st["gc_segments_removed"], 10, 64)
		rewritten, removed = rewritten+r, removed+d
		s.Kill()
		cancel()
		wg.Wait()
		s.Start()
		soakCheck(t, s, h)
		h.mu.Lock()
		bad := len(h.violations) > 0
		h.mu.Unlock()
		if bad {
			break
		}
	}
	soakDrain(t, s, h)
	h.mu.Lock()
	defer h.mu.Unlock()
	t.Logf("%d kill cycles: %d acknowledged adds, %d acknowledged acks, %d segments rewritten and %d removed by the collector",
		cycles, h.adds, h.acks, rewritten, removed)
	for _, v := range h.violations {
		t.Error(v)
	}
	if rewritten == 0 {
		t.Error("the collector never rewrote a segment: the soak did not test what it is for")
	}
}

// soakProduce adds jobs until ctx ends; every job whose ADDJOB got an id is
// recorded. Some are at-most-once (RETRY 0), the others retry after a second.
func soakProduce(ctx context.Context, s *daemon, h *soakHistory, p int) {
	c := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 2, MaxRetries: -1})
	defer c.Close()
	for i := 0; ctx.Err() == nil; i++ {
		retry := 1
		if i%5 == 0 {
			retry = 0
		}
		body := fmt.Sprintf("p%d-%d-%s", p, i, strings.Repeat("x", 100+i%400))
		queue := "soak"
		if i%20 == 7 {
			// Nobody consumes these before the drain: they keep
			// segments sparse but not dead, for the collector to rewrite.
			queue = "soak-keep"
		}
		args := []any{"ADDJOB", queue, body, 0, "RETRY", retry, "TTL", 3600}
		if retry == 0 {
			args = append(args, "REPLICATE", 1)
		}
		id, err := c.Do(ctx, args...).Text()
		if err != nil {
			continue // not acknowledged: the job may or may not exist
		}
		h.mu.Lock()
		j := h.jobLocked(id) // a consumer may have seen it first
		j.body, j.retry, j.known = body, retry, true
		h.adds++
		h.mu.Unlock()
	}
}

// soakConsume takes jobs from queues and acks them until ctx ends.
func soakConsume(ctx context.Context, s *daemon, h *soakHistory, queues ...any) {
	c := redis.NewClient(&redis.Options{Addr: s.addr, Protocol: 2, MaxRetries: -1})
	defer c.Close()
	for ctx.Err() == nil {
		sent := time.Now()
		v, err := c.Do(ctx, append([]any{"GETJOB", "TIMEOUT", 100, "COUNT", 10, "FROM"}, queues...)...).Result()
		if err != nil {
			continue
		}
		items, _ := v.([]any)
		var ids []any
		for _, it := range items {
			f, _ := it.([]any)
			if len(f) < 3 {
				continue
			}
			id, _ := f[1].(string)
			body, _ := f[2].(string)
			h.delivered(id, body, sent)
			ids = append(ids, id)
		}
		if len(ids) == 0 {
			continue
		}
		h.mu.Lock()
		for _, id := range ids {
			h.jobLocked(id.(string)).ackSent = true
		}
		h.mu.Unlock()
		if _, err := c.Do(ctx, append([]any{"ACKJOB"}, ids...)...).Result(); err == nil {
			now := time.Now()
			h.mu.Lock()
			for _, id := range ids {
				if j := h.jobLocked(id.(string)); !j.acked {
					j.acked, j.ackedAt = true, now
					h.acks++
				}
			}
			h.mu.Unlock()
		}
	}
}

// delivered records a GETJOB reply carrying id, for a GETJOB sent at sent,
// and checks it against what the history knows.
func (h *soakHistory) delivered(id, body string, sent time.Time) {
	h.mu.Lock()
	j := h.jobLocked(id)
	j.deliveries++
	if !j.known && j.body == "" {
		j.body = body // its producer has not recorded it yet (or lost the reply)
	}
	n, badBody, afterAck := j.deliveries, j.body != body, j.acked && sent.After(j.ackedAt)
	atMostOnce := j.known && j.retry == 0
	h.mu.Unlock()
	if badBody {
		h.violate("job %s delivered with another body", id)
	}
	if afterAck {
		h.violate("job %s delivered by a GETJOB sent after its ACKJOB was acknowledged", id)
	}
	if atMostOnce && n > 1 {
		h.violate("at-most-once job %s delivered %d times", id, n)
	}
}

// soakCheck asks the restarted server about every job of the history: an
// acked one must be gone, any other must still be there.
func soakCheck(t *testing.T, s *daemon, h *soakHistory) {
	c := s.client(t)
	h.mu.Lock()
	ids := make([]string, 0, len(h.jobs))
	for id := range h.jobs {
		ids = append(ids, id)
	}
	h.mu.Unlock()
	for _, id := range ids {
		h.mu.Lock()
		acked, ackSent, known := h.jobs[id].acked, h.jobs[id].ackSent, h.jobs[id].known
		h.mu.Unlock()
		_, err := c.Do(context.Background(), "SHOW", id).Result()
		switch {
		case acked && err == nil:
			h.violate("job %s is back after a restart though its ACKJOB was acknowledged", id)
		case known && !ackSent && errors.Is(err, redis.Nil):
			h.violate("job %s vanished: its ADDJOB was acknowledged and it was never acked", id)
		case err != nil && !errors.Is(err, redis.Nil):
			t.Fatalf("SHOW %s: %v", id, err)
		}
	}
}

// soakDrain consumes what is left until every at-least-once job was
// delivered at least once (they retry after a second, so the ones whose
// delivery was lost in a kill come back).
func soakDrain(t *testing.T, s *daemon, h *soakHistory) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); soakConsume(ctx, s, h, "soak", "soak-keep") }()
	waitUntil(t, 60*time.Second, "every at-least-once job delivered", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		for _, j := range h.jobs {
			if j.known && j.retry > 0 && j.deliveries == 0 && !j.acked {
				return false
			}
		}
		return true
	})
	cancel()
	<-done
}
