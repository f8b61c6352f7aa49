package server

import (
	"github.com/diskque/diskque/storage"
	"github.com/tidwall/redcon"
)

// The disk half of the guard. min-free-disk is kept by accounting, not by
// polling alone: the filesystem's free space is read every GuardInterval,
// and between readings the estimate is that reading less every byte the
// store has written or queued for writing since (storage.DiskWrites: the
// AOF's records and the index's files), less the reservations of the
// ADDJOBs in flight. An ADDJOB reserves its bytes before its record is
// queued, and is refused with -NOSPACE if the estimate would drop below
// min-free-disk; the reservation is returned once the command has run, by
// when the store's counters hold what it wrote. So a producer at full speed
// meets -NOSPACE before the disk is full, however short the interval it has
// to fill it. The estimate only ever errs low: what checkpoints and the
// collector delete is seen at the next reading.

// diskReading is one reading of the free space under a store.
type diskReading struct {
	st      *storage.Store
	known   bool  // the filesystem tells (an in-memory store does not)
	avail   int64 // free bytes at the reading
	written int64 // st.DiskWrites().Written just before it
}

// jobDiskOverhead is what an ADDJOB is reserved beside its body and queue
// name: its AOF record's header and fields, and the index's job and queue
// keys and values, which reach the disk at the next index flush. Generous:
// a reservation too large refuses a job a little early, one too small lets
// a producer past the reserve.
const jobDiskOverhead = 512

// readDisk reads the free space under st now.
func (s *Server) readDisk(st *storage.Store) *diskReading {
	r := &diskReading{st: st}
	// Before the reading: what is written after it is subtracted from it,
	// whether the reading saw it or not.
	w := st.DiskWrites().Written
	if u, err := st.DiskUsage(); err == nil {
		r.known, r.avail, r.written = true, int64(u.AvailBytes), w
	}
	s.guard.disk.Store(r)
	return r
}

// diskFree estimates the free bytes under st now (see above), reservations
// in flight deducted; false when the filesystem cannot tell.
func (s *Server) diskFree(st *storage.Store) (int64, bool) {
	r := s.guard.disk.Load()
	if r == nil || r.st != st {
		r = s.readDisk(st) // a store just opened (or swapped in)
	}
	if !r.known {
		return 0, false
	}
	return r.avail - (st.DiskWrites().Queued - r.written) - s.guard.diskReserved.Load(), true
}

// measureDisk takes the guard's periodic reading and says whether new jobs
// are refused (free space under min-free-disk) and whether it is low (under
// twice min-free-disk: ADDJOB prefers external replication).
func (s *Server) measureDisk() (noSpace, low bool) {
	ref := s.useBroker()
	if ref == nil {
		return false, false
	}
	defer ref.done()
	st := ref.broker().Store()
	s.readDisk(st)
	if min := s.guard.minFreeDisk.Load(); min > 0 {
		if free, ok := s.diskFree(st); ok {
			return free < min, free < 2*min
		}
	}
	return false, false
}

// jobDiskBytes is what ADDJOB args reserve.
func jobDiskBytes(args [][]byte) int64 {
	n := int64(jobDiskOverhead)
	if len(args) >= 3 {
		n += int64(len(args[1]) + len(args[2]))
	}
	return n
}

// reserveAddJobs reserves disk for the ADDJOB args and the pipelined
// ADDJOBs in rest that share its commit, and returns those that fit (rest
// cut before the first that does not: it is left to the next execute, which
// refuses it, so every reply keeps its place) and the bytes reserved, which
// the caller gives back with releaseDisk once the batch has run. ok false:
// not even args fits, refuse it with -NOSPACE.
func (s *Server) reserveAddJobs(st *storage.Store, args [][]byte, rest []redcon.Command) (_ []redcon.Command, reserved int64, ok bool) {
	min := s.guard.minFreeDisk.Load()
	if min <= 0 {
		return rest, 0, true
	}
	// Reserve first and look after, so that two batches racing for the
	// last room cannot both have it.
	total := jobDiskBytes(args)
	for _, next := range rest {
		total += jobDiskBytes(next.Args)
	}
	s.guard.diskReserved.Add(total)
	free, known := s.diskFree(st)
	if !known {
		s.guard.diskReserved.Add(-total)
		return rest, 0, true
	}
	if free >= min {
		return rest, total, true // the whole batch fits: the common case
	}
	// Near the reserve: keep the head of the batch that fits.
	s.guard.diskReserved.Add(-total)
	room := free + total - min
	kept := jobDiskBytes(args)
	if kept > room {
		return rest, 0, false
	}
	for i, next := range rest {
		n := jobDiskBytes(next.Args)
		if kept+n > room {
			rest = rest[:i]
			break
		}
		kept += n
	}
	s.guard.diskReserved.Add(kept)
	if free, _ := s.diskFree(st); free < min { // others took it meanwhile
		s.guard.diskReserved.Add(-kept)
		return rest, 0, false
	}
	return rest, kept, true
}

// releaseDisk gives back a reservation of reserveAddJobs.
func (s *Server) releaseDisk(n int64) {
	if n != 0 {
		s.guard.diskReserved.Add(-n)
	}
}

// collectorRoom is the collector's gc.Room: how many bytes a collection of
// st may write before the free space under it crosses min-free-disk (with
// min-free-disk 0, before the disk is full). It reads the disk afresh (a
// statfs, once per rewrite batch of up to 1 MiB): a collection asks after
// a checkpoint that removed segments, which the last reading may predate.
func (s *Server) collectorRoom(st *storage.Store) (int64, bool) {
	s.readDisk(st)
	free, ok := s.diskFree(st)
	return free - s.guard.minFreeDisk.Load(), ok
}
