package main

import (
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/gc"
	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/replication"
	"github.com/diskque/diskque/server"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

// node is the part of the daemon that a disk failure can take down and a
// reopen brings back: the store, the broker over it and the segment
// collector. The listener and the connections outlive it.
//
// When the AOF fails (a write or fsync error: ENOSPC, EIO) the store fails
// for good — after a failed fsync the file's state is unknown — and refuses
// every write with -IOERR, while reads keep being served from it. The node
// then probes the data directory every RetryInterval; once a probe file can
// be written and fsynced again it swaps the store out for a fresh one opened
// on the same directory: clients get -LOADING for the moment of the swap
// (the old store closes only once every command that was using it has
// finished), the new store replays exactly what is durable, and writes
// resume. Nothing that was acknowledged is lost: an acknowledged write was
// written (and, under appendfsync always, fsynced) before its reply.
//
// A store opened on a nearly full disk is read-only (storage.ErrNoSpace):
// it serves reads and answers writes with -NOSPACE, and the node reopens it
// once the disk has room for a writable store (storage.RoomToWrite), as it
// reopens a failed one — so a restart on a full disk starts, instead of
// dying in Pebble's Open.
//
// A corrupt index (storage.ErrIndexCorrupt) is not reopened: the same damage
// would fail it again. The node logs once that the index must be rebuilt
// from the AOF and serves what it can read until it is stopped.
type node struct {
	dir    string
	sopts  storage.Options
	gcOpts gc.Options
	srv    *server.Server
	log    *slog.Logger
	// RetryInterval is how often a failed node probes its disk.
	retry time.Duration

	// bus is the cluster side (nil in tests of the node alone): each
	// broker gets its job protocol from it.
	bus *clusterBus

	mu        sync.Mutex // guards the four below against a concurrent close
	st        *storage.Store
	broker    *queue.Broker
	collector *gc.Collector
	jobs      *replication.Jobs // the broker's job protocol; nil without bus

	stop     chan struct{}
	stopOnce sync.Once
	started  atomic.Bool // run was started: close waits for done
	done     chan struct{}
	reopens  int // guarded by mu; for tests and logs
	// rebuild: the next open rebuilds the index (--rebuild-index, or it
	// was found corrupt). Guarded by mu.
	rebuild bool
	// holdBroker: open does not hand its broker to the server; publish
	// does (the first open of a daemon, whose cluster bus starts after
	// it: until then the broker's job protocol cannot replicate, and an
	// ADDJOB would get -NOREPL). Guarded by mu.
	holdBroker bool
	// rewrite is what a store that failed an fsync kept of its unsynced
	// writes, for the next open to write again (storage.Options.Rewrite).
	// Guarded by mu.
	rewrite *wal.Unsynced
	// syncMu serialises switches of the fsync policy (setSync, and open's
	// catching up with one made while it opened), so that the last
	// CONFIG SET appendfsync is the one the store runs with.
	syncMu sync.Mutex
}

func newNode(dir string, sopts storage.Options, gcOpts gc.Options, srv *server.Server, log *slog.Logger) *node {
	return &node{dir: dir, sopts: sopts, gcOpts: gcOpts, srv: srv, log: log, retry: time.Second,
		stop: make(chan struct{}), done: make(chan struct{})}
}

// open opens the store, the broker and the collector and hands them to the
// server, which then serves (until then it answers -LOADING).
func (n *node) open() error {
	n.mu.Lock()
	sopts := n.sopts // under mu: setSync changes its Sync
	sopts.Rewrite = n.rewrite
	if n.rebuild {
		sopts.Rebuild = storage.RebuildAlways
	}
	n.mu.Unlock()
	st, err := storage.Open(n.dir, sopts)
	if err != nil {
		return fmt.Errorf("open %s: %w", n.dir, err)
	}
	// --rebuild-index, or a corrupt index, is for one open: later reopens
	// (after a disk failure) find the rebuilt index.
	n.mu.Lock()
	n.rebuild = false
	n.mu.Unlock()
	ri := st.RecoveryInfo()
	if ri.Rebuilt {
		n.log.Warn("the index was rebuilt from the append-only file", "records", ri.Records, "took", ri.Duration.String())
	}
	if sopts.Rewrite != nil {
		n.log.Info("wrote again what the failed store had written since its last successful fsync",
			"bytes", len(sopts.Rewrite.Data), "from_lsn", sopts.Rewrite.Synced)
		n.mu.Lock()
		n.rewrite = nil
		n.mu.Unlock()
	}
	stats := st.Stats()
	n.log.Info("storage ready", "node", st.NodeID(), "jobs", stats.Jobs, "queued", stats.Queued,
		"replayed_records", ri.Records, "recovery", ri.Duration.String())
	qopts := queue.Options{Store: st, Logger: n.log}
	var jobs *replication.Jobs
	if n.bus != nil {
		if jobs, err = n.bus.newJobs(st.NodeID(), n.dir); err != nil {
			st.Close()
			return err
		}
		qopts.Cluster = jobs
	}
	broker, err := queue.New(qopts)
	if err != nil {
		st.Close()
		return err
	}
	// A read-only store (a full disk) has nothing to collect: its
	// collector would only fail every interval.
	var collector *gc.Collector
	if !st.ReadOnly() {
		if collector, err = gc.New(st, n.gcOpts); err != nil {
			broker.Close()
			st.Close()
			return err
		}
	}
	go broker.Run()
	n.mu.Lock()
	n.st, n.broker, n.collector, n.jobs = st, broker, collector, jobs
	n.mu.Unlock()
	if jobs != nil {
		n.bus.attachJobs(jobs, broker)
	}
	n.catchUpSync(st, sopts.Sync)
	n.srv.SetCollector(collector)
	n.mu.Lock()
	hold := n.holdBroker
	n.mu.Unlock()
	if !hold {
		n.srv.SetBroker(broker)
	}
	return nil
}

// publish hands the broker that open held back (holdBroker) to the server,
// which then serves commands that need it; later opens hand theirs at once.
func (n *node) publish() {
	n.mu.Lock()
	n.holdBroker = false
	broker := n.broker
	n.mu.Unlock()
	if broker != nil {
		n.srv.SetBroker(broker)
	}
}

// setNodeID gives the store a new node id (CLUSTER RESET HARD, after the
// flush).
func (n *node) setNodeID(id string) error {
	n.mu.Lock()
	broker := n.broker
	n.mu.Unlock()
	if broker == nil {
		return errors.New("LOADING the node is reopening its store")
	}
	return broker.SetNodeID(id)
}

// nodeID is the store's node id (the data directory's); "" before open.
func (n *node) nodeID() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.st == nil {
		return ""
	}
	return n.st.NodeID()
}

