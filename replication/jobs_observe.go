package replication

import (
	"slices"
	"sync/atomic"
)

// What INFO cluster, the Prometheus endpoint and SHOW read of the job
// protocol beyond its counters (JobsStats): the REPLJOB round trip's p99,
// and the nodes that confirmed a job.

// rttBuckets are the upper bounds (ms) of the round-trip histogram: two
// per power of two from 1 ms to 64 s, then one for anything longer.
var rttBuckets = func() []int64 {
	b := []int64{0, 1, 2}
	for v := int64(4); v <= 65536; v *= 2 {
		b = append(b, v-v/4, v) // 1.5, 2, 3, 4, 6, 8, …
	}
	return b
}()

// rttHistogram counts REPLJOB→GOTJOB round trips per bucket: fixed
// memory, lock-free. Once it holds rttDecayAt samples every bucket is
// halved, so the p99 follows the recent traffic rather than all time.
type rttHistogram struct {
	counts [40]atomic.Int64
	total  atomic.Int64
}

const rttDecayAt = 1 << 16

func (h *rttHistogram) observe(ms int64) {
	i, _ := slices.BinarySearch(rttBuckets, max(ms, 0))
	i = min(i, len(rttBuckets)) // past the last bound: the overflow bucket
	h.counts[i].Add(1)
	if h.total.Add(1) >= rttDecayAt {
		// Racing observers may both halve: the figures stay a rough,
		// bounded recent window, which is all a p99 needs.
		var t int64
		for k := range h.counts {
			c := h.counts[k].Load() / 2
			h.counts[k].Store(c)
			t += c
		}
		h.total.Store(t)
	}
}

// quantile returns the upper bound (ms) of the bucket holding quantile q
// of the samples, 0 with none; past the last bound, twice it.
func (h *rttHistogram) quantile(q float64) int64 {
	var counts [len(rttHistogram{}.counts)]int64
	var total int64
	for k := range counts {
		counts[k] = h.counts[k].Load()
		total += counts[k]
	}
	if total == 0 {
		return 0
	}
	rank := int64(q*float64(total) + 0.5)
	rank = max(rank, 1)
	var seen int64
	for k, c := range counts {
		seen += c
		if seen >= rank {
			if k < len(rttBuckets) {
				return rttBuckets[k]
			}
			break
		}
	}
	return 2 * rttBuckets[len(rttBuckets)-1]
}

// RoundTripP99Millis is the 99th percentile of recent REPLJOB→GOTJOB
// round trips (ms, the upper bound of its histogram bucket; 0 before the
// first answer).
func (j *Jobs) RoundTripP99Millis() int64 { return j.rtt.quantile(0.99) }

// NodesConfirmed is SHOW's nodes-confirmed, as Disque's job.c keeps it:
// while the job's synchronous replication runs, this node (unless the
// replication is external) and those that answered GOTJOB; while its ack
// is collected here (a first SETACK round sent), this node and those that
// answered GOTACK; otherwise none. This node first, then the others in id order.
func (j *Jobs) NodesConfirmed(id string) []string {
	self := j.self()
	var others []string
	mine := false
	j.mu.Lock()
	if p := j.repl[id]; p != nil {
		mine = !p.external
		others = append(others, p.confirmed...)
	} else if gc := j.acks.get(id); gc != nil && gc.retries > 0 {
		// A holder's collection waiting for its first round has none
		// yet: Disque's nodes_confirmed is made by tryJobGC's first run.
		mine = true
		for n := range gc.confirmed {
			others = append(others, n)
		}
	}
	j.mu.Unlock()
	slices.Sort(others)
	if mine {
		others = append([]string{self}, others...)
	}
	return others
}
