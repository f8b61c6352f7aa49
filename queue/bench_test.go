package queue

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/cputime"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

var benchMemtable = flag.Uint64("bench.memtable", 0, "storage MemTableSize for the benchmarks (0: default)")
var benchWriteBuffer = flag.Int64("bench.writebuffer", 0, "storage WriteBufferSize (0: default)")

func benchBroker(b *testing.B, policy wal.SyncPolicy) *Broker {
	opts := storage.DefaultOptions()
	opts.MemTableSize = *benchMemtable
	opts.WriteBufferSize = *benchWriteBuffer
	opts.FS = vfs.Default
	opts.Sync = policy
	st, err := storage.Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	br, err := New(Options{Store: st})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { br.Close(); st.Close() })
	return br
}

// BenchmarkAddJobs is the ADDJOB path below RESP: 50 clients, each adding
// batches of `pipeline` jobs of 100 bytes (a pipelined connection's batch).
func BenchmarkAddJobs(b *testing.B) {
	for _, policy := range []wal.SyncPolicy{wal.SyncNever, wal.SyncAlways} {
		for _, pipeline := range []int{1, 16} {
			b.Run(fmt.Sprintf("policy=%s/pipeline=%d", policy, pipeline), func(b *testing.B) {
				br := benchBroker(b, policy)
				go br.Run()
				body := make([]byte, 100)
				var next atomic.Int64
				var wg sync.WaitGroup
				b.ResetTimer()
				start, cpu0 := time.Now(), cputime.Used()
				for c := 0; c < 50; c++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						reqs := make([]AddRequest, pipeline)
						for i := range reqs {
							reqs[i] = AddRequest{Queue: "bench", Body: body, TTL: 86400, Retry: 300, Replicate: 1}
						}
						for next.Add(int64(pipeline)) <= int64(b.N) {
							for _, r := range br.AddJobs(reqs) {
								if r.Err != nil {
									b.Error(r.Err)
									return
								}
							}
						}
					}()
				}
				wg.Wait()
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "jobs/s")
				b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
				if testing.Verbose() {
					b.Logf("index after the run:\n%s", br.Store().IndexMetrics())
				}
			})
		}
	}
}

// BenchmarkGetAck is the consume path below RESP: 50 clients, each taking
// `pipeline` jobs with one GetJobs and acking them with one Ack, from a
// queue filled before the timer starts.
func BenchmarkGetAck(b *testing.B) {
	for _, policy := range []wal.SyncPolicy{wal.SyncNever, wal.SyncAlways} {
		for _, pipeline := range []int{1, 16} {
			b.Run(fmt.Sprintf("policy=%s/pipeline=%d", policy, pipeline), func(b *testing.B) {
				br := benchBroker(b, policy)
				go br.Run()
				fillBench(br, b.N)
				b.ResetTimer()
				drainBench(b, br, 50, pipeline)
				if testing.Verbose() {
					b.Logf("index after the run:\n%s", br.Store().IndexMetrics())
				}
			})
		}
	}
}

var massExpiryChunk = flag.Int("bench.firechunk", 0, "events fired per lock hold in BenchmarkMassExpiry (0: fireChunk)")

var massExpiryJobs = flag.Int("bench.massexpiry", 50_000, "jobs expiring in the same millisecond in BenchmarkMassExpiry (1000000 with -benchtime=1x by hand)")

