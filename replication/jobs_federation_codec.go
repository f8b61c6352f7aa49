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
//	     or   2 incarnation count { id queue ctime etime delay retry repl nacks adddeliveries nodes body first }…
//
// A YOURJOBS job is REPLJOB's with the counters that travel with it (so
// GETJOB WITHCOUNTERS agrees wherever the job is delivered). Version 2
// (yourJobsVersionFirst) also says, per job (first: 1, else 0), that the
// giver minted it and never sent it anywhere before, with the asker's
// store incarnation it learned from the asker's GOTJOB
// (queue/federation_first.go): the asker may then store it without its
// index lookup. A giver sends version 2 only to an asker whose empty
// GOTJOB told it the incarnation, which only a build that reads version
// 2 sends (jobs_federation_first.go); an older build refuses it.

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

// yourJobsVersionFirst is the version of a YOURJOBS that marks jobs first.
const yourJobsVersionFirst = 2

// encodeYourJobs is YOURJOBS's payload: version 1, or version 2 when a job
// is marked first (every First of one message is the same incarnation:
// the asker's).
func encodeYourJobs(jobs []queue.Replica) []byte {
	size := 2 + binary.MaxVarintLen64
	inc := uint64(0)
	for _, r := range jobs {
		size += 91 + len(r.Job.Queue) + 41*len(r.Job.Nodes) + len(r.Body)
		if r.First != 0 {
			inc = r.First
		}
	}
	b := make([]byte, 0, size)
	if inc == 0 {
		b = append(b, codecVersion)
	} else {
		b = append(b, yourJobsVersionFirst)
		b = binary.AppendUvarint(b, inc)
	}
	b = binary.AppendUvarint(b, uint64(len(jobs)))
	for _, r := range jobs {
		j := r.Job
		b = appendJobHead(b, j)
		b = binary.AppendUvarint(b, uint64(j.Nacks))
		b = binary.AppendUvarint(b, uint64(j.AdditionalDeliveries))
		b = appendNodes(b, j.Nodes)
		b = appendBytes(b, r.Body)
		if inc != 0 {
			first := byte(0)
			if r.First == inc {
				first = 1
			}
			b = append(b, first)
		}
	}
	return b
}

// minYourJobBytes is the fewest bytes one job takes in a YOURJOBS.
const minYourJobBytes = storage.JobIDLen + 12

func decodeYourJobs(p []byte) ([]queue.Replica, error) {
	var d msgDecoder
	inc := uint64(0)
	if len(p) > 0 && p[0] == yourJobsVersionFirst {
		d = msgDecoder{b: p[1:]}
		if inc = d.uvarint(); d.err == nil && inc == 0 {
			d.fail("YOURJOBS of incarnation 0")
		}
	} else {
		d = msgDecoder{b: p}
		d.version()
	}
	n := d.count(minYourJobBytes)
	// As decodeReplJobs: one array of jobs, the queue name and node ids
	// decoded once for the message (a NEEDJOBS answer is one queue's jobs,
	// with the same two holders), each body copied once. The asker stores
	// every job it imports: this was 8 allocations a job.
	slab := make([]storage.Job, n)
	jobs := make([]queue.Replica, 0, n)
	var seen internTable
	for i := 0; i < n && d.err == nil; i++ {
		j := &slab[i]
		j.ID, j.State = d.id(), storage.StateActive
		j.Queue = d.queueNameIn(&seen)
		j.Ctime = d.uvarint()
		j.Etime = d.varint()
		j.Delay = d.u32()
		j.Retry = d.u32()
		j.Repl = uint16(d.bounded(65535))
		j.Nacks = d.u32()
		j.AdditionalDeliveries = d.u32()
		j.Nodes = d.nodesIn(&seen)
		r := queue.Replica{Job: j, Body: d.bytes()}
		if inc != 0 {
			switch d.byte() {
			case 0:
			case 1:
				r.First = inc
			default:
				d.fail("bad first flag")
			}
		}
		jobs = append(jobs, r)
	}
	if err := d.end(); err != nil {
		return nil, err
	}
	return jobs, nil
}
