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
//
// The map is keyed by the id's bytes (idKey), held in its slot: a consumed
// job is looked up in it four or five times, each a probe of a map of tens
// of thousands of entries, and a string key's comparison followed its
// pointer to the id, a second cache miss per probe. An id that is not
// JobIDLen long (none is) is never cached.
type jobCache struct {
	m    map[idKey]*Job
	ring []string // ids in insertion order; "" for a free slot
	next int
}

func newJobCache(size int) *jobCache {
	if size <= 0 {
		return nil
	}
	return &jobCache{m: make(map[idKey]*Job, size), ring: make([]string, size)}
}

// cacheKey returns id as the cache's key; false if id cannot be cached.
func cacheKey(id string) (k idKey, ok bool) {
	if len(id) != JobIDLen {
		return k, false
	}
	copy(k[:], id)
	return k, true
}

func (c *jobCache) get(id string) (*Job, bool) {
	if c == nil {
		return nil, false
	}
	k, ok := cacheKey(id)
	if !ok {
		return nil, false
	}
	j, ok := c.m[k]
	return j, ok
}

// put records j as the job's state. A job already cached keeps its place.
func (c *jobCache) put(j *Job) {
	if c == nil {
		return
	}
	k, ok := cacheKey(j.ID)
	if !ok {
		return
	}
	if _, ok := c.m[k]; ok {
		c.m[k] = j
		return
	}
	if old := c.ring[c.next]; old != "" {
		ko, _ := cacheKey(old) // every id in the ring was cacheable
		delete(c.m, ko)
	}
	c.ring[c.next] = j.ID
	c.next = (c.next + 1) % len(c.ring)
	c.m[k] = j
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
	if c == nil {
		return
	}
	if k, ok := cacheKey(id); ok {
		delete(c.m, k)
	}
}
