package server

import (
	"time"

	"github.com/diskque/diskque/replication"
)

// GLOBALQLEN queue (a Disque command from after 1.0: its suite's unit 13;
// COMPATIBILITY.md): the queue's length here plus its length on every other
// node that is reachable and linked, each asked over the bus
// (replication/jobs_qlen.go). A node that has not answered within
// GlobalQueueLenTimeout is left out of the sum, so the reply is always an
// integer, and on a node alone it is QLEN. The command waits for the
// answers on its own goroutine, holding no lock.

func init() {
	register(&command{name: "globalqlen", arity: 2, run: cmdGlobalQLen})
}

// GlobalQueueLenTimeout is how long GLOBALQLEN waits for the other nodes'
// answers: far above a bus round trip (milliseconds, even loaded), and
// short enough for a client that asks while a node has just died but is
// not yet flagged (its link is usually down at once, and then it is not
// asked at all).
const GlobalQueueLenTimeout = time.Second

// QueueLenAsker is an optional interface of the Cluster given to
// SetCluster (the daemon's has it): the queue's length summed over the
// other nodes that answer within timeout.
type QueueLenAsker interface {
	PeersQueueLen(queue string, timeout time.Duration) replication.QueueLenResult
}

func cmdGlobalQLen(s *Server, c *call) {
	name := string(c.args[1])
	n := c.broker.QueueLen(name)
	if r := s.cluster.Load(); r != nil {
		if a, ok := r.c.(QueueLenAsker); ok {
			n += a.PeersQueueLen(name, GlobalQueueLenTimeout).Sum
		}
	}
	c.conn.WriteInt64(n)
}
