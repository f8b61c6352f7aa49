package storage

import (
	"bytes"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/cputime"
	"github.com/diskque/diskque/wal"
)

var (
	benchReopenJobs = flag.Int("bench.reopenjobs", 1_000_000, "jobs in BenchmarkReopen's store")
	benchMemtable   = flag.Uint64("bench.memtable", 0, "MemTableSize for the write benchmarks (0: default)")
	benchFloorKeys  = flag.Int("bench.floorkeys", 3, "BenchmarkIndexFloor: index keys per job (1: job key; 2: and queue key; 3: and TTL event)")
)

func benchStore(b *testing.B, policy wal.SyncPolicy) *Store {
	b.Helper()
	opts := DefaultOptions()
	opts.FS = vfs.Default
	opts.Sync = policy
	opts.Logger = quietLogger()
	opts.MemTableSize = *benchMemtable
	s, err := Open(b.TempDir(), opts)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s
}

// benchWorkers runs op b.N times split over workers goroutines sharing the
// store, as a server's connections do, and reports the rate as unit/s. op
// gets a new 100-byte queued job to work with.
func benchWorkers(b *testing.B, s *Store, workers int, unit string, op func(j *Job, body []byte, now int64) error) {
	node := s.NodeID()
	body := make([]byte, 100)
	var clock CtimeClock
	var next atomic.Int64
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(b.N) {
				now := time.Now().UnixMilli()
				j := &Job{ID: NewJobID(node, 3600, 60), Queue: "bench", State: StateQueued,
					Ctime: clock.Next(now), Etime: now + 3_600_000, Retry: 60, Repl: 1, QueueTime: now + 60_000}
				if err := op(j, body, now); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), unit+"/s")
}

// BenchmarkCycle measures full job lifecycles — add, deliver, ack, delete —
// on the real filesystem. One op is one whole cycle (four AOF records).
func BenchmarkCycle(b *testing.B) {
	for _, policy := range []wal.SyncPolicy{wal.SyncNever, wal.SyncEverySec, wal.SyncAlways} {
		for _, workers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("policy=%s/workers=%d", policy, workers), func(b *testing.B) {
				s := benchStore(b, policy)
				benchWorkers(b, s, workers, "cycles", func(j *Job, body []byte, now int64) error {
					if err := s.Add(j, body); err != nil {
						return err
					}
					if _, err := s.Deliver(j.ID, now+60_000); err != nil {
						return err
					}
					if _, err := s.Ack(j.ID); err != nil {
						return err
					}
					return s.Delete(j.ID)
				})
			})
		}
	}
}

// BenchmarkAdd measures Add alone: the ADDJOB write path.
func BenchmarkAdd(b *testing.B) {
	for _, policy := range []wal.SyncPolicy{wal.SyncNever, wal.SyncAlways} {
		for _, workers := range []int{1, 64} {
			b.Run(fmt.Sprintf("policy=%s/workers=%d", policy, workers), func(b *testing.B) {
				s := benchStore(b, policy)
				benchWorkers(b, s, workers, "adds", func(j *Job, body []byte, _ int64) error {
					return s.Add(j, body)
				})
			})
		}
	}
}

// BenchmarkReopen measures Open of a store holding -bench.reopenjobs queued
// jobs, after a clean close (nothing to replay) and after a crash with a long
// unflushed tail (every job's record replayed). The store is built once per
// case, outside the timer.
func BenchmarkReopen(b *testing.B) {
	for _, tail := range []string{"short", "long"} {
		b.Run("tail="+tail, func(b *testing.B) {
			dir := b.TempDir()
			opts := DefaultOptions()
			opts.FS = vfs.Default
			opts.Sync = wal.SyncNever
			opts.Logger = quietLogger()
			opts.CheckpointInterval = -1
			opts.CheckpointBytes = 1 << 62
			opts.MemTableSize = 1 << 30 // keep the long tail unflushed
			s, err := Open(dir, opts)
			if err != nil {
				b.Fatal(err)
			}
			fillStore(b, s, *benchReopenJobs)
			if tail == "short" {
				if err := s.Close(); err != nil {
					b.Fatal(err)
				}
			} else {
				// A crash: the AOF is durable, the index never flushed.
				if err := s.Sync(); err != nil {
					b.Fatal(err)
				}
				s.fence.fence(fmt.Errorf("benchmark: simulated crash"))
				s.room.stopMeasuring()
				s.fence.release()
				s.db.Close()
				s.log.Close()
				s.lock.Close()
			}
			b.ResetTimer()
			var replayed int
			for i := 0; i < b.N; i++ {
				s, err := Open(dir, opts)
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				replayed = s.RecoveryInfo().Records
				if got := s.Stats().Jobs; got != int64(*benchReopenJobs) {
					b.Fatalf("reopened with %d jobs, want %d", got, *benchReopenJobs)
				}
				// Leave the store as found: long tails stay unflushed.
				s.fence.fence(fmt.Errorf("benchmark: close without checkpoint"))
				s.room.stopMeasuring()
				s.fence.release()
				s.db.Close()
				s.log.Close()
				s.lock.Close()
				b.StartTimer()
			}
			b.ReportMetric(float64(replayed), "replayed-records")
			b.ReportMetric(float64(*benchReopenJobs), "jobs")
		})
	}
}

