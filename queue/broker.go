package queue

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/storage"
)

// Broker applies the job lifecycle through the store, which owns the job
// state, and keeps, next to it, the queue heads, the blocked GETJOB waiters
// and the timer wheel. See doc.go for who owns what and the invariants.
type Broker struct {
	opts    Options
	st      *storage.Store
	cluster Cluster
	// node is this node's id and selfNodes the node list of every job
	// added here, shared by them (the store shares its own the same way;
	// nothing writes into one). Both change only in SetNodeID: node is
	// read without mu, selfNodes under it.
	node      atomic.Pointer[string]
	selfNodes []string
	// adds merges concurrent AddJobs calls into one store batch (it has
	// its own lock; see addCombiner).
	adds addCombiner

	// mu guards everything below. Lock order: Broker.mu, then the store's
	// locks (LOCKS.md). Store operations are applied under mu (so heads,
	// wheel and index agree) but waited for outside it.
	mu     sync.Mutex
	queues map[string]*queueState
	wheel  *Wheel
	// cursor is the loader's position in the on-disk schedule: the wheel
	// holds every event that sorts at or before it; events after it are
	// loaded later. The zero cursor has loaded nothing.
	cursor storage.Event
	// loader is where the loader last stopped: short of the horizon, the
	// events after the cursor may already be due.
	loader loaderState
	// inCluster: other nodes were known at the last Tick (read outside mu,
	// Clustered), so retry events loaded from disk get their WILLQUEUE
	// companions (addEventLocked).
	inCluster bool
	// due is Tick's reusable buffer of the events one chunk fires.
	due []storage.Event
	// fireChunk is the most events one lock hold fires (fireChunk; tests
	// set it smaller).
	fireChunk int
	// testChunkHook, if set, is called by Tick after each chunk, outside
	// the lock, with the number of events the chunk fired.
	testChunkHook func(fired int)
	// getChunk is the most jobs one lock hold of GetJobs delivers
	// (getChunk; tests set it smaller).
	getChunk int
	// maxGetCount is the most jobs one GetJobs delivers (MaxGetCount;
	// tests set it smaller).
	maxGetCount int
	// testGetHoldHook, if set, is called by GetJobs after each of its
	// holds of mu, outside the lock, with the jobs that hold delivered.
	testGetHoldHook func(delivered int)
	closed          bool
	// running: Run was called (and owns done). Close waits for done only
	// then: a broker whose Run never started (its daemon failed to open
	// the rest of the node) closes at once.
	running bool
	ctime   storage.CtimeClock
	// lastSweep is when idle, empty queues were last forgotten.
	lastSweep int64
	stats     Stats
	// unreadableLog rate-limits the log lines about unreadable bodies
	// (noteUnreadableLocked): when the last was written (Unix ms) and how
	// many were held back since.
	unreadableLog struct{ last, suppressed int64 }
	// failedCursor is, per queue, the last position GETJOB looked at while
	// the store was failed (deliverWhileFailedLocked).
	failedCursor map[string]storage.QueuePos
	// fedWaiting: the queues blocked clients were added to since Tick last
	// looked (federation.go, needJobsForWaitersLocked), and fedScan when
	// it did (Unix ms).
	fedWaiting map[*queueState]struct{}
	fedScan    int64

	wake chan struct{} // tells the timer loop that an earlier event exists
	stop chan struct{}
	done chan struct{}
}

// queueState is the broker's in-memory state of one queue.
type queueState struct {
	name    string
	head    *Head
	waiters []*waiter // blocked GETJOB clients, oldest first
	jobsIn  int64
	jobsOut int64
	atime   int64 // last activity, Unix ms
	ctime   int64 // when the broker first saw the queue, Unix ms
	// unreadable holds the ids of queued jobs whose bodies could not be
	// read (markUnreadableLocked): refills pass them over until they leave
	// the queue. nil while there are none.
	unreadable map[string]struct{}
	// fed is the queue's federation state (NEEDJOBS pacing, sources,
	// import rate: federation.go); nil until it first asks or imports.
	fed *federation
}

// Stats are the broker's counters (INFO).
type Stats struct {
	JobsAdded, JobsDelivered, JobsAcked, JobsExpired, JobsRequeued int64
	// JobsUnreadable counts jobs GETJOB found with a body it could not
	// read from the AOF (left undelivered, or left out of a reply).
	JobsUnreadable int64
	// JobsExternal counts the jobs added with no copy here (external
	// replication), not in JobsAdded.
	JobsExternal   int64
	BlockedClients int
}

