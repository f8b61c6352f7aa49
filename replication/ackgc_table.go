package replication

import (
	"container/heap"
	"time"
)

// ackTable is the collections running here (Jobs.acks, under Jobs.mu), by
// job id, and their next rounds in a min-heap by due time, so a round
// (RetryAcks, every AckRetryTick) visits only the collections due, not
// every acked copy this node holds: after a partition that may be
// millions, whose rounds the backoff's jitter spreads over every tick.
type ackTable struct {
	byID map[string]*ackGC
	due  ackHeap
}

func newAckTable() ackTable { return ackTable{byID: map[string]*ackGC{}} }

func (t *ackTable) get(id string) *ackGC { return t.byID[id] }

func (t *ackTable) len() int { return len(t.byID) }

// put adds the collection gc of job id (none must run for it yet).
func (t *ackTable) put(id string, gc *ackGC) {
	gc.id = id
	t.byID[id] = gc
	heap.Push(&t.due, gc)
}

// drop forgets the collection of job id, if any.
func (t *ackTable) drop(id string) {
	gc := t.byID[id]
	if gc == nil {
		return
	}
	delete(t.byID, id)
	heap.Remove(&t.due, gc.index)
}

// first returns the collection due first, or nil if none is due at now.
func (t *ackTable) first(now time.Time) *ackGC {
	if len(t.due) == 0 || now.Before(t.due[0].next) {
		return nil
	}
	return t.due[0]
}

// reschedule sets the next round of gc, a collection in the table.
func (t *ackTable) reschedule(gc *ackGC, next time.Time) {
	gc.next = next
	heap.Fix(&t.due, gc.index)
}

// ackHeap orders collections by next round (container/heap).
type ackHeap []*ackGC

func (h ackHeap) Len() int           { return len(h) }
func (h ackHeap) Less(a, b int) bool { return h[a].next.Before(h[b].next) }
func (h ackHeap) Swap(a, b int) {
	h[a], h[b] = h[b], h[a]
	h[a].index, h[b].index = a, b
}

func (h *ackHeap) Push(x any) {
	gc := x.(*ackGC)
	gc.index = len(*h)
	*h = append(*h, gc)
}

func (h *ackHeap) Pop() any {
	old := *h
	gc := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return gc
}
