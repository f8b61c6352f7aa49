package server

import (
	"testing"
)

// TestGetJobWhileLeaving: on a node leaving the cluster a GETJOB returns
// the jobs queued there, and one that would block — with or without a
// TIMEOUT — answers Disque's -LEAVING at once; NOHANG still answers a
// null. Once the node stops leaving, a GETJOB blocks again (here, until its
// TIMEOUT).
func TestGetJobWhileLeaving(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	c := newClientOn(t, addr)
	const leaving = "LEAVING This node is leaving the cluster, please connect to a different one"
	if _, e := clusterDo(t, c, "ADDJOB", "q", "x", 0); e != "" {
		t.Fatal(e)
	}
	clusterDo(t, c, "CLUSTER", "LEAVING", "yes")
	if v, e := clusterDo(t, c, "GETJOB", "FROM", "q"); e != "" || len(v.([]any)) != 1 {
		t.Fatalf("GETJOB with a job queued while leaving = %v %s", v, e)
	}
	for _, args := range [][]any{{"GETJOB", "FROM", "q"}, {"GETJOB", "TIMEOUT", 5000, "FROM", "q"}} {
		if v, e := clusterDo(t, c, args...); e != leaving {
			t.Errorf("%v while leaving, nothing queued = %v %q, want -%s", args, v, e, leaving)
		}
	}
	if v, e := clusterDo(t, c, "GETJOB", "NOHANG", "FROM", "q"); e != "redis: nil" || v != nil {
		t.Errorf("GETJOB NOHANG while leaving = %v %q, want a null", v, e)
	}
	clusterDo(t, c, "CLUSTER", "LEAVING", "no")
	if v, e := clusterDo(t, c, "GETJOB", "TIMEOUT", 50, "FROM", "q"); e != "redis: nil" || v != nil {
		t.Errorf("GETJOB TIMEOUT 50 after leaving no = %v %q, want a null after blocking", v, e)
	}
}
