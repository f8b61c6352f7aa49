package queue

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/cputime"
	"github.com/diskque/diskque/wal"
)

// BenchmarkConsume100: the vs-disque consume workload below RESP: b.N jobs
// queued, then 4 consumers GETJOB COUNT 100 + ACKJOB until empty.
func BenchmarkConsume100(b *testing.B) {
	br := benchBroker(b, wal.SyncNever)
	go br.Run()
	body := make([]byte, 100)
	reqs := make([]AddRequest, 256)
	for i := range reqs {
		reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
	}
	for n := 0; n < b.N; n += len(reqs) {
		br.AddJobs(reqs)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Used()
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, 0, 100)
			for next.Add(100) <= int64(b.N)+99 {
				jobs, err := br.GetJobs(context.Background(), GetRequest{Queues: []string{"bench"}, Count: 100, NoHang: true})
				if err != nil {
					b.Error(err)
					return
				}
				ids = ids[:0]
				for _, j := range jobs {
					ids = append(ids, j.ID)
				}
				if _, err := br.Ack(ids); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
}

// BenchmarkGetAck1: the vs-disque getack1 workload below RESP: b.N jobs
// queued, then 50 consumers GETJOB COUNT 1 + ACKJOB one job at a time.
func BenchmarkGetAck1(b *testing.B) {
	br := benchBroker(b, wal.SyncNever)
	go br.Run()
	body := make([]byte, 100)
	reqs := make([]AddRequest, 256)
	for i := range reqs {
		reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
	}
	for n := 0; n < b.N; n += len(reqs) {
		br.AddJobs(reqs)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	gets0 := br.st.Stats().IndexGets
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Used()
	for c := 0; c < 50; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				jobs, err := br.GetJobs(context.Background(), GetRequest{Queues: []string{"bench"}, Count: 1, NoHang: true})
				if err != nil || len(jobs) != 1 {
					b.Error(len(jobs), err)
					return
				}
				if _, err := br.Ack([]string{jobs[0].ID}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
	b.ReportMetric(float64(br.st.Stats().IndexGets-gets0)/float64(b.N), "pebble-gets/job")
}

// BenchmarkMixed100: the vs-disque mixed workload below RESP: 8 producers
// adding 16 at a time and 4 consumers GETJOB COUNT 100 (blocking) + ACKJOB
// at once, b.N jobs through.
func BenchmarkMixed100(b *testing.B) {
	br := benchBroker(b, wal.SyncNever)
	go br.Run()
	body := make([]byte, 100)
	var added, got atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start, cpu0 := time.Now(), cputime.Used()
	for p := 0; p < 8; p++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			reqs := make([]AddRequest, 16)
			for i := range reqs {
				reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
			}
			for added.Add(16) <= int64(b.N)+15 {
				br.AddJobs(reqs)
			}
		}()
	}
	for c := 0; c < 4; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]string, 0, 100)
			for got.Load() < int64(b.N) {
				jobs, _ := br.GetJobs(context.Background(), GetRequest{Queues: []string{"bench"}, Count: 100, Timeout: 50 * time.Millisecond})
				ids = ids[:0]
				for _, j := range jobs {
					ids = append(ids, j.ID)
				}
				if len(ids) > 0 {
					br.Ack(ids)
					got.Add(int64(len(ids)))
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
}
