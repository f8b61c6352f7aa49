package server

import (
	"runtime"
	rtmetrics "runtime/metrics"
	"sync"
	"sync/atomic"
	"time"
)

// guard watches free disk space and memory and trips the refusals of new
// jobs: ADDJOB gets -NOSPACE below min-free-disk (so the AOF never hits a
// full disk, which would fail the store until a restart) and -OOM above
// maxmemory. Everything else — GETJOB, ACKJOB, reads — goes on, and the
// refusals lift by themselves when space or memory comes back. The
// measures are taken every GuardInterval by one goroutine, and when
// maxmemory is set, so the hot path only reads two flags — and, for the
// disk, reserves its ADDJOB's bytes against the last reading less what the
// store wrote since (diskguard.go), so a producer faster than the interval
// cannot fill the disk between two.
type guard struct {
	// measuring serialises measures, so that one taken with an old limit
	// cannot land after one taken with the new.
	measuring   sync.Mutex
	minFreeDisk atomic.Int64 // bytes; 0: off
	maxMemory   atomic.Int64 // bytes; 0: off
	noSpace     atomic.Bool
	oom         atomic.Bool
	// The pressure short of the limits at which ADDJOB in a cluster
	// prefers external replication (pressure.go): free disk under twice
	// min-free-disk, used memory over 75 % of maxmemory.
	diskLow atomic.Bool
	memHigh atomic.Bool
	// The disk accounting (diskguard.go): the last reading of free space,
	// and the bytes reserved by ADDJOBs in flight.
	disk         atomic.Pointer[diskReading]
	diskReserved atomic.Int64

	// The collections measure forces while over maxmemory (under
	// measuring): when the last was, the wait before the next, and the request
	// bytes held then.
	lastGC   time.Time
	gcEvery  time.Duration
	heldAtGC int64
}

// SetMinFreeDisk changes min-free-disk in bytes (0 turns the check off).
func (s *Server) SetMinFreeDisk(n int64) { s.guard.minFreeDisk.Store(max(n, 0)) }

// SetMaxMemory changes maxmemory in bytes (0 turns the check off) and,
// when that changes it, measures at once, as Disque checks it before every
// command: the next ADDJOB sees the new limit. (CONFIG SET of any directive
// sets them all again: one that leaves maxmemory as it was measures nothing.)
func (s *Server) SetMaxMemory(n int64) {
	if n = max(n, 0); s.guard.maxMemory.Swap(n) != n {
		s.measure()
	}
}

// runGuard measures until the server closes.
func (s *Server) runGuard(every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		s.measure()
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) measure() {
	g := &s.guard
	g.measuring.Lock()
	defer g.measuring.Unlock()
	// An in-memory store (or a filesystem that cannot tell) has no disk to
	// run out of.
	noSpace, diskLow := s.measureDisk()
	if noSpace != g.noSpace.Load() {
		g.noSpace.Store(noSpace)
		s.logGuard("min-free-disk", noSpace, g.minFreeDisk.Load())
	}
	g.diskLow.Store(diskLow)
	oom, high := false, false
	if limit := g.maxMemory.Load(); limit > 0 {
		// The collection overMaxMemory may force answers for the 75 %
		// mark, and the limit is read from the same figure after it.
		high = s.overMaxMemory(limit / 4 * 3)
		oom = high && s.usedMemory() > limit
	}
	g.memHigh.Store(high)
	if oom != g.oom.Load() {
		g.oom.Store(oom)
		s.logGuard("maxmemory", oom, g.maxMemory.Load())
	}
	if oom {
		s.evictIdleQueues()
	}
}

func (s *Server) logGuard(what string, refusing bool, limit int64) {
	if refusing {
		s.opts.Logger.Warn("server: refusing new jobs", "limit", what, "bytes", limit)
	} else {
		s.opts.Logger.Info("server: accepting new jobs again", "limit", what, "bytes", limit)
	}
}

// refuseNewJob returns the error reply for an ADDJOB the guard refuses, or "".
func (s *Server) refuseNewJob() string {
	switch {
	case s.guard.noSpace.Load():
		return errNoSpace
	case s.guard.oom.Load():
		return errOOM
	}
	return ""
}

// Memory. maxmemory is compared with usedMemory: the Go heap's live bytes
// (as of the last collection) plus the request bodies being read now
// (reqmem.go) — not RSS, which stays up long after the heap shrinks,
// because the runtime returns freed pages to the OS slowly. The live size
// is only known after a collection, and an idle server collects only every
// two minutes; so while it is over the limit, measure forces a collection,
// at most once a second, backing off to once every 16 s while that does not
// bring it under (a heap that is really full costs a collection of it each
// time) and back to once a second whenever request bytes are released.
// Under it as of the last collection (or before the first, when the live
// size reads 0) but with more heap objects now than the limit, garbage
// included, measure also collects, at most once a second, to find out: so
// a tiny maxmemory (Disque's tests set 1 byte) refuses at once.

const (
	minForcedGC = time.Second
	maxForcedGC = 16 * time.Second
)

var heapMetrics = []rtmetrics.Sample{
	{Name: "/gc/heap/live:bytes"},
	{Name: "/memory/classes/heap/objects:bytes"},
}

// heapBytes returns the Go heap's live bytes as of the last collection (0
// before the first) and the bytes of its objects now, garbage included.
func heapBytes() (live, objects int64) {
	sample := make([]rtmetrics.Sample, len(heapMetrics))
	copy(sample, heapMetrics)
	rtmetrics.Read(sample)
	if sample[0].Value.Kind() == rtmetrics.KindUint64 && sample[1].Value.Kind() == rtmetrics.KindUint64 {
		return int64(sample[0].Value.Uint64()), int64(sample[1].Value.Uint64())
	}
	var ms runtime.MemStats // a runtime without the metrics
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc), int64(ms.HeapAlloc)
}

// liveHeap returns the Go heap's live bytes as of the last collection.
func liveHeap() int64 {
	live, _ := heapBytes()
	return live
}

// usedMemory is INFO's used_memory and what maxmemory bounds: the live heap
// plus the request bodies being read (those already in the heap at the last
// collection count twice until their commands run: it errs on the high side).
func (s *Server) usedMemory() int64 {
	held, _ := s.reqMem.stats()
	return liveHeap() + held
}

// overMaxMemory says whether used memory is over limit, forcing a
// collection first when the figure may be stale (see above).
func (s *Server) overMaxMemory(limit int64) bool {
	g := &s.guard
	held, _ := s.reqMem.stats()
	if live, objects := heapBytes(); live+held <= limit {
		// Under it as of the last collection, which may be long ago (or
		// none yet: live is 0): the heap's objects now, garbage included,
		// bound what a collection would find. Over that bound, one finds
		// out, at most once a second.
		g.gcEvery = 0
		if objects+held <= limit || time.Since(g.lastGC) < minForcedGC {
			return false
		}
		runtime.GC()
		g.lastGC, g.heldAtGC = time.Now(), held
		return s.usedMemory() > limit
	}
	if g.gcEvery == 0 || held < g.heldAtGC {
		g.gcEvery = minForcedGC
	}
	if time.Since(g.lastGC) < g.gcEvery {
		return true
	}
	runtime.GC()
	g.lastGC, g.heldAtGC = time.Now(), held
	if s.usedMemory() <= limit {
		g.gcEvery = 0
		return false
	}
	g.gcEvery = min(2*g.gcEvery, maxForcedGC)
	return true
}
