package wal

import (
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
)

const benchPayloadSize = 100

// runWriters runs b.N calls of op split over writers goroutines, each calling
// op in a loop, and reports records/s and the p50 and p99 latency of a call.
func runWriters(b *testing.B, writers int, op func() error) {
	b.Helper()
	lat := make([][]time.Duration, writers)
	var wg sync.WaitGroup
	b.ResetTimer()
	start := time.Now()
	for w := range writers {
		n := b.N / writers
		if w < b.N%writers {
			n++
		}
		lat[w] = make([]time.Duration, 0, n)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				t0 := time.Now()
				if err := op(); err != nil {
					b.Error(err)
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	all := slices.Concat(lat...)
	if len(all) == 0 {
		return
	}
	slices.Sort(all)
	pct := func(p int) float64 {
		return float64(all[min(len(all)-1, len(all)*p/100)]) / float64(time.Microsecond)
	}
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "records/s")
	b.ReportMetric(pct(50), "p50-us")
	b.ReportMetric(pct(99), "p99-us")
}

// BenchmarkAppend measures Append of 100-byte records on the real filesystem
// under each sync policy and number of concurrent writers.
func BenchmarkAppend(b *testing.B) {
	for _, policy := range []SyncPolicy{SyncAlways, SyncEverySec, SyncNever} {
		for _, writers := range []int{1, 16, 64} {
			b.Run(fmt.Sprintf("policy=%s/writers=%d", policy, writers), func(b *testing.B) {
				l, err := Open(b.TempDir(), Options{
					FS:     vfs.Default,
					Sync:   policy,
					Logger: slog.New(slog.DiscardHandler),
				})
				if err != nil {
					b.Fatal(err)
				}
				defer l.Close()
				payload := make([]byte, benchPayloadSize)
				runWriters(b, writers, func() error {
					_, _, err := l.Append(Record{Type: 1, Payload: payload})
					return err
				})
			})
		}
	}
}

// BenchmarkFsyncPerRecordBaseline is what group commit is measured against:
// writers share one file under a mutex, each record written and fsynced on
// its own.
func BenchmarkFsyncPerRecordBaseline(b *testing.B) {
	b.Run("writers=64", func(b *testing.B) {
		f, err := os.Create(filepath.Join(b.TempDir(), "baseline.wal"))
		if err != nil {
			b.Fatal(err)
		}
		defer f.Close()
		frame := appendFrame(nil, Record{Type: 1, Payload: make([]byte, benchPayloadSize)}, 0, 0)
		var mu sync.Mutex
		runWriters(b, 64, func() error {
			mu.Lock()
			defer mu.Unlock()
			if _, err := f.Write(frame); err != nil {
				return err
			}
			return f.Sync()
		})
	})
}
