package storage

// jobCache holds the latest state of recently written jobs, so that the
// commit path and lookups skip the index for them: a job added and consumed
// soon after (the common case) is never read back from Pebble, where a point
// lookup costs microseconds. Every write of a job goes through Store.write,
// which updates the cache, so an entry is always the job as the index holds
// it. Reads put jobs too where what they read is current: a queue head's
// refill (Store.QueueHead, under mu) and Store.Job (cacheRead: only if
// nothing could have written the job since). Entries are never modified in
// place. Eviction is first in, first out. Guarded by Store.mu.
type jobCache struct {
	m    map[string]*Job
	ring []string // ids in insertion order; "" for a free slot
	next int
}

func newJobCache(size int) *jobCache {
	if size <= 0 {
		return nil
	}
	return &jobCache{m: make(map[string]*Job, size), ring: make([]string, size)}
}

func (c *jobCache) get(id string) (*Job, bool) {
	if c == nil {
		return nil, false
	}
	j, ok := c.m[id]
	return j, ok
}

// put records j as the job's state. A job already cached keeps its place.
// One assignment both finds and writes the entry (the map's length says
// which it did): a lookup before it was a second probe of a map too large
// for the CPU's caches, for every job a GETJOB delivers or a refill reads.
func (c *jobCache) put(j *Job) {
	if c == nil {
		return
	}
	n := len(c.m)
	c.m[j.ID] = j
	if len(c.m) == n {
		return // was cached: keeps its place
	}
	// New: it takes the next ring slot, evicting the slot's job — unless
	// the slot is the id's own, left by a drop (the entry is the new one).
	if old := c.ring[c.next]; old != "" && old != j.ID {
		delete(c.m, old)
	}
	c.ring[c.next] = j.ID
	c.next = (c.next + 1) % len(c.ring)
}

// reset forgets every job.
func (c *jobCache) reset() {
	if c != nil {
		clear(c.m)
		clear(c.ring)
		c.next = 0
	}
}

// drop forgets a deleted job. Its ring slot stays until reused.
func (c *jobCache) drop(id string) {
	if c != nil {
		delete(c.m, id)
	}
}
