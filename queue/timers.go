package queue

import (
	"errors"
	"runtime"
	"time"

	"github.com/diskque/diskque/storage"
)

// Run drives the timers until Close: it fires due events (delayed jobs
// queued, unacked jobs requeued, expired jobs deleted) and slides the
// wheel's horizon forward from the on-disk schedule. Only Run reads the
// clock for timers; the wheel takes time as an argument. Run on a closed
// broker, or a second Run, returns at once.
func (b *Broker) Run() {
	b.mu.Lock()
	if b.closed || b.running {
		b.mu.Unlock()
		return
	}
	b.running = true
	b.mu.Unlock()
	defer close(b.done)
	const idle = 100 * time.Millisecond
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-b.stop:
			return
		case <-t.C:
		case <-b.wake:
		}
		now := b.nowMillis()
		if err := b.Tick(now); err != nil && !errors.Is(err, ErrClosed) {
			b.opts.Logger.Error("queue: timers", "err", err)
		}
		wait := idle
		b.mu.Lock()
		if next, ok := b.wheel.Next(); ok {
			wait = min(wait, time.Duration(max(next-now, 1))*time.Millisecond)
		}
		b.mu.Unlock()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(wait)
	}
}

// fireChunk bounds the events one lock hold fires. Each costs an index read
// and write in Store.Apply: 30-60 µs on a store of 200k jobs, up to several
// hundred on a busy store of a million, so a chunk holds Broker.mu for
// milliseconds; between chunks every other command gets its turn. Measured
// with BenchmarkMassExpiry (200k jobs, 2 CPUs, fixed chunks): the longest
// GETJOB grows with the chunk (about 20, 40, 70, 150 and 220 ms for 32, 256,
// 512, 1024 and 2048 events) while the time to expire them all stays within
// noise from 128 to 2048 (7-10 s).
const fireChunk = 256

// Since the cost of an event varies tenfold with the store's state, Tick
// also sizes each chunk from the previous one's hold of Broker.mu, aiming
// at chunkHold, between minChunk events and fireChunk (the hard bound).
const (
	chunkHold = 5 * time.Millisecond
	minChunk  = 16
)

// loadChunk bounds the events one lock hold of Tick loads from disk (a
// schedule scan and a wheel insertion each, 1-20 µs): without it, the first
// Tick of a mass expiry would load MaxTimers events in one hold.
const loadChunk = 1024

// loaderState is where loadTimersLocked stopped.
type loaderState uint8

const (
	loaderDone   loaderState = iota // at the horizon, or near enough
	loaderPaused                    // out of budget, with room left
	loaderFull                      // at MaxTimers, its cursor short of the horizon
)

// Tick fires every event due at or before now and tops up the wheel from
// disk. Run calls it; tests call it with their own time.
//
// It fires in chunks of at most fireChunk events (fewer when events are
// slow: see nextChunk), each under its own hold of Broker.mu and its own
// store batch, whose durability it waits for with the lock released, before
// the next chunk. So a million jobs expiring in the same millisecond delay
// other commands by one chunk at a time, not by the whole expiry; and the
// AOF never has more than one chunk of timer records in flight. Events not
// fired yet stay in the wheel (AdvanceLimit), so every change made between
// chunks updates them as usual (syncTimersLocked), and the loader refills
// the room each chunk frees. It
// returns ErrClosed if Close happens between chunks; the rest fire after
// a restart, from the on-disk schedule.
func (b *Broker) Tick(now int64) error {
	if b.st.Failing() {
		// The store failed: no timer can fire until it is reopened (by a
		// new broker), and retrying every tick would only fill the log.
		return nil
	}
	limit := b.fireChunk
	// Read outside Broker.mu, as every call to the cluster.
	clustered := b.Clustered()
	// Blocked GETJOBs keep asking other nodes for jobs (federation.go).
	b.mu.Lock()
	var need []NeedJobsRequest
	if !b.closed {
		need = b.needJobsForWaitersLocked(now)
	}
	b.mu.Unlock()
	b.sendNeedJobs(need)
	for {
		fired, more, hold, pending, notes, err := b.tickChunk(now, limit, clustered)
		if err != nil {
			return err
		}
		if err := pending.Wait(); err != nil {
			return err
		}
		// WILLQUEUE and QUEUED for this chunk, with no lock held.
		notes.send(b.cluster)
		if b.testChunkHook != nil {
			b.testChunkHook(fired)
		}
		if !more {
			return nil
		}
		limit = nextChunk(limit, fired, hold, b.fireChunk)
		// Let a client woken by the Unlock take the lock before the next
		// chunk does: otherwise it may wait through two holds (sync.Mutex
		// lets the unlocker barge back in until a waiter starves for 1 ms).
		runtime.Gosched()
	}
}

