package queue

import (
	"testing"

	"github.com/diskque/diskque/internal/cputime"
	"github.com/diskque/diskque/wal"
)

// BenchmarkRemoteNeedJobs is the giver's side of the federation drain
// below the bus: b.N at-least-once jobs queued (REPLICATE 1, 100-byte
// bodies), then taken by NEEDJOBS of 100 for another node until none is
// left. cpu-ns/job is the process's CPU time per job moved.
func BenchmarkRemoteNeedJobs(b *testing.B) {
	const asker = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	br := benchBroker(b, wal.SyncNever)
	body := make([]byte, 100)
	reqs := make([]AddRequest, 100)
	for i := range reqs {
		reqs[i] = AddRequest{Queue: "q", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
	}
	for added := 0; added < b.N; added += len(reqs) {
		for _, r := range br.AddJobs(reqs[:min(len(reqs), b.N-added)]) {
			if r.Err != nil {
				b.Fatal(r.Err)
			}
		}
	}
	b.ResetTimer()
	cpu0 := cputime.Used()
	moved := 0
	for moved < b.N {
		got, err := br.RemoteNeedJobs(asker, "q", 100)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("%d of %d moved, then none", moved, b.N)
		}
		moved += len(got)
	}
	b.StopTimer()
	b.ReportMetric(float64((cputime.Used()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/job")
}
