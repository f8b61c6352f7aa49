package replication

import (
	"net"
	"strconv"
	"testing"
	"time"
)

// TestMembershipRejoinQueuesAddressesGivenWhileOneRuns: a rejoin asked
// for while another runs (stuck on a node that accepts and never answers)
// still joins its addresses once the first is done. They were dropped: a
// SetNodeTimeout's rejoin of every peer, asked during the start's rejoin,
// never happened.
func TestMembershipRejoinQueuesAddressesGivenWhileOneRuns(t *testing.T) {
	hole, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()
	go func() { // accepts, never answers: a join to it waits its timeout
		for {
			c, err := hole.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	a := startNode(t, "", "", nodeOpts{timeout: time.Second})
	b := startNode(t, "", "", nodeOpts{timeout: time.Second})
	a.m.startRejoin([]string{hole.Addr().String()})
	a.m.mu.Lock()
	running := a.m.joining
	a.m.mu.Unlock()
	if !running {
		t.Fatal("the first rejoin is not running")
	}
	a.m.startRejoin([]string{net.JoinHostPort("127.0.0.1", strconv.Itoa(b.busPort()))})
	waitFor(t, 10*time.Second, "a to join b, asked while the first rejoin ran", func() bool {
		_, ok := a.node(b.id)
		return ok
	})
}