// nextChunk sizes the next chunk so that it holds the lock about chunkHold,
// from the last one's hold for its fired events: at most double the last
// size, and within [minChunk, most].
func nextChunk(last, fired int, hold time.Duration, most int) int {
	if fired == 0 || hold <= 0 {
		return last
	}
	n := int(int64(chunkHold) * int64(fired) / int64(hold))
	return max(min(n, 2*last, most), min(minChunk, most))
}

// tickChunk is one chunk of Tick under Broker.mu: it loads the schedule,
// fires up to limit due events and reports how many it fired, how long it
// held the lock, whether more are due by now (in the wheel, or on disk
// after a loader that stopped at MaxTimers) and what to tell the other
// holders of the jobs it requeued (clustered: other nodes are known).
func (b *Broker) tickChunk(now int64, limit int, clustered bool) (fired int, more bool, hold time.Duration, pending storage.Pending, notes notices, err error) {
	b.mu.Lock()
	start := time.Now() // for sizing chunks only; timers take now
	defer func() {
		hold = time.Since(start)
		b.mu.Unlock()
	}()
	if err := b.checkOpenLocked(); err != nil {
		return 0, false, 0, storage.Pending{}, notes, err
	}
	b.inCluster = clustered
	if err := b.loadTimersLocked(now, loadChunk); err != nil {
		return 0, false, 0, storage.Pending{}, notes, err
	}
	if now-b.lastSweep >= queueIdleMillis {
		b.sweepQueuesLocked(now)
	}
	due := b.due[:0]
	more = b.wheel.AdvanceLimit(now, limit, func(e storage.Event) { due = append(due, e) })
	switch b.loader {
	case loaderPaused:
		// Go on loading up to the horizon, a chunk at a time, so that the
		// wheel knows the near future before Run sleeps on wheel.Next.
		more = true
	case loaderFull:
		// Due events may be on disk after the cursor: the next chunk
		// loads them into the room this one frees. If this one frees
		// none (nothing in the wheel is due), the room is taken by events
		// past the cursor, which a full wheel's cursor moved back before
		// (syncTimersLocked): they make way, or the next chunk would find
		// the wheel as full and Tick would loop for good.
		if !more && b.cursor.Due <= now {
			more = len(due) > 0 || b.makeRoomLocked(loadChunk, now) > 0
		}
	}
	pending, err = b.fireLocked(due, now, &notes)
	if !more {
		// A job changed by this chunk may have an event already due (its
		// TTL after its delay ran out, in the same millisecond): it is
		// back in the wheel, overdue, for the next chunk.
		next, ok := b.wheel.Next()
		more = ok && next <= now
	}
	clear(due)
	b.due = due
	return len(due), more, 0, pending, notes, err
}

