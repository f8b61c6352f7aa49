package storage

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/diskque/diskque/wal"
)

// Background verification. Open reads only the AOF tail the index has not
// applied, so damage to an older segment — a flipped byte on a disk that
// rots — would otherwise go unseen until a GETJOB tripped on the body it
// hit. After Open the store reads every sealed segment once, at most
// Options.VerifyRate bytes a second, and checks every checksum; it logs
// progress and each damaged segment, and Stats().Verify reports the result
// (INFO's aof_verify_* lines). Damage found does not stop the store: the
// jobs whose bodies it hit are reported when read (GETJOB leaves them
// undelivered), and `diskque-server check` says which.

// VerifyState says where the background verification is.
type VerifyState uint8

const (
	VerifyOff     VerifyState = iota // disabled (Options.VerifyRate < 0)
	VerifyRunning                    // reading sealed segments
	VerifyDone                       // every sealed segment was read
)

func (v VerifyState) String() string {
	switch v {
	case VerifyRunning:
		return "running"
	case VerifyDone:
		return "done"
	}
	return "off"
}

// VerifyStats is the outcome of the background verification so far.
type VerifyStats struct {
	State VerifyState
	// Segments and Bytes count the sealed segments read and their bytes;
	// Total is how many there were to read.
	Segments, Total int
	Bytes           int64
	// Damaged counts segments with a record that failed its checksum;
	// LastDamage describes the last one found.
	Damaged    int
	LastDamage string
	// Took is how long the whole verification took (once done).
	Took time.Duration
}

// verifier runs the background verification of one store.
type verifier struct {
	mu     sync.Mutex
	stats  VerifyStats
	cancel context.CancelFunc
	done   chan struct{}
}

// startVerify starts the background verification of the segments sealed
// now, unless it is disabled.
func (s *Store) startVerify() {
	s.verify.done = make(chan struct{})
	if s.opts.VerifyRate < 0 {
		close(s.verify.done)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.verify.cancel = cancel
	segs := s.log.Segments()
	segs = segs[:len(segs)-1] // the active one is still being written
	s.verify.stats = VerifyStats{State: VerifyRunning, Total: len(segs)}
	go s.verifyLoop(ctx, segs)
}

// stopVerify stops the verification and waits for it.
func (s *Store) stopVerify() {
	if s.verify.cancel != nil {
		s.verify.cancel()
	}
	if s.verify.done != nil {
		<-s.verify.done
	}
}

func (s *Store) verifyLoop(ctx context.Context, segs []wal.SegmentInfo) {
	defer close(s.verify.done)
	start := time.Now()
	lastLog := start
	var total int64
	for _, seg := range segs {
		total += seg.Size
	}
	if len(segs) > 0 {
		s.opts.Logger.Info("storage: verifying the sealed aof segments in the background",
			"segments", len(segs), "bytes", total, "rate_bytes_per_sec", s.opts.VerifyRate)
	}
	for _, seg := range segs {
		err := s.log.VerifySegmentPaced(ctx, seg.First, s.opts.VerifyRate)
		if ctx.Err() != nil {
			return // closing: the next start verifies again
		}
		s.verify.mu.Lock()
		switch {
		case err == nil:
		case errors.Is(err, wal.ErrNotFound):
			// Removed meanwhile (its bodies all died): nothing to check.
		case errors.Is(err, wal.ErrCorrupt):
			s.verify.stats.Damaged++
			s.verify.stats.LastDamage = err.Error()
			s.opts.Logger.Error("storage: damaged aof segment found by the background verification: "+
				"jobs whose records lie after the damage may be unreadable; run `diskque-server check` on the data directory "+
				"(with the server stopped) to see which", "segment", seg.Name, "err", err)
		default:
			s.verify.stats.LastDamage = err.Error()
			s.opts.Logger.Warn("storage: the background verification could not read a segment", "segment", seg.Name, "err", err)
		}
		s.verify.stats.Segments++
		s.verify.stats.Bytes += seg.Size
		st := s.verify.stats
		s.verify.mu.Unlock()
		if time.Since(lastLog) > 10*time.Second {
			lastLog = time.Now()
			s.opts.Logger.Info("storage: verifying the aof", "segments", fmt.Sprintf("%d/%d", st.Segments, st.Total),
				"bytes", fmt.Sprintf("%d/%d", st.Bytes, total), "damaged", st.Damaged)
		}
	}
	s.verify.mu.Lock()
	s.verify.stats.State = VerifyDone
	s.verify.stats.Took = time.Since(start)
	st := s.verify.stats
	s.verify.mu.Unlock()
	if st.Total > 0 {
		s.opts.Logger.Info("storage: aof verified", "segments", st.Segments, "bytes", st.Bytes,
			"damaged", st.Damaged, "took", st.Took.Round(time.Millisecond))
	}
}

// verifyStats returns the verification's outcome so far.
func (s *Store) verifyStats() VerifyStats {
	s.verify.mu.Lock()
	defer s.verify.mu.Unlock()
	return s.verify.stats
}
