package queue

import (
	"slices"

	"github.com/diskque/diskque/storage"
)

// QueueStat is one queue's QSTAT (SPEC.md).
type QueueStat struct {
	Name string
	Len  int64 // queued jobs
	// Age is the seconds since the broker first saw the queue; Idle the
	// seconds since its last activity (a job queued or delivered).
	Age, Idle int64
	Blocked   int // clients blocked on the queue in GETJOB
	// JobsIn and JobsOut count jobs queued (by ADDJOB or a delay ending)
	// and delivered since the broker first saw the queue.
	JobsIn, JobsOut int64
	Pause           storage.PauseState
	// ImportFrom are the nodes that sent jobs of the queue here in the
	// last 5 s (federation's sources), sorted; ImportRate the jobs per
	// second imported lately (federation.go).
	ImportFrom []string
	ImportRate int64
}

// QueueStat returns the queue's statistics, or false when there is no such
// queue: unknown to the broker, with no queued jobs and no pause state. A
// queue the broker meets here first (jobs restored from disk) starts its age
// now.
func (b *Broker) QueueStat(name string) (QueueStat, bool) {
	now := b.nowMillis()
	b.mu.Lock()
	defer b.mu.Unlock()
	n, pause := b.st.QueueLen(name), b.st.PauseState(name)
	q := b.queues[name]
	if q == nil {
		if n == 0 && pause == storage.PauseNone {
			return QueueStat{}, false
		}
		q = b.queueLocked(name, now)
	}
	blocked := 0
	for _, w := range q.waiters {
		if !w.done {
			blocked++
		}
	}
	var from []string
	var rate int64
	if q.fed != nil {
		from, rate = q.fed.validSources(now), q.fed.importRate(now)
	}
	return QueueStat{
		Name:    name,
		Len:     n,
		Age:     max(now-q.ctime, 0) / 1000,
		Idle:    max(now-q.atime, 0) / 1000,
		Blocked: blocked,
		JobsIn:  q.jobsIn,
		JobsOut: q.jobsOut,
		Pause:   pause,

		ImportFrom: from,
		ImportRate: rate,
	}, true
}

// ScanQueues returns up to limit queue names strictly greater than after, in
// name order: the queues the broker knows (QSTAT answers for them) and those
// the store holds queued jobs or a pause state for. Passing the last name
// returned goes on; fewer than limit names ends the scan. A queue present for
// the whole scan is returned exactly once.
func (b *Broker) ScanQueues(after string, limit int) []string {
	if limit <= 0 {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	var names []string
	for name := range b.queues {
		if name > after {
			names = append(names, name)
		}
	}
	// The first limit names of the union are among the first limit of
	// each side.
	for _, qi := range b.st.Queues(after, limit) {
		names = append(names, qi.Name)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	return names[:min(len(names), limit)]
}

// ScanJobs returns up to limit jobs in id order with ids strictly greater
// than after ("" starts at the first) (JSCAN). Passing the last id returned
// goes on; fewer than limit jobs ends the scan. A job present for the whole
// scan is returned exactly once.
func (b *Broker) ScanJobs(after string, limit int) ([]*storage.Job, error) {
	jobs, err := b.st.ScanJobs(after, limit)
	return jobs, wrapStore(err)
}
