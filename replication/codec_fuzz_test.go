package replication

import (
	"slices"
	"testing"

	"github.com/diskque/diskque/queue"
	"github.com/diskque/diskque/storage"
)

// FuzzDecodePayloads: no payload panics a decoder or makes it allocate
// beyond its size, and what decodes encodes to a payload that decodes to
// the same (varints may be spelled longer than needed, so not always to
// the same bytes).
func FuzzDecodePayloads(f *testing.F) {
	id := storage.NewJobID("0123456789abcdef0123456789abcdef01234567", 3600, 60)
	job := &storage.Job{ID: id, Queue: "q", Ctime: 5, Etime: 6, Delay: 1, Retry: 2, Repl: 3, AwakeTime: 7,
		Nodes: []string{"0123456789abcdef0123456789abcdef01234567"}}
	f.Add(encodeReplJobs(false, []replJob{{Job: job, Body: []byte("body")}}))
	f.Add(encodeIDs([]string{id, id}))
	f.Add(encodeGotAcks([]string{id}, []bool{true}))
	f.Add(encodeSetAcks([]string{id}, []int{3}))
	f.Add([]byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f})
	f.Add(encodeQueued([]queue.RemoteQueuedJob{{ID: id, Bump: queue.BumpNacks}, {ID: id}}))
	f.Add(encodePause("q", storage.PauseAll))
	f.Add([]byte{1, 4, 1, 'q'})
	f.Add(encodeNeedJobs("q", 5))
	moved := *job
	moved.Nacks, moved.AdditionalDeliveries = 2, 3
	f.Add(encodeYourJobs([]queue.Replica{{Job: &moved, Body: []byte("body")}}))
	f.Add(encodeQueueLen(7, "q"))
	f.Add(encodeQueueLenAnswer(7, 42))
	f.Fuzz(func(t *testing.T, p []byte) {
		if noReply, jobs, err := decodeReplJobs(p); err == nil {
			enc := encodeReplJobs(noReply, jobs)
			nr2, jobs2, err := decodeReplJobs(enc)
			if err != nil || nr2 != noReply || string(encodeReplJobs(nr2, jobs2)) != string(enc) {
				t.Fatalf("REPLJOB round trip: %x → %x: %v", p, enc, err)
			}
		}
		if ids, err := decodeIDs(p); err == nil {
			if again, err := decodeIDs(encodeIDs(ids)); err != nil || len(again) != len(ids) {
				t.Fatalf("id list round trip: %x: %v", p, err)
			}
		}
		if ids, mayhave, err := decodeSetAcks(p); err == nil {
			if again, m2, err := decodeSetAcks(encodeSetAcks(ids, mayhave)); err != nil || len(again) != len(ids) || len(m2) != len(ids) {
				t.Fatalf("SETACK round trip: %x: %v", p, err)
			}
		}
		if ids, known, err := decodeGotAcks(p); err == nil {
			if again, _, err := decodeGotAcks(encodeGotAcks(ids, known)); err != nil || len(again) != len(ids) {
				t.Fatalf("GOTACK round trip: %x: %v", p, err)
			}
		}
		if qs, err := decodeQueued(p); err == nil {
			if again, err := decodeQueued(encodeQueued(qs)); err != nil || !slices.Equal(again, qs) {
				t.Fatalf("QUEUED round trip: %x: %v", p, err)
			}
		}
		if name, state, err := decodePause(p); err == nil {
			if n2, s2, err := decodePause(encodePause(name, state)); err != nil || n2 != name || s2 != state || state > storage.PauseAll {
				t.Fatalf("PAUSE round trip: %x: %v", p, err)
			}
		}
		if name, count, err := decodeNeedJobs(p); err == nil {
			if n2, c2, err := decodeNeedJobs(encodeNeedJobs(name, count)); err != nil || n2 != name || c2 != count || count < 1 {
				t.Fatalf("NEEDJOBS round trip: %x: %v", p, err)
			}
		}
		if id, name, err := decodeQueueLen(p); err == nil {
			if id2, n2, err := decodeQueueLen(encodeQueueLen(id, name)); err != nil || id2 != id || n2 != name {
				t.Fatalf("QUEUELEN round trip: %x: %v", p, err)
			}
		}
		if id, n, err := decodeQueueLenAnswer(p); err == nil {
			if id2, n2, err := decodeQueueLenAnswer(encodeQueueLenAnswer(id, n)); err != nil || id2 != id || n2 != n || n < 0 {
				t.Fatalf("QUEUELENANSWER round trip: %x: %v", p, err)
			}
		}
		if jobs, err := decodeYourJobs(p); err == nil {
			enc := encodeYourJobs(jobs)
			jobs2, err := decodeYourJobs(enc)
			if err != nil || string(encodeYourJobs(jobs2)) != string(enc) {
				t.Fatalf("YOURJOBS round trip: %x → %x: %v", p, enc, err)
			}
		}
	})
}
