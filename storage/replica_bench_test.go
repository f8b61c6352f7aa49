package storage

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/pebble/v2"
	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// BenchmarkReplicaBytes measures what a replicated job costs on disk: a
// node's store holding 100,000 copies of jobs made by another node (as
// REPLJOB brings them: active, RETRY 60, REPLICATE 3, three nodes, a
// 100-byte body), closed (so the index is flushed and the AOF's tail
// fsynced). It reports the mean j/ index value, the index directory and
// the AOF directory per job. One iteration is one such store.
//
//	go test -run '^$' -bench BenchmarkReplicaBytes -benchtime 1x ./storage
func BenchmarkReplicaBytes(b *testing.B) {
	const copies = 100_000
	for range b.N {
		dir := b.TempDir()
		opts := DefaultOptions()
		opts.FS, opts.Sync, opts.Logger = vfs.Default, wal.SyncNever, quietLogger()
		s, err := Open(dir, opts)
		if err != nil {
			b.Fatal(err)
		}
		self := s.NodeID()
		nodes := []string{otherNode, self, "eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee"}
		body := make([]byte, 100)
		now := time.Now().UnixMilli()
		var clock CtimeClock
		batch := s.NewBatch()
		for i := range copies {
			j := &Job{ID: NewJobID(otherNode, 86400, 60), Queue: "bench", State: StateActive,
				Ctime: clock.Next(now), Etime: now + 86_400_000, Retry: 60, Repl: 3, QueueTime: now + 60_000,
				Nodes: nodes}
			if err := batch.AddReplica(j, body); err != nil {
				b.Fatal(err)
			}
			if batch.Len() == 1000 || i == copies-1 {
				for _, r := range s.Commit(batch) {
					if r.Err != nil {
						b.Fatal(r.Err)
					}
				}
				batch.Reset()
			}
		}
		if err := s.Close(); err != nil {
			b.Fatal(err)
		}
		db, err := pebble.Open(filepath.Join(dir, indexDir), &pebble.Options{DisableWAL: true, ReadOnly: true, Logger: quietPebble{}})
		if err != nil {
			b.Fatal(err)
		}
		it, err := db.NewIter(&pebble.IterOptions{LowerBound: []byte{prefixJob}, UpperBound: []byte{prefixJob + 1}})
		if err != nil {
			b.Fatal(err)
		}
		values, n := 0, 0
		for ok := it.First(); ok; ok = it.Next() {
			values += len(it.Value())
			n++
		}
		it.Close()
		db.Close()
		if n != copies {
			b.Fatalf("%d job keys, want %d", n, copies)
		}
		b.ReportMetric(float64(values)/copies, "value-B/job")
		b.ReportMetric(float64(dirBytes(b, filepath.Join(dir, indexDir)))/copies, "index-B/job")
		b.ReportMetric(float64(dirBytes(b, filepath.Join(dir, walDir)))/copies, "aof-B/job")
	}
}

// dirBytes is the bytes the files under dir hold (their lengths, not the
// blocks allocated: an AOF segment may be preallocated).
func dirBytes(b *testing.B, dir string) int64 {
	var n int64
	err := filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err == nil && fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	return n
}