// New returns a broker over an open store and loads the near schedule into
// the timer wheel. Run drives the timers.
func New(opts Options) (*Broker, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	now := opts.Now().UnixMilli()
	b := &Broker{
		opts:        opts,
		st:          opts.Store,
		cluster:     opts.Cluster,
		selfNodes:   []string{opts.Store.NodeID()},
		queues:      map[string]*queueState{},
		wheel:       NewWheel(now),
		fireChunk:   fireChunk,
		getChunk:    getChunk,
		maxGetCount: MaxGetCount,
		wake:        make(chan struct{}, 1),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	// New jobs sort after every job the store has seen, even if the wall
	// clock was stepped back since they were added.
	b.ctime.Observe(opts.Store.MaxCtime())
	node := opts.Store.NodeID()
	b.node.Store(&node)
	b.inCluster = b.Clustered()
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.loadTimersLocked(now, b.opts.MaxTimers); err != nil {
		return nil, err
	}
	return b, nil
}

// NodeID returns the node's 40-hex-digit id.
func (b *Broker) NodeID() string { return *b.node.Load() }

// Cluster returns the cluster the broker replicates through (a lone node's
// when Options.Cluster was nil).
func (b *Broker) Cluster() Cluster { return b.cluster }

// SetNodeID gives the node a new id (CLUSTER RESET HARD), after FlushAll:
// the store refuses it while it holds jobs (storage.ErrNotEmpty). Jobs added
// afterwards carry its prefix.
func (b *Broker) SetNodeID(id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.checkOpenLocked(); err != nil {
		return err
	}
	if err := b.st.SetNodeID(id); err != nil {
		return wrapStore(err)
	}
	b.node.Store(&id)
	b.selfNodes = []string{id}
	return nil
}

// Store returns the store the broker writes to.
func (b *Broker) Store() *storage.Store { return b.st }

func (b *Broker) nowMillis() int64 { return b.opts.Now().UnixMilli() }

// queueLocked returns the state of queue, creating it on first use. A queue
// with entries on disk starts with an incomplete head, refilled on demand.
func (b *Broker) queueLocked(name string, now int64) *queueState {
	q := b.queues[name]
	if q == nil {
		head := NewHead(b.opts.HeadSize)
		if b.st.QueueLen(name) > 0 {
			head = NewIncompleteHead(b.opts.HeadSize)
		}
		q = &queueState{name: name, head: head, ctime: now, atime: now}
		b.queues[name] = q
	}
	return q
}

// refillLocked reads the queue's next entries from disk when its head runs
// low, or when want entries are wanted and memory holds fewer.
func (b *Broker) refillLocked(q *queueState, want int) error {
	h := q.head
	if h.Complete() || (!h.NeedsRefill() && h.Len() >= want) {
		return nil
	}
	after, _ := h.Last()
	n := max(b.opts.HeadSize-h.Len(), 1)
	for {
		entries, err := b.st.QueueHead(q.name, after, n)
		if err != nil {
			return err
		}
		exhausted := len(entries) < n
		if len(q.unreadable) > 0 && len(entries) > 0 {
			after = entries[len(entries)-1]
			entries = slices.DeleteFunc(entries, func(p storage.QueuePos) bool {
				_, skip := q.unreadable[p.ID]
				return skip
			})
			if len(entries) == 0 && !exhausted {
				continue // a page of unreadable jobs only: read on
			}
		}
		h.Refill(entries, exhausted)
		return nil
	}
}

// retryTime is the next requeue time of a job with RETRY retry seconds
// queued or delivered at now: now + retry, ± up to 500 ms (SPEC.md).
func retryTime(now int64, retry uint32) int64 {
	if retry == 0 {
		return 0
	}
	return now + int64(retry)*1000 + rand.Int64N(1001) - 500
}

// syncTimersLocked makes the wheel hold the job's current events (those at
// or before the loader's cursor; later ones are on disk for the loader).
// A full wheel (MaxTimers) takes none: the cursor moves back to just
// before the event, which stays on disk until fired events make room and
// the loader reaches it — so the wheel stays bounded however many jobs
// arrive with timers inside the horizon (a replica's copies each bring a
// retry and its WILLQUEUE). Events the wheel holds after the cursor are
// harmless: the loader's Add of the same event replaces it, and a change
// of the job removes it first (RemoveAll).
func (b *Broker) syncTimersLocked(id string, j *storage.Job) {
	b.wheel.RemoveAll(id)
	if j == nil {
		return
	}
	earliest := false
	next, ok := b.wheel.Next()
	var buf [3]storage.Event // delay, retry, ttl: no allocation
	// The events to add, added at once (AddAll: one allocation for their
	// entries). The wheel holds none of the job's after the RemoveAll, so
	// each adds one to its Len: the count against MaxTimers includes those
	// before it.
	var addBuf [4]storage.Event
	adds := addBuf[:0]
	for _, e := range j.AppendEvents(buf[:0]) {
		if cmpEvent(e, b.cursor) <= 0 && b.wheel.Len()+len(adds) >= b.opts.MaxTimers {
			b.cursor = storage.Event{Due: e.Due - 1, Kind: 0xff, ID: "\xff"}
			b.loader = loaderFull
			continue
		}
		if cmpEvent(e, b.cursor) <= 0 {
			adds = append(adds, e)
			due := e.Due
			if e.Kind == storage.EventRetry && b.holdersElsewhere(j) {
				// WILLQUEUE before the requeue (remote_queueing.go).
				w := willQueueCompanion(e)
				adds = append(adds, w)
				due = w.Due
			}
			if !ok || due < next {
				earliest = true
			}
		}
	}
	b.wheel.AddAll(adds)
	if earliest {
		select {
		case b.wake <- struct{}{}:
		default:
		}
	}
}

func cmpEvent(a, c storage.Event) int {
	switch {
	case a.Due != c.Due:
		if a.Due < c.Due {
			return -1
		}
		return 1
	case a.Kind != c.Kind:
		if a.Kind < c.Kind {
			return -1
		}
		return 1
	case a.ID < c.ID:
		return -1
	case a.ID > c.ID:
		return 1
	}
	return 0
}

// queuedLocked records that a job entered its queue: into the head if it
// sorts there, then to a blocked client if one waits.
func (b *Broker) queuedLocked(j *storage.Job, now int64) {
	q := b.queueLocked(j.Queue, now)
	q.head.Insert(storage.QueuePos{Ctime: j.Ctime, ID: j.ID})
	q.atime = now
	if len(q.waiters) > 0 {
		b.serveWaitersLocked(q, now)
	}
}

// unqueuedLocked records that a queued job left its queue other than by
// delivery (dequeued, acked, deleted, expired).
func (b *Broker) unqueuedLocked(j *storage.Job) {
	if q := b.queues[j.Queue]; q != nil {
		q.head.Remove(storage.QueuePos{Ctime: j.Ctime, ID: j.ID})
		delete(q.unreadable, j.ID)
	}
}

// errUnusable reports whether err means the store can take no more writes.
func errUnusable(err error) bool {
	return errors.Is(err, storage.ErrFailed) || errors.Is(err, storage.ErrClosed)
}

func (b *Broker) checkOpenLocked() error {
	if b.closed {
		return ErrClosed
	}
	return nil
}

// Close stops the timer loop (waiting for Run to return, if it was started)
// and wakes every blocked client with ErrClosed. It does not close the
// store.
func (b *Broker) Close() {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	for _, q := range b.queues {
		for _, w := range q.waiters {
			if !w.done {
				w.done = true
				w.ch <- waiterResult{err: ErrClosed}
			}
		}
		q.waiters = nil
	}
	b.stats.BlockedClients = 0
	running := b.running
	b.mu.Unlock()
	close(b.stop)
	if running {
		<-b.done
	}
}

// Stats returns the broker's counters.
func (b *Broker) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// QueueNames returns the names of the queues the broker has state for.
func (b *Broker) QueueNames() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	names := make([]string, 0, len(b.queues))
	for n := range b.queues {
		names = append(names, n)
	}
	return names
}

func wrapStore(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("queue: %w", err)
}

// secondsToMillis converts seconds to milliseconds without overflow.
func secondsToMillis(s int64) int64 {
	const maxSec = int64(time.Duration(1<<62) / time.Millisecond / 1000)
	return min(s, maxSec) * 1000
}
