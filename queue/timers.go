package queue

import (
	"errors"
	"time"

	"github.com/diskque/diskque/storage"
)

// Run drives the timers until Close: it fires due events (delayed jobs
// queued, unacked jobs requeued, expired jobs deleted) and slides the
// wheel's horizon forward from the on-disk schedule. Only Run reads the
// clock for timers; the wheel takes time as an argument.
func (b *Broker) Run() {
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

// Tick fires every event due at or before now and tops up the wheel from
// disk. Run calls it; tests call it with their own time.
func (b *Broker) Tick(now int64) error {
	b.mu.Lock()
	if err := b.checkOpenLocked(); err != nil {
		b.mu.Unlock()
		return err
	}
	if err := b.loadTimersLocked(now); err != nil {
		b.mu.Unlock()
		return err
	}
	if now-b.lastSweep >= queueIdleMillis {
		b.sweepQueuesLocked(now)
	}
	var due []storage.Event
	b.wheel.Advance(now, func(e storage.Event) { due = append(due, e) })
	pending, err := b.fireLocked(due, now)
	b.mu.Unlock()
	if err != nil {
		return err
	}
	return pending.Wait()
}

// fireLocked applies the due events as one store batch. Each event is
// checked against the job first: the job may have moved on since.
func (b *Broker) fireLocked(due []storage.Event, now int64) (storage.Pending, error) {
	if len(due) == 0 {
		return storage.Pending{}, nil
	}
	batch := b.st.NewBatch()
	var olds []*storage.Job
	planned := map[string]bool{}
	for _, e := range due {
		if planned[e.ID] {
			continue // one change per job per tick; the next tick sees the rest
		}
		j, err := b.st.Job(e.ID)
		if errors.Is(err, storage.ErrNotFound) {
			continue
		}
		if err != nil {
			return storage.Pending{}, wrapStore(err)
		}
		switch {
		case e.Kind == storage.EventTTL && j.Etime == e.Due:
			batch.Delete(j.ID)
		case e.Kind == storage.EventDelay && j.AwakeTime == e.Due && j.State == storage.StateActive:
			batch.Queue(j.ID, retryTime(now, j.Retry))
		case e.Kind == storage.EventRetry && j.QueueTime == e.Due && j.State == storage.StateActive:
			batch.Requeue(j.ID, retryTime(now, j.Retry))
		default:
			continue // stale: the job changed since the event was loaded
		}
		planned[e.ID] = true
		olds = append(olds, j)
	}
	if batch.Len() == 0 {
		return storage.Pending{}, nil
	}
	res, pending := b.st.Apply(batch)
	for i, r := range res {
		old := olds[i]
		if r.Err != nil {
			if errUnusable(r.Err) {
				return storage.Pending{}, wrapStore(r.Err)
			}
			b.opts.Logger.Warn("queue: timer event refused", "job", old.ID, "err", r.Err)
			continue
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
		}
	}
	return pending, nil
}

// loadTimersLocked slides the loader's cursor forward: every on-disk event
// due before now + Horizon goes into the wheel, unless that would put more
// than MaxTimers events in it — then the cursor stops early and the horizon
// is shorter until the wheel drains.
func (b *Broker) loadTimersLocked(now int64) error {
	horizon := now + b.opts.Horizon.Milliseconds()
	// Load when the cursor is within half a horizon of now.
	if b.cursor != (storage.Event{}) && b.cursor.Due >= now+b.opts.Horizon.Milliseconds()/2 {
		return nil
	}
	for room := b.opts.MaxTimers - b.wheel.Len(); room > 0; room = b.opts.MaxTimers - b.wheel.Len() {
		page := min(room, 4096)
		evs, err := b.st.DueEvents(horizon, b.cursor, page)
		if err != nil {
			return wrapStore(err)
		}
		for _, e := range evs {
			b.wheel.Add(e)
		}
		if len(evs) > 0 {
			b.cursor = evs[len(evs)-1]
		}
		if len(evs) < page {
			// Everything before the horizon is loaded: the cursor moves to
			// the horizon itself, so new events before it go to the wheel.
			b.cursor = storage.Event{Due: horizon - 1, Kind: 0xff, ID: "\xff"}
			return nil
		}
	}
	return nil
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
