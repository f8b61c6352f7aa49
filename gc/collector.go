package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// Options configure a Collector. The zero value of a field means its default.
type Options struct {
	// Interval is how often the background loop looks for work. A look
	// that finds nothing to rewrite costs one pass over the segment list.
	// Default 10s; negative disables the loop (Collect still works).
	Interval time.Duration
	// MinLiveRatio: background collections rewrite sealed segments whose
	// live bodies are less than this share of their bytes. Default 0.5.
	MinLiveRatio float64
	// MaxMoveBytes bounds the live bytes one background collection copies.
	// Default 256 MiB.
	MaxMoveBytes int64
	// CompactAfterDeletes: once this many queue-order and schedule keys
	// were deleted since the last compaction, a collection compacts that
	// part of the index. Default 1,000,000; negative disables it.
	CompactAfterDeletes int64
	// Logger receives a line per collection that did something. Default
	// slog.Default().
	Logger *slog.Logger
}

// EnsureDefaults fills in every zero field with its default.
func (o *Options) EnsureDefaults() {
	if o.Interval == 0 {
		o.Interval = 10 * time.Second
	}
	if o.MinLiveRatio == 0 {
		o.MinLiveRatio = 0.5
	}
	if o.MaxMoveBytes == 0 {
		o.MaxMoveBytes = 256 << 20
	}
	if o.CompactAfterDeletes == 0 {
		o.CompactAfterDeletes = 1_000_000
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
}

// Validate reports every invalid field.
func (o *Options) Validate() error {
	var errs []error
	if o.MinLiveRatio < 0 || o.MinLiveRatio > 1 {
		errs = append(errs, fmt.Errorf("gc: MinLiveRatio %v outside [0, 1]", o.MinLiveRatio))
	}
	return errors.Join(errs...)
}

// Report tells what one collection did.
type Report struct {
	Full bool
	// Rewritten segments, and the bodies and bytes their rewrite copied.
	Rewritten               int
	BodiesMoved, BytesMoved int64
	// Removed segments and their bytes: dead ones and rewritten ones, by
	// the collection's checkpoints.
	Removed        int64
	BytesReclaimed int64
	// Compacted: the order index was compacted.
	Compacted bool
	Duration  time.Duration
}

// Stats are the Collector's counters since it was made.
type Stats struct {
	Collections     int64 // collections run (background and on demand)
	FullCollections int64
	Running         bool // a collection is running now
	Last            Report
	LastErr         error
}

// ErrBusy is returned by Start when a collection is already running.
var ErrBusy = errors.New("gc: a collection is already running")

// ErrClosed is returned by Start and Collect once Close has been called.
var ErrClosed = errors.New("gc: collector closed")

// Collector runs collections of one store, one at a time.
type Collector struct {
	st   *storage.Store
	opts Options

	run sync.Mutex // held for the whole of a collection: single flight

	mu    sync.Mutex // guards stats, lastCompactDeletes and closed
	stats Stats
	// closed is set by Close before it waits for wg, so that no Start
	// adds to wg after (or while) Close waits on it.
	closed bool
	// lastCompactDeletes is the store's OrderDeletes at the last compaction.
	lastCompactDeletes int64
	// seen is each segment's live bytes at the last collection (Policy
	// Previous); nil before the first, when there is no history. Guarded by
	// run.
	seen map[wal.LSN]int64

	done chan struct{}  // closed when the background loop has returned
	wg   sync.WaitGroup // collections started by Start
	// ctx is canceled by Close: it stops the loop, and a rewrite in
	// progress stops between batches instead of holding a shutdown for a
	// whole segment.
	ctx    context.Context
	cancel context.CancelFunc
}

// New returns a Collector for st and starts its background loop (unless
// Options.Interval is negative). Close stops it.
func New(st *storage.Store, opts Options) (*Collector, error) {
	opts.EnsureDefaults()
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	c := &Collector{st: st, opts: opts, done: make(chan struct{})}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if opts.Interval > 0 {
		// The background loop's history starts now, so that its first
		// collection already leaves alone segments being drained.
		c.seen = liveBytes(st.Stats().Segments)
		go c.loop()
	} else {
		close(c.done)
	}
	return c, nil
}

func (c *Collector) loop() {
	defer close(c.done)
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
		}
		if c.ctx.Err() != nil {
			return // a tick and Close may both be ready: Close wins
		}
		if !c.run.TryLock() {
			continue // an on-demand collection is running
		}
		_, err := c.collectLocked(false)
		c.run.Unlock()
		if err != nil && !errors.Is(err, storage.ErrClosed) {
			c.opts.Logger.Error("gc: collection failed", "err", err)
		}
	}
}

