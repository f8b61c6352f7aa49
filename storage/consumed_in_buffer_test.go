package storage

import (
	"strings"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestJobConsumedInTheBufferCostsPebbleNothing: a job added, then taken
// through a consumer's lifecycle and deleted before the write buffer is
// flushed leaves no key for Pebble — no value, no tombstone — on every
// path a consumer takes: GETJOB + ACKJOB, a NACK and a second delivery,
// WORKING, DEQUEUE + ENQUEUE, a cluster's ACKJOB (acked, then deleted once
// collected), and a DELJOB of a queued job.
func TestJobConsumedInTheBufferCostsPebbleNothing(t *testing.T) {
	type step func(s *Store, id string) error
	deliver := func(s *Store, id string) error { _, err := s.Deliver(id, 1<<40); return err }
	del := func(s *Store, id string) error { return s.Delete(id) }
	paths := map[string][]step{
		"getjob+ackjob": {deliver, del},
		"nack": {deliver, func(s *Store, id string) error { _, err := s.Nack(id, 1<<40, 0); return err },
			deliver, del},
		"working": {deliver, func(s *Store, id string) error { _, err := s.Working(id, 1<<41); return err }, del},
		"dequeue+enqueue": {func(s *Store, id string) error { _, err := s.Dequeue(id); return err },
			func(s *Store, id string) error { _, err := s.Queue(id, 1<<40); return err }, deliver, del},
		"cluster ack":   {deliver, func(s *Store, id string) error { _, err := s.Ack(id); return err }, del},
		"deljob queued": {del},
	}
	for name, steps := range paths {
		t.Run(name, func(t *testing.T) {
			s := mustOpen(t, vfs.NewMem())
			defer s.Close()
			// A job Pebble holds beside it, so that the flush is not empty.
			if err := s.Add(newTestJob(s.NodeID(), "q", 1e15, 60), []byte("old")); err != nil {
				t.Fatal(err)
			}
			if err := s.Checkpoint(); err != nil {
				t.Fatal(err)
			}
			b := s.NewBatch()
			j := newTestJob(s.NodeID(), "q", 2e15, 60)
			j.ID = ""                                                 // AddNew makes it
			if err := b.AddNew(j, []byte("body"), 3600); err != nil { // the broker's ADDJOB
				t.Fatal(err)
			}
			if r := s.Commit(b); r[0].Err != nil {
				t.Fatal(r[0].Err)
			}
			for i, st := range steps {
				if err := st(s, j.ID); err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
			}
			s.mu.Lock()
			defer s.mu.Unlock()
			w := s.buf
			var left []string
			w.t.Ascend(func(e *bufEntry) bool {
				if strings.Contains(e.key, j.ID) {
					left = append(left, e.key)
				}
				return true
			})
			for _, h := range []*hashedKeys{&w.jobs, &w.sched} {
				w.each(h, func(e *bufEntry) {
					if strings.Contains(e.key, j.ID) {
						left = append(left, e.key)
					}
				})
			}
			for k := range w.dels {
				if strings.Contains(k, j.ID) {
					left = append(left, k)
				}
			}
			if len(left) > 0 {
				t.Fatalf("the buffer still holds %d keys of the job for Pebble: %q", len(left), left)
			}
		})
	}
}
