package storage

import (
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2"
)

// compactionGate is the index's compaction scheduler (Pebble's
// Options.Experimental.CompactionScheduler). It grants no compaction until
// pebble.Open has returned, then grants like Pebble's default: as many
// at once as the DB allows, checked when the DB asks, when a compaction ends
// and every 100 ms.
//
// Why: Pebble v2.1.7's Open waits for every running compaction before it
// returns (it scans for obsolete files with compactions stopped), and its
// default scheduler may start one the moment Open registers the DB. After a
// crash at the end of a heavy fill the index holds dozens of L0 tables, the
// compaction takes seconds, and a restart measured 7–8.6 s of which more
// than 7 s was Open waiting for it (bench/README.md, 10M delayed jobs;
// upstream cockroachdb/pebble#5420). Held until pebble.Open returns, the
// same compaction runs beside the replay of the AOF tail. (Not later: the
// replay may flush memtables, and with L0 at the store's stop-writes
// threshold (backpressure.go) it would wait for a compaction the gate did
// not allow.)
type compactionGate struct {
	mu     sync.Mutex
	db     pebble.DBForCompaction
	open   bool // grants allowed
	closed bool
	// held: the store failed and fenced the index; no compaction may
	// start (see hold).
	held    bool
	running int // compactions granted and not yet done

	poke chan struct{} // capacity 1: wakes the granter
	stop chan struct{}
	done chan struct{}
}

var _ pebble.CompactionScheduler = (*compactionGate)(nil)

func newCompactionGate() *compactionGate {
	return &compactionGate{poke: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
}

// Register implements pebble.CompactionScheduler.
func (g *compactionGate) Register(_ int, db pebble.DBForCompaction) {
	g.mu.Lock()
	g.db = db
	g.mu.Unlock()
	go g.granter()
}

// Unregister implements pebble.CompactionScheduler: once it returns the
// granter makes no more calls into the DB.
func (g *compactionGate) Unregister() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	close(g.stop)
	<-g.done
}

// hold grants no compaction from now on: the store failed. Most
// compactions would wait at the fence (fence.go), but a move compaction
// writes only a MANIFEST edit, which after a failed MANIFEST write fails at
// once, every time: Pebble would retry it in a loop. (Delete-only
// compactions bypass the scheduler; a failed MANIFEST can still make those
// retry.)
func (g *compactionGate) hold() {
	g.mu.Lock()
	g.held = true
	g.mu.Unlock()
}

// Open lets compactions run: the store is open.
func (g *compactionGate) Open() {
	g.mu.Lock()
	g.open = true
	g.mu.Unlock()
	g.wake()
}

func (g *compactionGate) wake() {
	select {
	case g.poke <- struct{}{}:
	default:
	}
}

// TrySchedule implements pebble.CompactionScheduler. The DB calls it with
// its own mutex held, so it must not call back into the DB except for
// GetAllowedWithoutPermission, which takes no DB lock.
func (g *compactionGate) TrySchedule() (bool, pebble.CompactionGrantHandle) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open || g.closed || g.held || g.running >= g.db.GetAllowedWithoutPermission() {
		return false, nil
	}
	g.running++
	return true, g
}

// UpdateGetAllowedWithoutPermission implements pebble.CompactionScheduler.
func (g *compactionGate) UpdateGetAllowedWithoutPermission() { g.wake() }

// granter grants waiting compactions while there is room. Only it calls
// GetWaitingCompaction and Schedule, never with g.mu held: the DB takes its
// own mutex in them, and holds it when it calls TrySchedule, which takes
// g.mu.
func (g *compactionGate) granter() {
	defer close(g.done)
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-g.poke:
		case <-t.C:
		}
		for g.reserve() {
			waiting, _ := g.db.GetWaitingCompaction()
			if !waiting {
				g.release()
				break
			}
			scheduled, stale := g.schedule()
			if stale {
				g.release()
				continue // the stale pick is gone: Pebble picks afresh
			}
			if !scheduled {
				g.release()
				break
			}
		}
	}
}

// schedule asks the DB to start its waiting compaction, and survives a
// defect of Pebble v2.1.7. When the scheduler refuses a manual compaction
// (DB.Compact) Pebble caches the pick; if Compact then gives up on it (its
// context ends, or an earlier compaction of the same call failed, as when
// the index's disk fails) the manual compaction leaves Pebble's queue but
// not the cache, and Schedule panics when it meets it ("did not find manual
// compaction with id N") after taking it out of the cache. The panic comes
// before the compaction marks any table or counts itself, and Schedule's
// deferred unlocks release the DB's mutexes, so the DB is as if the pick
// had never been made: stale reports it, and the granter asks again. Any
// other panic is not ours to hide.
func (g *compactionGate) schedule() (scheduled, stale bool) {
	defer func() {
		if r := recover(); r != nil {
			if err, ok := r.(error); ok && strings.Contains(err.Error(), "did not find manual compaction with id") {
				slog.Warn("storage: dropped a manual compaction of the index that its caller had given up on", "pebble", err.Error())
				scheduled, stale = false, true
				return
			}
			panic(r)
		}
	}()
	return g.db.Schedule(g), false
}

// reserve takes a slot for a compaction if the gate is open and the DB
// allows another.
func (g *compactionGate) reserve() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.open || g.closed || g.held || g.running >= g.db.GetAllowedWithoutPermission() {
		return false
	}
	g.running++
	return true
}

func (g *compactionGate) release() {
	g.mu.Lock()
	g.running--
	g.mu.Unlock()
}

// The grant handle: the gate is its own handle.

// Started implements pebble.CompactionGrantHandle.
func (g *compactionGate) Started() {}

// MeasureCPU implements pebble.CompactionGrantHandle.
func (g *compactionGate) MeasureCPU(pebble.CompactionGoroutineKind) {}

// CumulativeStats implements pebble.CompactionGrantHandle.
func (g *compactionGate) CumulativeStats(pebble.CompactionGrantHandleStats) {}

// Done implements pebble.CompactionGrantHandle: a compaction ended, so
// another may start.
func (g *compactionGate) Done() {
	g.release()
	g.wake()
}
