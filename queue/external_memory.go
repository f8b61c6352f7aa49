package queue

import (
	"time"

	"github.com/diskque/diskque/storage"
)

// A tiny maxmemory (Disque's tests set 1 byte): the server, over
// maxmemory, asks the broker every guard interval to forget the queues
// that are empty and idle, as Disque's cron evicts them at its memory
// warning level 2 (empty queues idle 2 s or more, nobody blocked on them).
// Only the broker's in-memory state of such a queue goes (QSTAT's
// counters); a queue with jobs or a pause state stays.

// PressureQueueIdle is how long an empty queue must be idle to be evicted
// under memory pressure (Disque's 2 s), instead of the usual minute.
const PressureQueueIdle = 2 * time.Second

// SweepIdleQueues forgets, now, the in-memory state of every queue that
// is empty (in memory and on disk), unpaused, has no blocked client and was
// idle for at least idle. It returns how many it forgot.
func (b *Broker) SweepIdleQueues(idle time.Duration) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	now := b.nowMillis()
	n := 0
	for name, q := range b.queues {
		if len(q.waiters) == 0 && q.head.Len() == 0 && now-q.atime >= idle.Milliseconds() &&
			b.st.QueueLen(name) == 0 && b.st.PauseState(name) == storage.PauseNone {
			delete(b.queues, name)
			n++
		}
	}
	return n
}

// RegisteredQueues is the number of queues the node knows, Disque's
// registered_queues: those with queued jobs and those the broker keeps in
// memory though empty (used in the last minute, waited on, paused).
func (b *Broker) RegisteredQueues() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.st.Stats().Queues // the queues with queued jobs
	for name := range b.queues {
		if b.st.QueueLen(name) == 0 {
			n++
		}
	}
	return n
}
