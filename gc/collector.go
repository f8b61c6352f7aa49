package gc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
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
	// SkippedForSpace counts the collections that were not started, cut
	// down or stopped because they would have written past the room the
	// Room function gave (min-free-disk); LastSkip says why the last one
	// was, with the figures ("" before the first).
	SkippedForSpace int64
	LastSkip        string
}

// A Room reports how many bytes a collection of st may write before the
// free disk space under it falls below the reserve the server keeps
// (min-free-disk): negative when it is below already; ok false when it
// cannot tell (an in-memory store), and then a collection is not limited.
type Room func(st *storage.Store) (bytes int64, ok bool)

// ErrNoRoom is returned by Start and Collect for a full collection that
// would write more than the Room allows, and by a collection stopped
// before it would cross it; nothing was lost (see Stats.LastSkip).
var ErrNoRoom = errors.New("gc: not enough free disk space above min-free-disk")

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

	// room, when set (SetRoom), keeps collections within the disk's room.
	room atomic.Pointer[Room]
	// skipping: the last background collection was cut for space (its
	// log line is at WARN once, then DEBUG).
	skipping atomic.Bool

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
// still holds a live body, with no bound on the bytes moved (BGREWRITEAOF)
// — unless that would write past the Room (SetRoom): then it does not
// start and returns ErrNoRoom; otherwise the Options' policy applies.
func (c *Collector) Collect(full bool) (Report, error) {
	c.run.Lock()
	defer c.run.Unlock()
	if c.isClosed() {
		return Report{}, ErrClosed
	}
	if full {
		// Not past the reserve (min-free-disk); checked before the
		// checkpoint a full collection starts with, which writes too.
		if err := c.fullFits(); err != nil {
			c.noteSkip(true, err.Error())
			return Report{Full: true}, err
		}
	}
	return c.collectLocked(full)
}

func (c *Collector) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// SetRoom makes every later collection keep within r: a collection that
// would write more than r allows does not start (a full one) or takes only
// the segments that fit (a background one), and a rewrite stops before a
// batch that would cross it. A server sets it from its min-free-disk. nil:
// no limit (the default).
func (c *Collector) SetRoom(r Room) {
	if r == nil {
		c.room.Store(nil)
		return
	}
	c.room.Store(&r)
}

// roomNow is the room left, or ok false when there is no limit.
func (c *Collector) roomNow() (int64, bool) {
	r := c.room.Load()
	if r == nil {
		return 0, false
	}
	return (*r)(c.st)
}

// fullFits says whether a full collection would fit the room: every sealed
// segment's rewrite (the checkpoint a full collection starts with makes
// them all eligible), counting as room the dead segments that checkpoint
// removes first. (After the checkpoint, fit checks again.) The error says
// why not.
func (c *Collector) fullFits() error {
	room, ok := c.roomNow()
	if !ok {
		return nil
	}
	need, dead := int64(0), int64(0)
	for _, seg := range c.st.Stats().Segments {
		switch {
		case seg.Active:
		case seg.LiveBodies > 0 || seg.Held > 0:
			need += seg.RewriteDiskBytes()
		default:
			dead += seg.Size
		}
	}
	if need > room+dead {
		return fmt.Errorf("%w: a full collection would write %d bytes; %d are free above it, and %d more once the dead segments are removed",
			ErrNoRoom, need, max(room, 0), dead)
	}
	return nil
}

// noteSkipLocked records a collection cut for space; c.mu is held.
func (c *Collector) noteSkipLocked(full bool, reason string) {
	c.stats.SkippedForSpace++
	c.stats.LastSkip = reason
	if full || !c.skipping.Swap(true) {
		c.opts.Logger.Warn("gc: collection limited by min-free-disk", "full", full, "reason", reason)
	} else {
		c.opts.Logger.Debug("gc: collection limited by min-free-disk", "full", full, "reason", reason)
	}
}

func (c *Collector) noteSkip(full bool, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.noteSkipLocked(full, reason)
}

// fit keeps of picks (in order) the segments whose rewrites fit the room,
// each taken only if it fits beside those before it; a full collection
// takes all or none. The reason is "" when nothing was left out.
func (c *Collector) fit(picks []wal.LSN, segs []storage.SegmentStat, full bool) (_ []wal.LSN, reason string) {
	room, ok := c.roomNow()
	if !ok || len(picks) == 0 {
		return picks, ""
	}
	need := make(map[wal.LSN]int64, len(segs))
	for _, seg := range segs {
		need[seg.First] = seg.RewriteDiskBytes()
	}
	var out []wal.LSN
	total, all := int64(0), int64(0)
	for _, first := range picks {
		all += need[first]
		if total+need[first] <= room {
			out = append(out, first)
			total += need[first]
		}
	}
	switch {
	case len(out) == len(picks):
		return picks, ""
	case full:
		return nil, fmt.Sprintf("full collection not started: it would write %d bytes and %d are free above min-free-disk", all, max(room, 0))
	case len(out) == 0:
		return nil, fmt.Sprintf("collection not started: its %d segments would write %d bytes and %d are free above min-free-disk", len(picks), all, max(room, 0))
	}
	return out, fmt.Sprintf("collection cut to %d of %d segments: all would write %d bytes and %d are free above min-free-disk", len(out), len(picks), all, max(room, 0))
}

// allow is the rewrite's check before each batch (RewriteSegmentWithin).
func (c *Collector) allow(n int64) error {
	if room, ok := c.roomNow(); ok && n > room {
		return fmt.Errorf("%w: the next batch would write %d bytes and %d are free above it", ErrNoRoom, n, max(room, 0))
	}
	return nil
}

// Start runs a collection in the background and returns at once; ErrBusy if
// one is running, ErrClosed after Close, ErrNoRoom (wrapped, with the
// figures) for a full collection that would write past the Room: then
// nothing starts. Its outcome is in Stats.
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
	if full {
		if err := c.fullFits(); err != nil {
			c.run.Unlock()
			c.noteSkipLocked(true, err.Error())
			return err
		}
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
	picks, skip := c.fit(pick(segs, policy), segs, full)
	if skip != "" {
		c.noteSkip(full, skip)
		if full {
			return rep, fmt.Errorf("%w: %s", ErrNoRoom, skip)
		}
	} else if !full {
		c.skipping.Store(false)
	}
	var stopped error
	for i, first := range picks {
		res, err := c.st.RewriteSegmentWithin(c.ctx, first, c.allow)
		rep.BodiesMoved += res.Moved
		rep.BytesMoved += res.MovedBytes
		if errors.Is(err, context.Canceled) {
			// Closing: what was moved is safe; the next checkpoint (Close
			// makes one) removes what was fully rewritten.
			return rep, nil
		}
		if errors.Is(err, ErrNoRoom) {
			// Others wrote meanwhile: stop before the reserve. What was
			// moved is safe; the segment stays for a later collection.
			stopped = fmt.Errorf("collection stopped after %d of %d segments: %w", i, len(picks), err)
			c.noteSkip(full, stopped.Error())
			break
		}
		if err != nil {
			return rep, fmt.Errorf("gc: rewrite segment %016x: %w", uint64(first), err)
		}
		rep.Rewritten++
	}
	if rep.Rewritten > 0 || full {
		// Removes the segments rewritten (even when stopped: they are
		// what gives the room back).
		if err := c.st.Checkpoint(); err != nil {
			return rep, err
		}
	}
	if stopped != nil && full {
		return rep, stopped
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
