package server

import (
	"strings"
	"testing"
)

// TestQueueRandomlyAndGlobalQLenOnALoneNode: a node alone queues an ADDJOB
// … QUEUE-RANDOMLY itself (it is the only node there is), and its
// GLOBALQLEN is its QLEN; the option is case-insensitive, and pipelined
// with other ADDJOBs; GLOBALQLEN takes exactly one queue.
func TestQueueRandomlyAndGlobalQLenOnALoneNode(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	got := roundTrip(t, addr,
		"GLOBALQLEN q\r\nADDJOB q a 0 QUEUE-RANDOMLY\r\nADDJOB q b 0\r\naddjob q c 0 queue-randomly ASYNC\r\n"+
			"ADDJOB q d 0 QUEUE-RANDOMLY 1\r\nQLEN q\r\nglobalqlen q\r\nGLOBALQLEN other\r\nGLOBALQLEN\r\nGLOBALQLEN a b\r\n", 10)
	for _, i := range []int{1, 2, 3} {
		if !strings.HasPrefix(got[i], "+D-") {
			t.Fatalf("reply %d: %q, want an id (all: %q)", i, got[i], got)
		}
	}
	want := []string{":0", "", "", "", "-ERR syntax error", ":3", ":3", ":0"}
	for i, w := range want {
		if w != "" && got[i] != w {
			t.Fatalf("reply %d: %q, want %q (all: %q)", i, got[i], w, got)
		}
	}
	for _, i := range []int{8, 9} {
		if !strings.HasPrefix(got[i], "-ERR wrong number of arguments") {
			t.Fatalf("reply %d: %q, want the arity error", i, got[i])
		}
	}
}