// setSync switches the fsync policy (CONFIG SET appendfsync) of the open
// store at once, and of every store opened later (a reopen after a disk
// failure). A failed fsync of the switch fails the store, which the node
// then reopens as after any failure; the policy is switched all the same.
func (n *node) setSync(p wal.SyncPolicy) {
	n.syncMu.Lock()
	defer n.syncMu.Unlock()
	n.mu.Lock()
	n.sopts.Sync = p
	st := n.st
	n.mu.Unlock()
	if st == nil {
		return // the next open takes n.sopts
	}
	n.switchSync(st, p)
}

// catchUpSync applies a switch of the fsync policy made while st was
// opening with opened: setSync saw no store then.
func (n *node) catchUpSync(st *storage.Store, opened wal.SyncPolicy) {
	n.syncMu.Lock()
	defer n.syncMu.Unlock()
	n.mu.Lock()
	p := n.sopts.Sync
	n.mu.Unlock()
	if p == opened {
		return
	}
	n.switchSync(st, p)
}

// switchSync switches st to p; n.syncMu is held.
func (n *node) switchSync(st *storage.Store, p wal.SyncPolicy) {
	if err := st.SetSync(p); err != nil && !errors.Is(err, storage.ErrClosed) {
		n.log.Warn("appendfsync switched, but the fsync of what was written before failed", "appendfsync", p.String(), "err", err)
	}
}

