package server

import (
	"runtime"
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
	// The disk accounting (diskguard.go): the last reading of free space,
	// and the bytes reserved by ADDJOBs in flight.
	disk         atomic.Pointer[diskReading]
	diskReserved atomic.Int64
}

// SetMinFreeDisk changes min-free-disk in bytes (0 turns the check off).
func (s *Server) SetMinFreeDisk(n int64) { s.guard.minFreeDisk.Store(max(n, 0)) }

// SetMaxMemory changes maxmemory in bytes (0 turns the check off) and
// measures at once, as Disque checks it before every command: the next
// ADDJOB sees the new limit.
func (s *Server) SetMaxMemory(n int64) {
	s.guard.maxMemory.Store(max(n, 0))
	s.measure()
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
	noSpace := s.measureDisk()
	if noSpace != g.noSpace.Load() {
		g.noSpace.Store(noSpace)
		s.logGuard("min-free-disk", noSpace, g.minFreeDisk.Load())
	}
	oom := false
	if limit := g.maxMemory.Load(); limit > 0 {
		used := int64(rssBytes())
		if used == 0 { // no /proc: what the Go runtime holds
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			used = int64(ms.Sys - ms.HeapReleased)
		}
		oom = used > limit
	}
	if oom != g.oom.Load() {
		g.oom.Store(oom)
		s.logGuard("maxmemory", oom, g.maxMemory.Load())
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
