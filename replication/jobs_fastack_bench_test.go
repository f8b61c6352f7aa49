package replication

import (
	"flag"
	"syscall"
	"testing"
	"time"

	"github.com/diskque/diskque/queue"
)

var fastAckJobs = flag.Int("fastack.jobs", 0, "TestFastAckCost: REPLICATE 3 jobs to FASTACK (0: skip)")

// TestFastAckCost measures FASTACK on a 3-node in-process cluster (MemNetwork,
// real stores, fsync always): -fastack.jobs REPLICATE 3 jobs added (not
// measured), then FASTACKed on their origin 100 ids a command, until no
// node holds any of them. It logs the FASTACK commands' time per job, the
// time until every copy is gone and the process's CPU (user+system, all
// three nodes) per job. The same file runs against an older tree for an
// old/new comparison (bench/README.md).
//
//	go test -run TestFastAckCost -count=1 -fastack.jobs 20000 ./replication
func TestFastAckCost(t *testing.T) {
	n := *fastAckJobs
	if n == 0 {
		t.Skip("-fastack.jobs not set")
	}
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	ids := make([]string, 0, n)
	for len(ids) < n {
		reqs := make([]queue.AddRequest, min(500, n-len(ids)))
		for i := range reqs {
			reqs[i] = queue.AddRequest{Queue: "q", Body: []byte("body"), TTL: 3600, Retry: 60, Replicate: 3, Timeout: 5000}
		}
		for _, r := range origin.broker.AddJobs(reqs) {
			if r.Err != nil {
				t.Fatal(r.Err)
			}
			ids = append(ids, r.ID)
		}
	}
	for _, nd := range c.nodes {
		eventually(t, "every copy stored", func() bool { return nd.st.Stats().Jobs == int64(n) })
	}
	var ru0, ru1 syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru0)
	start := time.Now()
	for i := 0; i < n; i += 100 {
		if _, err := origin.broker.FastAck(ids[i:min(i+100, n)]); err != nil {
			t.Fatal(err)
		}
	}
	replied := time.Since(start)
	deadline := time.Now().Add(2 * time.Minute)
	for _, nd := range c.nodes {
		for nd.st.Stats().Jobs != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("copies left: %d", nd.st.Stats().Jobs)
			}
			time.Sleep(time.Millisecond)
		}
	}
	gone := time.Since(start)
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru1)
	cpu := time.Duration(ru1.Utime.Nano()+ru1.Stime.Nano()-ru0.Utime.Nano()-ru0.Stime.Nano()) * time.Nanosecond
	t.Logf("FASTACK %d jobs: replies %.2f µs/job, all copies gone %.2f µs/job, CPU %.2f µs/job (3 nodes)",
		n, float64(replied.Microseconds())/float64(n), float64(gone.Microseconds())/float64(n), float64(cpu.Microseconds())/float64(n))
}