func fillStore(b *testing.B, s *Store, n int) {
	node := s.NodeID()
	body := make([]byte, 100)
	var clock CtimeClock
	var wg sync.WaitGroup
	var next atomic.Int64
	now := time.Now().UnixMilli()
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				j := &Job{ID: NewJobID(node, 86400, 60), Queue: fmt.Sprintf("q%d", next.Load()%10), State: StateQueued,
					Ctime: clock.Next(now), Etime: now + 86_400_000, Retry: 60, Repl: 1, QueueTime: now + 60_000}
				if err := s.Add(j, body); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// BenchmarkMemtableInserts is Pebble alone: random 41-byte keys (a job key's
// size) inserted into a memtable that already holds 300,000 of them, in
// batches of the given size, each batch sorted. It is why the write buffer
// hands Pebble one large sorted batch rather than a small one per commit.
func BenchmarkMemtableInserts(b *testing.B) {
	for _, batch := range []int{16, 256, 4096, 16384} {
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			db, err := pebble.Open("", &pebble.Options{FS: vfs.NewMem(), DisableWAL: true, MemTableSize: 256 << 20, Logger: quietPebble{}})
			if err != nil {
				b.Fatal(err)
			}
			defer db.Close()
			rng := rand.New(rand.NewPCG(1, 2))
			key := func() []byte {
				k := make([]byte, 41)
				for i := range k {
					k[i] = byte(rng.Uint32())
				}
				return k
			}
			value := make([]byte, 40)
			pre := db.NewBatch()
			for range 300_000 {
				if err := pre.Set(key(), value, nil); err != nil {
					b.Fatal(err)
				}
			}
			if err := pre.Commit(pebble.NoSync); err != nil {
				b.Fatal(err)
			}
			keys := make([][]byte, b.N)
			for i := range keys {
				keys[i] = key()
			}
			b.ResetTimer()
			for len(keys) > 0 {
				chunk := keys[:min(batch, len(keys))]
				keys = keys[len(chunk):]
				slices.SortFunc(chunk, bytes.Compare)
				pb := db.NewBatch()
				for _, k := range chunk {
					if err := pb.Set(k, value, nil); err != nil {
						b.Fatal(err)
					}
				}
				if err := pb.Commit(pebble.NoSync); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkIndexFloor is the index's share of an ADDJOB and nothing else:
// the keys and values the store writes for a queued job (job key, queue
// key, TTL event), built by the store's own encoders, written straight into
// the store's Pebble (its options: no WAL, its L0 and filter settings) in
// sorted batches of a write buffer's size, flushes and compactions
// included. No AOF, no broker, no RESP. Its cpu-µs/job, over both cores,
// bounds what a server can reach with this index: at 2 cores, 2e6 divided
// by it is the most jobs per second it could add if nothing else ran.
// -bench.floorkeys writes only the first one or two of the keys, to price
// them.
func BenchmarkIndexFloor(b *testing.B) {
	s := benchStore(b, wal.SyncNever)
	node := s.NodeID()
	var clock CtimeClock
	now := time.Now().UnixMilli()
	type kv struct{ k, v []byte }
	var batch []kv
	var bytesInBatch int64
	flush := func() {
		slices.SortFunc(batch, func(x, y kv) int { return bytes.Compare(x.k, y.k) })
		pb := s.db.NewBatch()
		for _, e := range batch {
			if err := pb.Set(e.k, e.v, nil); err != nil {
				b.Fatal(err)
			}
		}
		if err := pb.Commit(pebble.NoSync); err != nil {
			b.Fatal(err)
		}
		pb.Close()
		batch, bytesInBatch = batch[:0], 0
	}
	cpu0 := cputime.Used()
	b.ResetTimer()
	start := time.Now()
	for range b.N {
		j := &Job{ID: NewJobID(node, 86400, 300), Queue: "bench", State: StateQueued,
			Ctime: clock.Next(now), Etime: now + 86_400_000, Retry: 300, Repl: 1, QueueTime: now + 300_000,
			StoredSize: 100, BodyLSN: 1}
		v := encodeJob(nil, j, node, nil)
		keys := []kv{
			{appendJobKey(nil, j.ID), v},
			{appendQueueKey(nil, j.Queue, j.Ctime, j.ID), v},
			{appendScheduleKey(nil, j.Etime, EventTTL, j.ID), nil},
		}[:*benchFloorKeys]
		batch = append(batch, keys...)
		for _, e := range keys {
			bytesInBatch += int64(len(e.k)+len(e.v)) + bufEntryOverhead
		}
		if bytesInBatch >= s.opts.WriteBufferSize {
			flush()
		}
	}
	flush()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
	b.ReportMetric(float64((cputime.Used()-cpu0).Microseconds())/float64(b.N), "cpu-µs/job")
	if testing.Verbose() {
		b.Logf("index after the run:\n%s", s.db.Metrics())
	}
}
