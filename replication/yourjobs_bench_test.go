package replication

import (
	"testing"

	"github.com/diskque/diskque/queue"
)

// BenchmarkYourJobsCodec: one YOURJOBS of 100 jobs (100-byte bodies, two
// holders), encoded and decoded.
func BenchmarkYourJobsCodec(b *testing.B) {
	var jobs []queue.Replica
	for _, r := range replJobsForTest(100) {
		r.Job.Nodes = r.Job.Nodes[:2]
		jobs = append(jobs, queue.Replica{Job: r.Job, Body: r.Body})
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := decodeYourJobs(encodeYourJobs(jobs)); err != nil {
			b.Fatal(err)
		}
	}
}
