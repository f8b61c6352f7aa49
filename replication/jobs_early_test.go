package replication

import (
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/queue"
)

// TestSyncCopiesGoBeforeTheOriginsWrite: a synchronous ADDJOB's REPLJOBs
// do not wait for the origin's own durable write (appendfsync always):
// the replicas hold their copies while the origin's fsync is held, and
// the ADDJOB is answered only once it is released.
func TestSyncCopiesGoBeforeTheOriginsWrite(t *testing.T) {
	c := newTestCluster(t, 3, -1)
	origin := c.nodes[0]
	g := &syncGate{}
	c.close(origin)
	origin.fs = gatedFS{vfs.Default, g}
	c.open(origin)
	eventually(t, "the origin's links", func() bool {
		return origin.tr.Connected(c.nodes[1].id) && origin.tr.Connected(c.nodes[2].id)
	})
	g.close()
	defer g.open()
	done := make(chan queue.AddResult, 1)
	go func() { done <- addJob(t, origin, queue.AddRequest{Replicate: 3, Timeout: 20000}) }()
	eventually(t, "both copies while the origin's fsync is held", func() bool {
		return c.nodes[1].st.Stats().Jobs == 1 && c.nodes[2].st.Stats().Jobs == 1
	})
	select {
	case r := <-done:
		t.Fatalf("ADDJOB answered before the origin's write was durable: %+v", r)
	default:
	}
	g.open()
	r := <-done
	if r.Err != nil {
		t.Fatal(r.Err)
	}
	if got := origin.state(t, r.ID); got != "queued" {
		t.Fatalf("origin: %q", got)
	}
}
