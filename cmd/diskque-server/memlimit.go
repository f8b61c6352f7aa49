package main

import (
	"log/slog"
	"os"
	"runtime/debug"
	"runtime/metrics"
	"time"
)

// The Go runtime's soft memory limit (debug.SetMemoryLimit), set by the
// daemon unless GOMEMLIMIT is in the environment (GOMEMLIMIT=off turns it
// off).
//
// Why: GOGC=200 (main) lets the heap run to three times its live bytes.
// A clustered node holds 30-55 MB live after a 1M-job fill, and its heap in
// use ran to 110-150 MB, RSS 244-267 MB on a replica (bench/README.md,
// "Cluster storage"). A limit caps that excess while keeping GOGC=200's
// cheap collections whenever the live heap is small, which is the common
// case: the backlog lives on disk.
//
// The limit never goes below twice the live heap (retuned every
// memLimitEvery): a fixed limit under a growing live heap would make the
// runtime collect without end (up to half the CPU; most likely why a
// CGO_ENABLED=0 build with GOMEMLIMIT=160MiB, Pebble's 96 MiB cache then
// inside the Go heap, did not finish a 1M-job fill in 14 minutes). At worst
// it behaves as GOGC=100.
const (
	// memLimitLone is the limit's floor on a node without peers, while
	// the live heap is under half of it. A lone node's live heap is 15-17
	// MB under ADDJOB or GETJOB+ACKJOB at pipeline 16, its heap goal 52-70
	// MB at GOGC=200: 96 MiB does not bind there (19 and 36 collections
	// in 300k of each, as without a limit; bench/README.md).
	memLimitLone = 96 << 20
	// memLimitClustered is the floor once the node has peers. A clustered
	// node's live heap is 25-55 MB after a 1M-job fill; at 96 MiB the
	// origin held 222-223 MB, at 64 MiB 189-197 MB. On a lone node 64 MiB
	// would bind: 20 → 24 collections in 300k ADDJOBs, +3% server CPU.
	memLimitClustered = 64 << 20
	memLimitEvery     = time.Second

	// idleAllocs is the allocation in one memLimitEvery under which the
	// node counts as idle, and idleExcess the resident heap beyond the
	// live bytes above which an idle node gives its heap back
	// (debug.FreeOSMemory). Why: under GOGC=200 the heap in use after a
	// burst is up to three times the live heap (61 MB resident for 19-24 MB
	// live after a 1M-job fill), and the scavenger keeps it while the heap
	// goal stands, which is as long as the node is idle. A forced
	// collection of a 20 MB live heap is a few ms, once per burst; under
	// load the node is never idle, so its collections are GOGC's.
	idleAllocs = 1 << 20
	idleExcess = 16 << 20
)

// memLimitFloor is the limit's floor: memLimitLone or, with peers,
// memLimitClustered; or maxmemory when it is set above that (the user
// allows that much live memory; maxmemory bounds the live heap, not RSS);
// plus Pebble's budget when Pebble allocates in the Go heap (a build
// without cgo), since the limit counts every byte the Go runtime holds.
func memLimitFloor(clustered bool, maxMemory, pebbleGoBytes int64) int64 {
	floor := int64(memLimitLone)
	if clustered {
		floor = memLimitClustered
	}
	if maxMemory > floor {
		floor = maxMemory
	}
	return floor + pebbleGoBytes
}

// memLimitFor is the limit for a live heap of live bytes: the floor, or
// twice live when that is more.
func memLimitFor(live, floor int64) int64 {
	if 2*live > floor {
		return 2 * live
	}
	return floor
}

// memLimitTuner keeps the soft memory limit at memLimitFor of the live heap.
type memLimitTuner struct {
	floor  func() int64 // read at every retune: CONFIG SET maxmemory counts
	set    func(int64) int64
	sample []metrics.Sample
	last   int64

	free       func() // debug.FreeOSMemory
	heap       []metrics.Sample
	lastAllocs uint64
}

func newMemLimitTuner(floor func() int64) *memLimitTuner {
	return &memLimitTuner{
		floor:  floor,
		set:    debug.SetMemoryLimit,
		sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}},
		free:   debug.FreeOSMemory,
		heap: []metrics.Sample{
			{Name: "/gc/heap/allocs:bytes"},
			{Name: "/memory/classes/heap/objects:bytes"},
			{Name: "/memory/classes/heap/unused:bytes"},
			{Name: "/memory/classes/heap/free:bytes"},
			{Name: "/gc/heap/live:bytes"},
		},
	}
}

// releaseIfIdle gives the heap's garbage and free spans back to the kernel
// when the node allocated less than idleAllocs since the last call and its
// resident heap exceeds the live heap by more than idleExcess. It reports
// whether it did. The first call only records the allocation count.
func (t *memLimitTuner) releaseIfIdle() bool {
	metrics.Read(t.heap)
	var v [5]uint64
	for i, s := range t.heap {
		if s.Value.Kind() == metrics.KindUint64 {
			v[i] = s.Value.Uint64()
		}
	}
	allocs, resident, live := v[0], v[1]+v[2]+v[3], v[4]
	first, quiet := t.lastAllocs == 0, allocs-t.lastAllocs < idleAllocs
	t.lastAllocs = allocs
	if first || !quiet || resident < live+idleExcess {
		return false
	}
	t.free()
	metrics.Read(t.heap[:1]) // the collection's own allocations do not make the next tick busy
	if t.heap[0].Value.Kind() == metrics.KindUint64 {
		t.lastAllocs = t.heap[0].Value.Uint64()
	}
	return true
}

// retune sets the limit for the live heap of the last collection, when it
// moved by more than 1/16 (SetMemoryLimit is cheap, but no reason to call
// it every second for nothing). It returns the limit in force.
func (t *memLimitTuner) retune() int64 {
	metrics.Read(t.sample)
	var live int64
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		live = int64(t.sample[0].Value.Uint64())
	}
	want := memLimitFor(live, t.floor())
	if d := want - t.last; t.last == 0 || d > t.last/16 || -d > t.last/16 {
		t.set(want)
		t.last = want
	}
	return t.last
}

// startMemLimit sets the soft memory limit and retunes it until stop is
// closed; it does nothing when GOMEMLIMIT is in the environment.
func startMemLimit(log *slog.Logger, floor func() int64, stop <-chan struct{}) {
	if os.Getenv("GOMEMLIMIT") != "" {
		log.Info("memory limit from GOMEMLIMIT", "limit", os.Getenv("GOMEMLIMIT"))
		return
	}
	t := newMemLimitTuner(floor)
	log.Info("memory limit", "limit", t.retune(), "malloc_arena_max", mallocArenas())
	go func() {
		tick := time.NewTicker(memLimitEvery)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				was := t.last // read first: in "was, now := t.last, t.retune()" Go may read t.last after the call
				if now := t.retune(); now != was {
					log.Debug("memory limit", "limit", now)
				}
				if t.releaseIfIdle() {
					log.Debug("idle: heap returned to the kernel")
				}
			}
		}
	}()
}