// fireLocked applies the due events as one store batch.
//
// An event fires only while it is in the wheel, and every change to a job
// replaces the job's events there (syncTimersLocked) under the same lock,
// so an event that fires is the job's current one. A TTL event therefore
// deletes its job without reading it first: its Etime never changes, and
// the store resolves the job itself (Result.Old) — which saves one index
// read per expired job, half the cost of a mass expiry. Delay and retry
// events are still checked against the job, which is cheap next to a mass
// expiry and keeps a state the wheel does not know about from being
// overridden.
//
// In a cluster, a WILLQUEUE event (eventWillQueue) of a job still active and
// due at that retry, with holders elsewhere, adds the job to notes'
// WILLQUEUE; a requeue of such a job adds it to notes' QUEUED, and bumps
// additional-deliveries here when the store does not (a copy never
// delivered here), as it asks the other holders to.
func (b *Broker) fireLocked(due []storage.Event, now int64, notes *notices) (storage.Pending, error) {
	if len(due) == 0 {
		return storage.Pending{}, nil
	}
	batch := b.st.NewBatch()
	var skipped []storage.Event
	planned := make(map[string]bool, len(due))
	evs := due[:0] // the events planned, in batch order
	// extra: batch ops that are a second op of the event before them (the
	// counter bump of a clustered requeue); they have no event of their own.
	var extra map[int]bool
	for _, e := range due {
		if e.Kind == eventWillQueue {
			b.willQueueLocked(e, notes)
			continue
		}
		if planned[e.ID] {
			// One change per job per batch: the change puts the job's
			// current events back in the wheel, this one among them if it
			// still applies; if the change fails, this one goes back as it
			// is (below), or it would wait on disk until a restart.
			skipped = append(skipped, e)
			continue
		}
		if e.Kind == storage.EventTTL {
			batch.Delete(e.ID)
		} else {
			j, err := b.st.Job(e.ID)
			if errors.Is(err, storage.ErrNotFound) {
				continue
			}
			if err != nil {
				return storage.Pending{}, wrapStore(err)
			}
			switch {
			case e.Kind == storage.EventDelay && j.AwakeTime == e.Due && j.State == storage.StateActive:
				batch.Queue(j.ID, retryTime(now, j.Retry))
			case e.Kind == storage.EventRetry && j.QueueTime == e.Due && j.State == storage.StateActive:
				qtime := retryTime(now, j.Retry)
				batch.Requeue(j.ID, qtime)
				if b.holdersElsewhere(j) && j.Deliveries == 0 {
					// Requeue counts a delivery only of a copy delivered
					// here; every holder's requeue counts one (Disque).
					batch.Postpone(j.ID, qtime, 0, 1)
					if extra == nil {
						extra = map[int]bool{}
					}
					extra[batch.Len()-1] = true
				}
			default:
				continue // stale: the job changed since the event was loaded
			}
		}
		planned[e.ID] = true
		evs = append(evs, e)
	}
	if batch.Len() == 0 {
		return storage.Pending{}, nil
	}
	res, pending := b.st.Apply(batch)
	i := -1 // the event of the op
	for k, r := range res {
		if extra[k] {
			continue // taken with the op before it
		}
		i++
		if extra[k+1] && r.Err == nil && res[k+1].Err == nil {
			// The job as both ops left it, before anything below: the
			// requeue may hand it to a blocked GETJOB (queuedLocked),
			// which delivers it and sets its new retry event; syncing
			// the bump's result after that would put back a queued
			// job's events, none, and the delivered copy would never be
			// requeued again.
			r.Job = res[k+1].Job
		}
		if r.Err != nil {
			if errUnusable(r.Err) {
				return storage.Pending{}, wrapStore(r.Err)
			}
			if !errors.Is(r.Err, storage.ErrNotFound) {
				b.opts.Logger.Warn("queue: timer event refused", "job", evs[i].ID, "err", r.Err)
			}
			for _, e := range skipped {
				if e.ID == evs[i].ID {
					b.wheel.Add(e)
				}
			}
			continue
		}
		old := r.Old
		if e := evs[i]; e.Kind == storage.EventTTL && old.Etime != e.Due {
			// Cannot happen (see above); say so loudly if it ever does.
			b.opts.Logger.Error("queue: expired a job by a stale ttl event", "job", old.ID, "etime", old.Etime, "due", e.Due)
		}
		b.syncTimersLocked(old.ID, r.Job)
		switch {
		case r.Job == nil: // expired
			b.stats.JobsExpired++
			if old.State == storage.StateQueued {
				b.unqueuedLocked(old)
			}
		case old.State != storage.StateQueued && r.Job.State == storage.StateQueued:
			if old.Deliveries > 0 {
				b.stats.JobsRequeued++
			}
			q := b.queueLocked(r.Job.Queue, now)
			q.jobsIn++
			b.queuedLocked(r.Job, now)
			if evs[i].Kind == storage.EventRetry && b.holdersElsewhere(r.Job) {
				notes.queued = append(notes.queued, QueuedJob{Job: r.Job, Bump: BumpDeliveries})
			}
		}
	}
	return pending, nil
}

