package storage_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/storage"
)

// Embedding the store in a test: on vfs.NewMem() it is a real store (the
// same AOF and index as on disk) that lives in memory and leaves no files.
func Example() {
	s, err := storage.Open("db", storage.Options{FS: vfs.NewMem()})
	if err != nil {
		log.Fatal(err)
	}

	// Times are Unix milliseconds chosen by the caller; a test picks them.
	now := int64(1_700_000_000_000)
	const ttl, retry = 3600, 60 // seconds
	var clock storage.CtimeClock
	job := &storage.Job{
		ID:        storage.NewJobID(s.NodeID(), ttl, retry),
		Queue:     "emails",
		State:     storage.StateQueued,
		Ctime:     clock.Next(now),
		Etime:     now + ttl*1000,
		Retry:     retry,
		Repl:      1,
		QueueTime: now + retry*1000, // requeued then unless acked
	}
	if err := s.Add(job, []byte("hello, world")); err != nil {
		log.Fatal(err)
	}
	fmt.Println("queued:", s.QueueLen("emails"))

	// GETJOB: take the oldest job of the queue.
	head, err := s.QueueRange("emails", storage.QueuePos{}, 1)
	if err != nil {
		log.Fatal(err)
	}
	got, err := s.Deliver(head[0].ID, now+retry*1000)
	if err != nil {
		log.Fatal(err)
	}
	body, err := s.Body(got)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("delivered: %q, state %s, deliveries %d, queued %d\n",
		body, got.State, got.Deliveries, s.QueueLen("emails"))

	// ACKJOB, then delete once every copy is acknowledged.
	acked, err := s.Ack(got.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("state:", acked.State)
	if err := s.Delete(got.ID); err != nil {
		log.Fatal(err)
	}
	_, err = s.Job(got.ID)
	fmt.Println("deleted:", errors.Is(err, storage.ErrNotFound))
	fmt.Println("jobs:", s.Stats().Jobs)

	if err := s.Close(); err != nil {
		log.Fatal(err)
	}
	// Output:
	// queued: 1
	// delivered: "hello, world", state active, deliveries 1, queued 0
	// state: acked
	// deleted: true
	// jobs: 0
}
