package storage

import "errors"

// QueueHead is QueueRange for a broker refilling a queue's head, the
// entries it delivers from next: it also leaves the jobs it read from
// Pebble in the job cache — each queue key's value is the job as its j/
// key holds it (keys.go), read under mu, so the entry is exact — so that
// their delivery (QueuedJobs, then Batch.DeliverQueued's resolve) and then
// their ack find them there instead of making a Pebble point Get each
// (or an iterator per GETJOB COUNT n): the scan that found their
// positions already paid for reading them. Jobs the write buffer holds are
// read there cheaply and are not cached (as for a new job, commit.go
// write), nor are jobs cached already (the cache has their state), nor
// values of an index written before queue keys carried their job. At most
// half the cache is filled per call, so that one refill does not evict
// every job delivered and not yet acked.
func (s *Store) QueueHead(queue string, after QueuePos, limit int) ([]QueuePos, error) {
	if limit <= 0 {
		return nil, nil
	}
	prefix := queuePrefix(queue)
	lower := prefix
	if after != (QueuePos{}) {
		lower = append(queueKey(queue, after.Ctime, after.ID), 0)
	}
	var out []QueuePos
	var derr error
	room := 0
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed { // Close sets it under mu before it closes Pebble
		return nil, ErrClosed
	}
	if s.cache != nil {
		room = len(s.cache.ring) / 2
	}
	names := s.names.Load()
	var read []QueuePos // from Pebble, for the buffer's span (read_spans.go)
	err := s.scanMergedFrom(lower, prefixEnd(prefix), false, func(k, v []byte, fromPebble bool) bool {
		var p QueuePos
		if p.Ctime, p.ID, derr = parseQueueKey(k); derr != nil {
			return false
		}
		out = append(out, p)
		if fromPebble {
			read = append(read, p)
		}
		if fromPebble && room > 0 && len(v) > 0 {
			if _, ok := s.cache.get(p.ID); !ok {
				var j *Job
				if j, derr = decodeJob(p.ID, v, names); derr != nil {
					return false
				}
				s.cache.put(j)
				room--
			}
		}
		return len(out) < limit
	})
	if err = errors.Join(derr, s.indexErr(err)); err != nil {
		return nil, err
	}
	var last QueuePos
	if len(out) > 0 {
		last = out[len(out)-1]
	}
	s.buf.noteRead(prefix, after, read, last, len(out) < limit)
	return out, nil
}
