package queue

import (
	"testing"
)

// TestDeliveredThenAckedBacklogJobReadsPebbleNoPointGet: a job that waited
// in Pebble (its buffer flushed) is read once, by the queue head's refill (a
// scan), and then by no point Get nor delivery walk, whether consumed one
// by one (getack1: a Get per job before) or ten at a time (an iterator per
// GETJOB before): the refill leaves the jobs its scan read in the job
// cache, where the delivery and then the ack find them.
func TestDeliveredThenAckedBacklogJobReadsPebbleNoPointGet(t *testing.T) {
	for _, count := range []int{1, 10} {
		f := newFixture(t, 16)
		const n = 40
		ids := map[string]bool{}
		for range n {
			ids[f.add("q", "body", nil)] = true
		}
		if err := f.st.Checkpoint(); err != nil { // the backlog is Pebble's now
			t.Fatal(err)
		}
		f.restart() // and the job cache is empty
		before := f.st.Stats().IndexGets
		got := 0
		for got < n {
			ds := f.get(count, "q")
			if len(ds) == 0 {
				t.Fatalf("COUNT %d: %d of %d jobs delivered, then none", count, got, n)
			}
			var acks []string
			for _, d := range ds {
				if !ids[d.ID] {
					t.Fatalf("delivered %s, not one of the jobs added (or twice)", d.ID)
				}
				delete(ids, d.ID)
				if string(d.Body) != "body" {
					t.Fatalf("job %s delivered with body %q", d.ID, d.Body)
				}
				acks = append(acks, d.ID)
			}
			if k, err := f.b.Ack(acks); err != nil || k != len(acks) {
				t.Fatalf("ACKJOB of %d jobs: %d, %v", len(acks), k, err)
			}
			got += len(ds)
		}
		if gets := f.st.Stats().IndexGets - before; gets != 0 {
			t.Errorf("COUNT %d: %d jobs delivered and acked made %d Pebble point Gets (%.2f per job), want none",
				count, n, gets, float64(gets)/n)
		}
		if q := f.b.QueueLen("q"); q != 0 {
			t.Errorf("QLEN %d after every job was acked", q)
		}
		f.close()
	}
}