// loadTimersLocked slides the loader's cursor forward: every on-disk event
// due before now + Horizon goes into the wheel, unless that would put more
// than MaxTimers events in it — then the cursor stops early and the horizon
// is shorter until the wheel drains. It loads at most budget events per call
// (so at most that much work per lock hold); b.loader says where it stopped.
func (b *Broker) loadTimersLocked(now int64, budget int) error {
	horizon := now + b.opts.Horizon.Milliseconds()
	// Load when the cursor is within half a horizon of now.
	if b.cursor != (storage.Event{}) && b.cursor.Due >= now+b.opts.Horizon.Milliseconds()/2 {
		b.loader = loaderDone
		return nil
	}
	for room := b.opts.MaxTimers - b.wheel.Len(); ; room = b.opts.MaxTimers - b.wheel.Len() {
		switch {
		case room <= 0:
			// The cursor stays at the last event loaded until fired
			// events make room.
			b.loader = loaderFull
			return nil
		case budget <= 0:
			b.loader = loaderPaused
			return nil
		}
		page := min(room, budget, 4096)
		budget -= page
		evs, err := b.st.DueEvents(horizon, b.cursor, page)
		if err != nil {
			return wrapStore(err)
		}
		for _, e := range evs {
			b.addEventLocked(e)
		}
		if len(evs) > 0 {
			b.cursor = evs[len(evs)-1]
		}
		if len(evs) < page {
			// Everything before the horizon is loaded: the cursor moves to
			// the horizon itself, so new events before it go to the wheel.
			b.cursor = storage.Event{Due: horizon - 1, Kind: 0xff, ID: "\xff"}
			b.loader = loaderDone
			return nil
		}
	}
}

// makeRoomLocked takes up to n events past the loader's cursor out of the
// wheel and returns how many it took. They are all on disk, and the loader
// puts them back when its cursor reaches them, after the earlier events it
// must load first. A WILLQUEUE companion goes with its retry event, and the
// loader makes it again in a cluster (addEventLocked: for a retry event the
// wheel does not hold). So the one retry event that stays is a clustered
// one whose companion is gone because it fired (due by now): the loader
// would send a second WILLQUEUE for the same retry. A companion-less retry
// whose companion is not due was made without one (no other node held the
// job): the loader's companion for it announces the requeue to nobody.
// A retry that stays is due within WillQueueAdvance (nothing held is due
// when this runs), so Ticks that find only such events scan the wheel for
// at most that long.
func (b *Broker) makeRoomLocked(n int, now int64) int {
	var out []storage.Event
	b.wheel.Events(func(e storage.Event) bool {
		switch {
		case e.Kind == eventWillQueue || cmpEvent(e, b.cursor) <= 0:
		case e.Kind == storage.EventRetry && b.inCluster && willQueueCompanion(e).Due <= now &&
			!b.wheel.Holds(e.ID, eventWillQueue): // its companion fired
		default:
			out = append(out, e)
		}
		return len(out) < n
	})
	for _, e := range out {
		b.wheel.Remove(e.ID, e.Kind)
		if e.Kind == storage.EventRetry {
			b.wheel.Remove(e.ID, eventWillQueue)
		}
	}
	return len(out)
}

// queueIdleMillis is how long an empty queue nobody waits on keeps its
// in-memory state (QSTAT's counters) before the sweep forgets it.
const queueIdleMillis = 60_000

// sweepQueuesLocked forgets the in-memory state of queues that are empty
// (in memory and on disk), unpaused, unwatched and idle: otherwise every
// queue name a client ever mentioned (GETJOB FROM anything) would stay in
// memory for good.
func (b *Broker) sweepQueuesLocked(now int64) {
	b.lastSweep = now
	for name, q := range b.queues {
		if len(q.waiters) == 0 && q.head.Len() == 0 && now-q.atime >= queueIdleMillis &&
			b.st.QueueLen(name) == 0 && b.st.PauseState(name) == storage.PauseNone {
			delete(b.queues, name)
		}
	}
}
