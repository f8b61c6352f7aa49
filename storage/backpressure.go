package storage

import (
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// The index's write back-pressure, done by the store instead of Pebble.
//
// Pebble stops writes (a write stall) when its memtables are full and the
// previous one is still flushing (MemTableStopWritesThreshold), or when L0
// holds too many sublevels (L0StopWritesThreshold): the commit that needs a
// new memtable waits inside Batch.Commit, in maybeInduceWriteStall, until a
// flush or a compaction ends. The store commits under Store.mu (and the
// broker under Broker.mu), so a stall held every lock of the store — and
// when the flush it waited for failed, the store fenced the index
// (fence.go), the flush never ended, and marking the store failed (which
// takes Store.mu) and Close waited for ever.
//
// So the store sets Pebble's thresholds out of reach (store.go open:
// pebbleMemTableStopWrites, pebbleL0StopWrites) and applies the same limits
// itself, before it takes any lock of its own (Store.waitForIndexRoom):
//
//   - memtables: while a flush runs, at most 7/8 of MemTableSize bytes of
//     memtable (estimated: batch bytes plus memtableEntryOverhead a key)
//     are handed to Pebble; past that a writer waits for the flush to end.
//     That is Pebble's threshold of 2 (one memtable flushing while the next
//     fills; Pebble rotates a memtable once the next batch's worst case
//     no longer fits, about 7/8 full with 2 MiB buffer flushes), give or
//     take the estimate and one write-buffer flush: the wait is before
//     Store.mu, and a writer that passed it may still flush the buffer it
//     finds full.
//   - L0: while L0 has at least l0StopWrites sublevels (36, as Pebble's was;
//     three times the 12 sublevels at which L0CompactionThreshold, 24, has
//     Pebble compact L0), a writer waits for a compaction to end. The sublevel count is read from DB.Metrics by a goroutine of
//     its own after every flush and compaction (it takes Pebble's DB.mu, so
//     not from Pebble's callbacks, which hold it).
//
// A stall — a span during which the index had no room and at least one
// writer waited — is counted with its length (Stats.IndexStalls,
// Stats.IndexStallTime: INFO's index_write_stalls), and one that lasted
// stallLogAfter or more is logged at WARN when it ends, with why it began
// (a memtable flush or L0): a fill that stopped for half a minute behind a
// compaction must not look like a hung server.
//
// A waiter wakes when there is room, when the store fails (Failed: a flush
// that failed fences the index and never ends) or when it starts closing.
// A writer waits only while a flush runs or L0 is over the limit — each
// ends in an event that wakes it, or in a failure — so it never waits for
// something that is not coming.

const (
	// memtableEntryOverhead estimates what a key costs a memtable beyond
	// its batch bytes: the skiplist node (24 bytes), its tower (about 1.6
	// links of 8 bytes) and the key's trailer (8).
	memtableEntryOverhead = 40
	// stallLogAfter is the shortest stall that is logged.
	stallLogAfter = time.Second
	// l0StopWrites is the number of L0 sublevels at which writers wait
	// for a compaction.
	l0StopWrites = 36
	// Pebble's own stop-writes thresholds, which the store's back-pressure
	// keeps out of reach (16 memtables; L0 far beyond l0StopWrites). They
	// are not removed altogether, as a last bound on memory, should the
	// store's estimate ever be wrong.
	pebbleMemTableStopWrites = 16
	pebbleL0StopWrites       = 1000
)

// indexRoom tracks whether the index has room for more writes. Its mu is a
// leaf: taken from Pebble's callbacks (under DB.mu), under Store.mu (add)
// and by waiters holding nothing of the store's.
type indexRoom struct {
	memLimit int64
	l0Limit  int64

	// full is the fast path of wait: whether a writer must wait now.
	full atomic.Bool

	mu       sync.Mutex
	flushing bool  // between a FlushBegin and its FlushEnd
	handed   int64 // estimated memtable bytes handed to Pebble since the running flush began
	l0       int64 // L0 sublevels, as last measured
	// changed is closed (and replaced) when full turns false.
	changed chan struct{}
	stalls  int64 // waits, for tests

	// The stall in progress: since when a writer waits (zero: none does),
	// and why the index turned full.
	stallStart  time.Time
	stallReason string
	// Stalls ended since Open, and their summed length.
	stallCount int64
	stallTime  time.Duration
	logger     *slog.Logger
	logAfter   time.Duration

	// The measuring goroutine of the open DB (measure).
	poke chan struct{} // capacity 1
	stop chan struct{}
	done chan struct{}
}

func newIndexRoom(memTableSize int64, l0Limit int64, logger *slog.Logger) *indexRoom {
	memLimit := memTableSize - memTableSize/8
	return &indexRoom{memLimit: memLimit, l0Limit: l0Limit, changed: make(chan struct{}), poke: make(chan struct{}, 1),
		logger: logger, logAfter: stallLogAfter}
}

// updateLocked recomputes full and wakes the waiters if it turned false;
// it ends the stall in progress then.
func (r *indexRoom) updateLocked() {
	memFull := r.flushing && r.handed >= r.memLimit
	full := memFull || r.l0 >= r.l0Limit
	was := r.full.Swap(full)
	switch {
	case full && !was:
		if memFull {
			r.stallReason = "a memtable flush is running and the next memtable is full"
		} else {
			r.stallReason = fmt.Sprintf("L0 holds %d sublevels (limit %d): waiting for a compaction", r.l0, r.l0Limit)
		}
	case !full && was:
		close(r.changed)
		r.changed = make(chan struct{})
		if !r.stallStart.IsZero() {
			d := time.Since(r.stallStart)
			r.stallCount++
			r.stallTime += d
			r.stallStart = time.Time{}
			if d >= r.logAfter && r.logger != nil {
				// Not under mu, which Pebble's callbacks take under its
				// DB.mu: a slow log must not hold the index up.
				go r.logger.Warn("index write stall ended: writers waited for the index", "stalled", d.Round(time.Millisecond),
					"cause", r.stallReason)
			}
		}
	}
}

// stallStats returns the stalls ended since Open and their summed length.
func (r *indexRoom) stallStats() (int64, time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.stallCount, r.stallTime
}

// flushBegin: Pebble started flushing the memtables queued so far. What is
// handed to it from now on goes into the memtable that fills meanwhile.
func (r *indexRoom) flushBegin() {
	r.mu.Lock()
	r.flushing, r.handed = true, 0
	r.updateLocked()
	r.mu.Unlock()
}

// flushEnd: the flush ended (done or failed).
func (r *indexRoom) flushEnd() {
	r.mu.Lock()
	r.flushing = false
	r.updateLocked()
	r.mu.Unlock()
	r.kick()
}

// add counts a batch handed to Pebble.
func (r *indexRoom) add(b *pebble.Batch) {
	n := int64(b.Len()) + memtableEntryOverhead*int64(b.Count())
	r.mu.Lock()
	r.handed += n
	r.updateLocked()
	r.mu.Unlock()
}

func (r *indexRoom) setL0(n int64) {
	r.mu.Lock()
	r.l0 = n
	r.updateLocked()
	r.mu.Unlock()
}

// kick asks the measuring goroutine to read L0 again. It never blocks: it
// runs in Pebble's callbacks.
func (r *indexRoom) kick() {
	select {
	case r.poke <- struct{}{}:
	default:
	}
}

// wait returns once the index has room, or failed or closing is closed
// (closing may be nil: not waited for). It reports whether closing ended a
// wait while the index had no room. The caller holds no lock of the
// store's.
func (r *indexRoom) wait(failed, closing <-chan struct{}) (closed bool) {
	if !r.full.Load() {
		return false
	}
	r.mu.Lock()
	r.stalls++
	if r.full.Load() && r.stallStart.IsZero() {
		r.stallStart = time.Now()
	}
	r.mu.Unlock()
	for {
		r.mu.Lock()
		if !r.full.Load() {
			r.mu.Unlock()
			return false
		}
		ch := r.changed
		r.mu.Unlock()
		select {
		case <-ch:
		case <-failed:
			return false
		case <-closing:
			return true
		}
	}
}

// start measures db's L0 now and after every flush and compaction, until
// stop. A new DB has no flush running.
func (r *indexRoom) start(db *pebble.DB) {
	r.mu.Lock()
	r.flushing, r.handed = false, 0
	r.stop, r.done = make(chan struct{}), make(chan struct{})
	stop, done := r.stop, r.done
	r.mu.Unlock()
	r.setL0(int64(db.Metrics().Levels[0].Sublevels))
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			case <-r.poke:
			}
			r.setL0(int64(db.Metrics().Levels[0].Sublevels))
		}
	}()
}

