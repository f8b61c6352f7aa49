package replication

import (
	"encoding/binary"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// The payloads of the one-queued-copy messages, in codec.go's style
// (versioned, bounded by the payload, ErrBadPayload on anything else):
//
//	WILLQUEUE, WORKING  version count { id }…   (encodeIDs)
//	QUEUED              version count { id bump }…   bump 0 none, 1 nacks, 2 additional deliveries
//	PAUSE               version state queue   state 0-3 (storage.PauseState), queue a string

func encodeQueued(jobs []queue.RemoteQueuedJob) []byte {
	b := make([]byte, 0, 2+len(jobs)*(storage.JobIDLen+1))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(len(jobs)))
	for _, q := range jobs {
		b = append(b, q.ID...)
		b = append(b, byte(q.Bump))
	}
	return b
}

func decodeQueued(p []byte) ([]queue.RemoteQueuedJob, error) {
	d := msgDecoder{b: p}
	d.version()
	n := d.count(storage.JobIDLen + 1)
	out := make([]queue.RemoteQueuedJob, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		id := d.id()
		bump := queue.Bump(d.byte())
		if d.err == nil && bump > queue.BumpDeliveries {
			d.fail("bad counter")
		}
		out = append(out, queue.RemoteQueuedJob{ID: id, Bump: bump})
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return out, nil
}

func encodePause(name string, p storage.PauseState) []byte {
	b := make([]byte, 0, 4+len(name))
	b = append(b, codecVersion, byte(p))
	return appendString(b, name)
}

func decodePause(p []byte) (string, storage.PauseState, error) {
	d := msgDecoder{b: p}
	d.version()
	state := storage.PauseState(d.byte())
	name := d.queueName()
	if d.err == nil && state > storage.PauseAll {
		d.fail("bad pause state")
	}
	if err := d.end(); err != nil {
		return "", 0, err
	}
	return name, state, nil
}
