package server

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/diskque/diskque/replication"
)

// figuresCluster is a node alone whose job protocol reports figures and
// the nodes that confirmed one job.
type figuresCluster struct {
	*loneNode
	job       string
	confirmed []string
}

func (f *figuresCluster) NodesConfirmed(id string) []string {
	if id == f.job {
		return f.confirmed
	}
	return nil
}

func (f *figuresCluster) JobsFigures() (JobsFigures, bool) {
	return JobsFigures{PendingRepl: 2, PendingAcks: 3, RTTAvgMillis: 4, RTTP99Millis: 250}, true
}

func (f *figuresCluster) Reachable() []replication.NodeInfo {
	return []replication.NodeInfo{{ID: strings.Repeat("b", 40)}}
}

// TestClusterFiguresInShowAndMetrics: SHOW's nodes-confirmed is the
// Cluster's (it was always empty), and /metrics has the cluster's figures.
func TestClusterFiguresInShowAndMetrics(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	c := newClientOn(t, addr)
	v, e := clusterDo(t, c, "ADDJOB", "q", "x", 0)
	if e != "" {
		t.Fatal(e)
	}
	id := fmt.Sprint(v)
	other := strings.Repeat("b", 40)
	fc := &figuresCluster{loneNode: &loneNode{id: b.NodeID(), leaving: new(atomic.Bool)}, job: id, confirmed: []string{b.NodeID(), other}}
	s.SetCluster(fc, nil)
	shown, e := clusterDo(t, c, "SHOW", id)
	if e != "" {
		t.Fatal(e)
	}
	arr := shown.([]any)
	var got []any
	for i := 0; i+1 < len(arr); i += 2 {
		if arr[i] == "nodes-confirmed" {
			got = arr[i+1].([]any)
		}
	}
	if len(got) != 2 || got[0] != b.NodeID() || got[1] != other {
		t.Fatalf("SHOW nodes-confirmed = %v, want [%s %s]", got, b.NodeID(), other)
	}

	hs := httptest.NewServer(s.MetricsHandler())
	defer hs.Close()
	resp, err := http.Get(hs.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	for _, want := range []string{
		"diskque_cluster_known_nodes 1", "diskque_cluster_reachable_nodes 1", "diskque_cluster_failed_nodes 0",
		"diskque_cluster_pending_repljobs 2", "diskque_cluster_pending_setacks 3",
		"diskque_cluster_repljob_rtt_avg_seconds 0.004", "diskque_cluster_repljob_rtt_p99_seconds 0.25",
		"diskque_cluster_bus_bytes_sent_total 0",
	} {
		if !strings.Contains(string(body), want+"\n") {
			t.Errorf("metrics lack %q", want)
		}
	}
}
