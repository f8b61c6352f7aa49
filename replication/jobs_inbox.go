package replication

import (
	"sync"
	"time"
)

// The inbox: a link's reader hands its batches to HandleBatchQueued,
// which handles the batch's NEEDJOBS at once (needJobsFirst) and queues
// the rest for the sender's own handler goroutine, which applies them in
// order, as HandleBatch would on the reader: every batch queued while it
// handled the last, as one batch.
//
// Why: the handlers of SETACK, DELJOB, GOTACK and YOURJOBS wait for their
// own durable writes on the goroutine that runs them (under appendfsync
// always, an fsync each, ms to tens of ms on a loaded disk). On the
// reader, a NEEDJOBS that arrived meanwhile waited in the socket for all
// of them, and the jobs it would have moved waited as long on this node:
// in the cross-node benchmark under always, 440 of 452 NEEDJOBS were read
// only when such a batch ended, 8 ms p50 after they were sent
// (bench/README.md "Cross-node latency under appendfsync always"). With
// the inbox the reader goes on reading while the handler waits, so a
// NEEDJOBS is answered at once.
//
// What stays as it was: one sender's messages other than NEEDJOBS are
// handled in the order its links read them, by one goroutine at a time
// (a new link from the same node feeds the same inbox); NEEDJOBS only
// records what the asker wants and the giver answers it concurrently with
// whatever is handled next, so running it ahead of the queued batches
// only lets the answer overlap them too. Memory is bounded: a sender's
// inbox holds at most maxInboxBatches batches (each at most
// maxBatchMessages messages and about maxBatchBytes of payload), and its
// reader waits, as it did for the handler before, while the inbox is full.
// The handler outlives an empty inbox by inboxLinger, so a sender under
// load keeps one goroutine rather than starting one per batch.

// maxInboxBatches bounds the batches one sender's inbox holds.
const maxInboxBatches = 4

// inboxLinger is how long a handler goroutine waits for its sender's next
// batch once the inbox is empty, before it ends. Under load a sender's
// batches come every few ms, often just after the last was handled: a
// goroutine ending at each empty inbox meant a new goroutine (and its
// stack growth) per batch. An idle sender costs one parked goroutine for
// at most this long.
const inboxLinger = 2 * time.Second

// inboxes are the senders' inboxes (under their own lock, never taken
// with Jobs.mu held; a handler goroutine takes Jobs.mu while it runs, not
// inboxes.mu). running counts the handler goroutines; Close waits for
// them.
type inboxes struct {
	mu      sync.Mutex
	room    *sync.Cond // signalled when a batch leaves an inbox, or at close
	byFrom  map[string]*inbox
	closed  bool
	done    chan struct{} // closed at Close: wakes the idle handlers at once
	running sync.WaitGroup
	started int // handler goroutines started; for tests
}

// inbox is one sender's batches not handled yet, oldest first; a handler
// goroutine runs while it is not empty, and up to inboxLinger after.
type inbox struct {
	batches [][]Message
	idle    bool          // its handler waits for a batch (inboxLinger)
	wake    chan struct{} // one token: a batch came while idle
}

// HandleBatchQueued is the BatchHandler the daemon gives its transport:
// the batch's NEEDJOBS are handled now, the rest queued for the sender's
// handler goroutine (HandleBatch, in order). It waits while the sender's
// inbox is full. After Close it drops the batch.
func (j *Jobs) HandleBatchQueued(from string, ms []Message) {
	ms = j.needJobsFirst(from, ms)
	if len(ms) == 0 {
		return
	}
	ib := &j.inboxes
	ib.mu.Lock()
	defer ib.mu.Unlock()
	if ib.room == nil {
		ib.room = sync.NewCond(&ib.mu)
		ib.byFrom = map[string]*inbox{}
		ib.done = make(chan struct{})
	}
	box := ib.byFrom[from]
	for box != nil && len(box.batches) >= maxInboxBatches && !ib.closed {
		ib.room.Wait()
		box = ib.byFrom[from]
	}
	if ib.closed {
		return
	}
	if box == nil {
		box = &inbox{wake: make(chan struct{}, 1)}
		ib.byFrom[from] = box
		ib.running.Add(1)
		ib.started++
		go j.drainInbox(from, box)
	}
	box.batches = append(box.batches, ms)
	if box.idle {
		box.idle = false
		select {
		case box.wake <- struct{}{}:
		default:
		}
	}
}

// drainInbox handles from's queued batches in order — all those queued
// at once as one batch. When the inbox is empty it waits up to
// inboxLinger for the next batch, then ends (the next batch starts
// another); when Jobs closes it ends at once and the rest are dropped, as
// HandleBatch would drop them.
func (j *Jobs) drainInbox(from string, box *inbox) {
	ib := &j.inboxes
	defer ib.running.Done()
	var linger *time.Timer
	for {
		ib.mu.Lock()
		if len(box.batches) == 0 && !ib.closed {
			box.idle = true
			ib.mu.Unlock()
			if linger == nil {
				linger = time.NewTimer(inboxLinger)
			} else {
				linger.Reset(inboxLinger)
			}
			timedOut := false
			select {
			case <-box.wake:
			case <-ib.done:
			case <-linger.C:
				timedOut = true
			}
			ib.mu.Lock()
			box.idle = false
			if len(box.batches) == 0 && !ib.closed && !timedOut {
				ib.mu.Unlock()
				continue // a stale token
			}
		}
		if len(box.batches) == 0 || ib.closed {
			delete(ib.byFrom, from)
			ib.room.Broadcast()
			ib.mu.Unlock()
			if linger != nil {
				linger.Stop()
			}
			return
		}
		// Every batch queued, as one: its runs of REPLJOBs and of acks
		// are longer, and so are applied with fewer durable writes.
		ms := box.batches[0]
		if len(box.batches) > 1 {
			n := 0
			for _, b := range box.batches {
				n += len(b)
			}
			ms = make([]Message, 0, n) // not into a reader's slice
			for _, b := range box.batches {
				ms = append(ms, b...)
			}
		}
		box.batches = nil
		ib.room.Broadcast()
		ib.mu.Unlock()
		j.HandleBatch(from, ms)
	}
}

// closeInboxes drops the batches queued, wakes the readers waiting for
// room and waits for the handler goroutines (Close).
func (j *Jobs) closeInboxes() {
	ib := &j.inboxes
	ib.mu.Lock()
	if ib.room != nil && !ib.closed {
		ib.room.Broadcast()
		close(ib.done)
	}
	ib.closed = true
	ib.mu.Unlock()
	ib.running.Wait()
}
