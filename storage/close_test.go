package storage

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/wal"
)

// TestReadsRaceClose: readers of every kind run while the store closes (as
// when the daemon swaps a failed store for a reopened one). Each read
// either succeeds or returns ErrClosed; none reaches a closed Pebble or log
// (which panics), and every read after Close returns ErrClosed.
func TestReadsRaceClose(t *testing.T) {
	for round := range 5 {
		t.Run(fmt.Sprint(round), testReadsRaceClose)
	}
}

func testReadsRaceClose(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	node := s.NodeID()
	var jobs []*Job
	for i := range 200 {
		j := newTestJob(node, "q", uint64(1000+i)*1_000_000, 60)
		// 900 bytes, under the compression threshold: the AOF gets several
		// segments, so there is a sealed one to rewrite.
		body := fmt.Appendf(nil, "body-%d-%0900d", i, i)[:900]
		if err := s.Add(j, body); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, j)
	}
	// Bodies are read from the active segment, which the rewrite of the
	// sealed one (and Close's checkpoint after it) leaves where they are.
	// In Pebble, not only in the write buffer: reads go past the lock.
	if err := s.Checkpoint(); err != nil {
		t.Fatal(err)
	}
	var last []*Job
	active := s.Stats().Segments[len(s.Stats().Segments)-1].First
	for _, j := range jobs {
		if j.BodyLSN >= active {
			last = append(last, j)
		}
	}
	if len(last) < 3 {
		t.Fatalf("%d jobs' bodies are in the active segment, want a few", len(last))
	}
	sealed := s.Stats().Segments[0]
	if sealed.Active {
		t.Fatal("one AOF segment: nothing to rewrite")
	}
	reads := map[string]func(i int) error{
		"Job":        func(i int) error { _, err := s.Job(jobs[i%len(jobs)].ID); return err },
		"Body":       func(i int) error { _, err := s.Body(last[i%len(last)]); return err },
		"Bodies":     func(i int) error { return s.Bodies(last)[0].Err },
		"QueueRange": func(int) error { _, err := s.QueueRange("q", QueuePos{}, 50); return err },
		"QueueNewest": func(int) error {
			_, err := s.QueueNewest("q", 50)
			return err
		},
		"DueEvents":   func(int) error { _, err := s.DueEvents(1<<62, Event{}, 50); return err },
		"ScanJobs":    func(int) error { _, err := s.ScanJobs("", 50); return err },
		"Stats":       func(int) error { s.Stats(); return nil },
		"IndexMetric": func(int) error { s.IndexMetrics().DiskSpaceUsage(); return nil },
		"Sync":        func(int) error { return s.Sync() },
		"Compact":     func(int) error { return s.CompactOrderIndex(context.Background()) },
		"Rewrite": func(int) error {
			_, err := s.RewriteSegment(context.Background(), sealed.First)
			return err
		},
	}
	var wg sync.WaitGroup
	var started sync.WaitGroup
	var closed atomic.Bool
	for name, read := range reads {
		started.Add(1)
		wg.Go(func() {
			defer func() {
				if r := recover(); r != nil {
					t.Errorf("%s panicked: %v\n%s", name, r, debug.Stack())
				}
			}()
			started.Done()
			for i := 0; ; i++ {
				after := closed.Load()
				err := read(i)
				if err != nil && !errors.Is(err, ErrClosed) && !(name == "Rewrite" && errors.Is(err, wal.ErrNotFound)) {
					t.Errorf("%s: %v", name, err)
					return
				}
				if after {
					if err == nil && name != "Stats" && name != "IndexMetric" {
						t.Errorf("%s after Close: nil error, want ErrClosed", name)
					}
					return
				}
			}
		})
	}
	started.Wait()
	err := s.Close()
	closed.Store(true)
	wg.Wait()
	if err != nil {
		t.Fatalf("close: %v", err)
	}
}