// stopMeasuring ends start's goroutine; the DB may be closed once it
// returns. It forgets L0: no writer waits for a closed DB.
func (r *indexRoom) stopMeasuring() {
	r.mu.Lock()
	stop, done := r.stop, r.done
	r.stop, r.done = nil, nil
	r.mu.Unlock()
	if stop == nil {
		return
	}
	close(stop)
	<-done
	r.mu.Lock()
	r.flushing, r.l0 = false, 0
	r.updateLocked()
	r.mu.Unlock()
}

// waitForIndexRoom is the store's back-pressure (see the top of this
// file): it returns once the index has room for more writes or the store
// failed (the writer then finds it failed), or ErrClosed once Close began
// while there was none: a writer let through then could fill memtables up
// to Pebble's own stall, under mu, during Close's checkpoint. Call it
// holding no lock of the store's.
func (s *Store) waitForIndexRoom() error {
	if s.room.wait(s.failedCh, s.ckptStop) {
		return ErrClosed
	}
	return nil
}

// waitForIndexRoomToClose is waitForIndexRoom for the checkpoint and what it
// writes (Close's own included) and for Open's replay: it waits for room or
// a failure, whether or not Close began (a flush is running, so one of the
// two is coming).
func (s *Store) waitForIndexRoomToClose() {
	s.room.wait(s.failedCh, nil)
}