// Close stops the background loop and waits for any collection to finish.
// The store must still be open.
func (c *Collector) Close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.cancel()
	<-c.done
	c.wg.Wait()
	// And a Collect in progress (its ctx is canceled: it stops between
	// batches).
	c.run.Lock()
	c.run.Unlock()
}

// Collect runs one collection now and returns what it did, waiting for a
// running one to finish first. full rewrites every sealed segment that
// still holds a live body, with no bound on the bytes moved (BGREWRITEAOF);
// otherwise the Options' policy applies.
func (c *Collector) Collect(full bool) (Report, error) {
	c.run.Lock()
	defer c.run.Unlock()
	if c.isClosed() {
		return Report{}, ErrClosed
	}
	return c.collectLocked(full)
}

func (c *Collector) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// Start runs a collection in the background and returns at once; ErrBusy if
// one is running, ErrClosed after Close. Its outcome is in Stats.
func (c *Collector) Start(full bool) error {
	// Under mu: Close sets closed under mu before it waits, so its Wait
	// never runs beside this Add, and Stats (which tries run under mu)
	// never mistakes this TryLock for a running collection.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	if !c.run.TryLock() {
		return ErrBusy
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer c.run.Unlock()
		if _, err := c.collectLocked(full); err != nil && !errors.Is(err, storage.ErrClosed) {
			c.opts.Logger.Error("gc: collection failed", "err", err, "full", full)
		}
	}()
	return nil
}

// Stats returns the Collector's counters.
func (c *Collector) Stats() Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.stats
	if c.run.TryLock() {
		c.run.Unlock()
	} else {
		st.Running = true
	}
	return st
}

// collectLocked is one collection; c.run is held.
func (c *Collector) collectLocked(full bool) (rep Report, err error) {
	start := time.Now()
	rep.Full = full
	before := c.st.Stats().Collect
	defer func() {
		after := c.st.Stats().Collect
		rep.Removed = after.SegmentsRemoved - before.SegmentsRemoved
		rep.BytesReclaimed = after.BytesReclaimed - before.BytesReclaimed
		rep.Duration = time.Since(start)
		c.mu.Lock()
		c.stats.Collections++
		if full {
			c.stats.FullCollections++
		}
		c.stats.Last, c.stats.LastErr = rep, err
		c.mu.Unlock()
		if err == nil && (rep.Rewritten > 0 || rep.Removed > 0 || rep.Compacted || full) {
			c.opts.Logger.Info("gc: collection", "full", full, "rewritten", rep.Rewritten,
				"bodies_moved", rep.BodiesMoved, "bytes_moved", rep.BytesMoved,
				"segments_removed", rep.Removed, "bytes_reclaimed", rep.BytesReclaimed,
				"index_compacted", rep.Compacted, "took", rep.Duration.Round(time.Millisecond))
		}
	}()
	segs := c.st.Stats().Segments
	policy := Policy{MinLiveRatio: c.opts.MinLiveRatio, MaxMoveBytes: c.opts.MaxMoveBytes, Previous: c.seen}
	c.seen = liveBytes(segs)
	if full {
		// Everything sealed becomes eligible: checkpoint first so that the
		// segments written since the last checkpoint are.
		policy = Policy{MinLiveRatio: 1}
		if err := c.st.Checkpoint(); err != nil {
			return rep, err
		}
		segs = c.st.Stats().Segments
	}
	for _, first := range pick(segs, policy) {
		res, err := c.st.RewriteSegment(c.ctx, first)
		if errors.Is(err, context.Canceled) {
			// Closing: what was moved is safe; the next checkpoint (Close
			// makes one) removes what was fully rewritten.
			return rep, nil
		}
		if err != nil {
			return rep, fmt.Errorf("gc: rewrite segment %016x: %w", uint64(first), err)
		}
		rep.Rewritten++
		rep.BodiesMoved += res.Moved
		rep.BytesMoved += res.MovedBytes
	}
	if rep.Rewritten > 0 || full {
		if err := c.st.Checkpoint(); err != nil {
			return rep, err
		}
	}
	if c.opts.CompactAfterDeletes > 0 || full {
		deletes := c.st.Stats().Collect.OrderDeletes
		c.mu.Lock()
		due := deletes-c.lastCompactDeletes >= c.opts.CompactAfterDeletes || (full && deletes > c.lastCompactDeletes)
		c.mu.Unlock()
		if due {
			if err := c.st.CompactOrderIndex(c.ctx); err != nil {
				return rep, err
			}
			rep.Compacted = true
			c.mu.Lock()
			c.lastCompactDeletes = deletes
			c.mu.Unlock()
		}
	}
	return rep, nil
}