// BenchmarkMassExpiry is the scenario: bench.massexpiry jobs, added
// long before, all expiring in the same millisecond, on a real Pebble store.
// One goroutine ticks the timers past their expiry until every one is gone
// while another runs ADDJOB+GETJOB+ACKJOB round trips on a live queue and
// records each call's latency: the p50/p99/max of GETJOB (and ADDJOB) say how
// long the expiry stalls other clients; expire-s is the time to expire all.
// The clock is fake so that every job gets the same Etime however long the
// setup takes.
func BenchmarkMassExpiry(b *testing.B) {
	n := *massExpiryJobs
	for range b.N {
		b.StopTimer()
		opts := storage.DefaultOptions()
		opts.MemTableSize = *benchMemtable
		opts.FS = vfs.Default
		opts.Sync = wal.SyncNever
		st, err := storage.Open(b.TempDir(), opts)
		if err != nil {
			b.Fatal(err)
		}
		var clock fakeClock
		t0 := int64(1_700_000_000_000)
		clock.set(t0)
		br, err := New(Options{Store: st, Now: clock.now})
		if err != nil {
			b.Fatal(err)
		}
		if *massExpiryChunk > 0 {
			br.fireChunk = *massExpiryChunk
		}
		// TTL beyond the horizon: the events are on disk, and the loader
		// brings them into the wheel MaxTimers at a time, as in a server
		// whose jobs were added long ago.
		const ttl = 3600
		body := make([]byte, 100)
		reqs := make([]AddRequest, 1024)
		for i := range reqs {
			reqs[i] = AddRequest{Queue: "expiring", Body: body, TTL: ttl, Retry: 300, Replicate: 1}
		}
		var wg sync.WaitGroup
		var next atomic.Int64
		for range 4 {
			wg.Go(func() {
				for {
					k := int(next.Add(int64(len(reqs))))
					if k-len(reqs) >= n {
						return
					}
					for _, r := range br.AddJobs(reqs[:min(len(reqs), n-(k-len(reqs)))]) {
						if r.Err != nil {
							b.Error(r.Err)
							return
						}
					}
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			return
		}
		etime := t0 + ttl*1000
		clock.set(etime)
		live := []AddRequest{{Queue: "live", Body: body, TTL: 7 * 86400, Retry: 300, Replicate: 1}}
		var getLat, addLat []time.Duration
		// The expiry starts once the client runs (its first round trip
		// done), so that a stall cannot hide by delaying the client's start.
		ready, done := make(chan struct{}), make(chan struct{})
		var readyOnce sync.Once
		signalReady := func() { readyOnce.Do(func() { close(ready) }) }
		b.StartTimer()
		var start time.Time
		var expire time.Duration
		wg.Go(func() {
			defer close(done)
			<-ready
			start = time.Now()
			for br.Stats().JobsExpired < int64(n) {
				if err := br.Tick(etime); err != nil {
					b.Error(err)
					return
				}
			}
			expire = time.Since(start)
		})
		wg.Go(func() {
			defer signalReady() // also on failure, so the expiry ends
			for {
				select {
				case <-done:
					return
				default:
				}
				t := time.Now()
				if r := br.AddJobs(live); r[0].Err != nil {
					b.Error(r[0].Err)
					return
				}
				t1 := time.Now()
				jobs, err := br.GetJobs(context.Background(), GetRequest{Queues: []string{"live"}, Count: 1, NoHang: true})
				if err != nil || len(jobs) != 1 {
					b.Errorf("GETJOB: %d jobs, %v", len(jobs), err)
					return
				}
				t2 := time.Now()
				addLat, getLat = append(addLat, t1.Sub(t)), append(getLat, t2.Sub(t1))
				if _, err := br.Ack([]string{jobs[0].ID}); err != nil {
					b.Error(err)
					return
				}
				signalReady()
			}
		})
		wg.Wait()
		b.StopTimer()
		if b.Failed() {
			return
		}
		if left := st.QueueLen("expiring"); left != 0 {
			b.Fatalf("%d jobs left after the expiry", left)
		}
		br.mu.Lock()
		br.closed = true // Run never started: Close would wait for it
		br.mu.Unlock()
		st.Close()
		b.ReportMetric(expire.Seconds(), "expire-s")
		b.ReportMetric(float64(n)/expire.Seconds(), "expired/s")
		reportLatency(b, "getjob", getLat)
		reportLatency(b, "addjob", addLat)
	}
}

// reportLatency reports the p50, p99 and max of lat in microseconds.
func reportLatency(b *testing.B, name string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	pct := func(p float64) float64 {
		return float64(lat[min(int(p*float64(len(lat))), len(lat)-1)].Microseconds())
	}
	b.ReportMetric(pct(0.50), name+"-p50-µs")
	b.ReportMetric(pct(0.99), name+"-p99-µs")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds()), name+"-max-µs")
	b.ReportMetric(float64(len(lat)), name+"-calls")
}
