package replication

import (
	"encoding/binary"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// The federation payloads, in codec.go's style (versioned, bounded by the
// payload, ErrBadPayload on anything else):
//
//	NEEDJOBS  version count queue   count 1..maxNeedJobsCount, queue a string
//	YOURJOBS  version count { id queue ctime etime delay retry repl nacks adddeliveries nodes body }…
//
// A YOURJOBS job is REPLJOB's with the counters that travel with it (so
// GETJOB WITHCOUNTERS agrees wherever the job is delivered).

// maxNeedJobsCount bounds a NEEDJOBS's count on the wire (the broker gives
// at most 100 anyway).
const maxNeedJobsCount = 1 << 16

func encodeNeedJobs(name string, count int) []byte {
	b := make([]byte, 0, 8+len(name))
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(count))
	return appendString(b, name)
}

func decodeNeedJobs(p []byte) (string, int, error) {
	d := msgDecoder{b: p}
	d.version()
	count := int(d.bounded(maxNeedJobsCount))
	name := d.queueName()
	if d.err == nil && count == 0 {
		d.fail("zero count")
	}
	if err := d.end(); err != nil {
		return "", 0, err
	}
	return name, count, nil
}

func encodeYourJobs(jobs []queue.Replica) []byte {
	size := 2
	for _, r := range jobs {
		size += 90 + len(r.Job.Queue) + 41*len(r.Job.Nodes) + len(r.Body)
	}
	b := make([]byte, 0, size)
	b = append(b, codecVersion)
	b = binary.AppendUvarint(b, uint64(len(jobs)))
	for _, r := range jobs {
		j := r.Job
		b = appendJobHead(b, j)
		b = binary.AppendUvarint(b, uint64(j.Nacks))
		b = binary.AppendUvarint(b, uint64(j.AdditionalDeliveries))
		b = appendNodes(b, j.Nodes)
		b = appendString(b, string(r.Body))
	}
	return b
}

// minYourJobBytes is the fewest bytes one job takes in a YOURJOBS.
const minYourJobBytes = storage.JobIDLen + 12

func decodeYourJobs(p []byte) ([]queue.Replica, error) {
	d := msgDecoder{b: p}
	d.version()
	n := d.count(minYourJobBytes)
	jobs := make([]queue.Replica, 0, n)
	for i := 0; i < n && d.err == nil; i++ {
		j := &storage.Job{ID: d.id(), State: storage.StateActive}
		j.Queue = d.queueName()
		j.Ctime = d.uvarint()
		j.Etime = d.varint()
		j.Delay = d.u32()
		j.Retry = d.u32()
		j.Repl = uint16(d.bounded(65535))
		j.Nacks = d.u32()
		j.AdditionalDeliveries = d.u32()
		j.Nodes = d.nodes()
		body := d.str()
		jobs = append(jobs, queue.Replica{Job: j, Body: []byte(body)})
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return jobs, nil
}