// run watches the store until stop: when it fails, it waits for the disk
// to work again and reopens the node. It returns once stop is closed.
func (n *node) run() {
	n.started.Store(true)
	defer close(n.done)
	for {
		n.mu.Lock()
		st := n.st
		n.mu.Unlock()
		select {
		case <-n.stop:
			return
		case <-st.Failed():
		}
		ready := n.probeDisk
		switch err := st.Err(); {
		case errors.Is(err, storage.ErrIndexCorrupt):
			// A reopen as it is would meet the same damage: the index is
			// rebuilt from the AOF (clients get -LOADING meanwhile).
			n.log.Error(indexCorruptAdvice, "err", err, "dir", n.dir)
			n.mu.Lock()
			n.rebuild = true
			n.mu.Unlock()
			ready = func() error { return nil }
		case errors.Is(err, storage.ErrNoSpace):
			n.log.Warn("the disk is nearly full: reads are served and writes get -NOSPACE until there is room; then the store reopens by itself",
				"err", err, "dir", n.dir, "check_every", n.retry)
			ready = n.roomToWrite
		default:
			n.log.Error("the store failed: writes are refused (reads go on) and the store is reopened once the disk accepts writes again",
				"err", err, "dir", n.dir, "probe_every", n.retry)
		}
		if !n.recover(ready) {
			return
		}
	}
}

// recover waits until ready says the disk can take the store's writes,
// checking every retry interval, then reopens the node; false if stop came
// first.
func (n *node) recover(ready func() error) bool {
	t := time.NewTicker(n.retry)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return false
		case <-t.C:
		}
		if err := ready(); err != nil {
			n.log.Debug("the disk cannot take writes yet", "err", err)
			continue
		}
		n.log.Info("the disk accepts writes again: reopening the store")
		if err := n.closeParts(); err != nil {
			n.log.Warn("closing the failed store", "err", err)
		}
		if err := n.open(); err != nil {
			n.log.Error("reopening the store failed; retrying", "err", err)
			continue
		}
		n.mu.Lock()
		n.reopens++
		n.mu.Unlock()
		n.log.Info("ready to accept commands again")
		return true
	}
}

// indexCorruptAdvice is what the log says once the store found its index
// corrupt.
const indexCorruptAdvice = "the index is corrupt: it is set aside (index.broken-<time>) and rebuilt from the append-only file " +
	"now; clients get -LOADING until it is done"

func (n *node) probeDisk() error { return probeDisk(n.sopts.FS, n.dir) }

// errNoRoom: the disk has less free space than a writable store needs.
var errNoRoom = errors.New("not enough free disk space for a writable store yet")

func (n *node) roomToWrite() error {
	n.mu.Lock()
	sopts := n.sopts
	n.mu.Unlock()
	if storage.RoomToWrite(n.dir, sopts) {
		return nil
	}
	return errNoRoom
}

// probeDisk writes, fsyncs and removes a small file in dir: the smallest
// proof that the AOF could be written again.
func probeDisk(fs vfs.FS, dir string) error {
	path := fs.PathJoin(dir, "probe.tmp")
	f, err := fs.Create(path, vfs.WriteCategoryUnspecified)
	if err != nil {
		return err
	}
	_, err = f.Write(make([]byte, 64<<10))
	if err == nil {
		err = f.Sync()
	}
	err = errors.Join(err, f.Close(), fs.Remove(path))
	return err
}

// closeParts takes the broker away from the server (new commands get
// -LOADING), closes it (which wakes the GETJOBs blocked on it), waits until
// every command that got it has finished, and only then closes the
// collector and the store: a command still running would otherwise read a
// closed store. A failed store skips its checkpoint: the next open replays.
func (n *node) closeParts() error {
	n.mu.Lock()
	st, broker, collector, jobs := n.st, n.broker, n.collector, n.jobs
	n.st, n.broker, n.collector, n.jobs = nil, nil, nil, nil
	n.mu.Unlock()
	if st == nil {
		return nil
	}
	drain := n.srv.SetBroker(nil)
	if jobs != nil {
		// Before the broker: nothing the bus delivers reaches it after,
		// and waiting replications end (their ADDJOBs get -NOREPL).
		n.bus.detachJobs(jobs)
		jobs.Close()
	}
	broker.Close()
	drain()
	if collector != nil {
		collector.Close()
	}
	err := st.Close()
	if u := st.Unsynced(); u != nil {
		// An fsync failed: the OS may have dropped what the store wrote
		// since the last good one, though it still serves it from its
		// cache. The next open writes it again from the store's own copy.
		n.mu.Lock()
		n.rewrite = u
		n.mu.Unlock()
	}
	return err
}

// close stops watching and closes the node. The server is closed first
// (no command runs then); close may be called more than once.
func (n *node) close() error {
	n.stopOnce.Do(func() { close(n.stop) })
	if n.started.Load() {
		<-n.done
	}
	return n.closeParts()
}
