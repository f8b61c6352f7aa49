package queue

import (
	"flag"
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
	br := giverBroker(b)
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

var benchNoDelJob = flag.Bool("bench.nodeljob", false, "BenchmarkGiverDrain: no DELJOBs")

// BenchmarkGiverDrain is the giver's whole share of the federation drain
// below the bus: b.N at-least-once jobs queued (REPLICATE 1, 100-byte
// bodies), then, until none is left, a NEEDJOBS of 100 for another node
// and one run of collection messages, applied as one RemoteCollect and
// waited for, as a link read's run is: the asker's SETACKs for the jobs
// just moved (mayhave 2: the pair's delete) and its DELJOBs for those of
// the round before (which find nothing left). cpu-ns/job is the process's
// CPU time per job moved and collected.
func BenchmarkGiverDrain(b *testing.B) {
	const asker = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
	br := giverBroker(b)
	b.ResetTimer()
	cpu0 := cputime.Used()
	moved := 0
	var last []CollectOp // the DELJOBs of the round before
	for moved < b.N {
		got, err := br.RemoteNeedJobs(asker, "q", 100)
		if err != nil {
			b.Fatal(err)
		}
		if len(got) == 0 {
			b.Fatalf("%d of %d moved, then none", moved, b.N)
		}
		moved += len(got)
		ops := make([]CollectOp, 0, len(got)+len(last))
		for _, r := range got {
			ops = append(ops, CollectOp{ID: r.Job.ID, Pair: asker})
		}
		if !*benchNoDelJob {
			ops = append(ops, last...)
		}
		res, durable, err := br.RemoteCollect(ops)
		if err == nil {
			err = durable()
		}
		if err != nil {
			b.Fatal(err)
		}
		last = last[:0]
		for i, r := range res[:len(got)] {
			if !r.Deleted {
				b.Fatalf("job %s not deleted as a pair", ops[i].ID)
			}
			last = append(last, CollectOp{ID: ops[i].ID, Delete: true})
		}
	}
	b.StopTimer()
	b.ReportMetric(float64((cputime.Used()-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/job")
}

// giverBroker is a broker holding b.N at-least-once jobs queued in "q"
// (REPLICATE 1, 100-byte bodies), as a federation drain's giver starts.
func giverBroker(b *testing.B) *Broker {
	b.Helper()
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
	return br
}
