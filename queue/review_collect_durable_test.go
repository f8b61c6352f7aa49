package queue

import (
	"testing"
	"time"
)

// TestCollectSearchWaitsForTheDeleteItFound: a dummy ack's search (SETACK
// with mayhave 0) that finds the job gone, deleted by a DELJOB whose fsync
// still runs, writes nothing and answers GOTACK "not known", on which the
// searcher drops its dummy. Under appendfsync always that answer must
// wait for the delete it found (as RemoteSetAckKnown's does): sent at
// once, a crash before the fsync brings the copy back while the searcher
// has dropped the dummy that stood for it. The DELJOB is held at the
// gate, and the run's durable must be too.
func TestCollectSearchWaitsForTheDeleteItFound(t *testing.T) {
	b, st, gate := gatedBroker(t, &ackCluster{})
	id := heldByOthers(t, b, true, false)
	gate.armed.Store(true)
	delDone := make(chan error, 1)
	go func() {
		_, err := b.DelJob([]string{id})
		delDone <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for _, err := st.Job(id); err == nil; _, err = st.Job(id) {
		if time.Now().After(deadline) {
			t.Fatal("the DELJOB was never applied")
		}
		time.Sleep(time.Millisecond)
	}
	res, durable, err := b.RemoteCollect([]CollectOp{{ID: id, Search: true}})
	if err != nil {
		t.Fatal(err)
	}
	if res[0].Known || res[0].Job != nil {
		t.Fatalf("the search found %+v, want nothing", res[0])
	}
	answered := make(chan error, 1)
	go func() { answered <- durable() }()
	select {
	case err := <-answered:
		t.Fatalf("the search's GOTACK could go (%v) before the delete it found was durable", err)
	case <-delDone:
		t.Fatal("the gate did not hold the DELJOB's fsync")
	case <-time.After(300 * time.Millisecond):
	}
	gate.armed.Store(false)
	close(gate.release)
	for _, ch := range []chan error{delDone, answered} {
		if err := <-ch; err != nil {
			t.Fatal(err)
		}
	}
}
