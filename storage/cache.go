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
func (c *jobCache) put(j *Job) {
	if c == nil {
		return
	}
	if _, ok := c.m[j.ID]; ok {
		c.m[j.ID] = j
		return
	}
	if old := c.ring[c.next]; old != "" {
		delete(c.m, old)
	}
	c.ring[c.next] = j.ID
	c.next = (c.next + 1) % len(c.ring)
	c.m[j.ID] = j
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
