package main

import (
	"log/slog"
	"testing"
)

// TestKnownNodesBuildsNoNodeList: the job protocol counts the nodes for
// every ADDJOB without REPLICATE and every ACKJOB (Jobs.KnownNodes); over the
// daemon's bus it reads membership's count (clusterBus.NodeCount) instead of
// building the node list (Membership.Nodes: a slice and a NodeInfo per node,
// on a lone node too).
func TestKnownNodesBuildsNoNodeList(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	cfg := defaultConfig()
	cfg.ClusterBusPort = 0
	bus, err := listenBus(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	const id = "0123456789abcdef0123456789abcdef01234567"
	dir := t.TempDir()
	if err := bus.start(cfg, id, dir, freePort(t)); err != nil {
		bus.close()
		t.Fatal(err)
	}
	defer func() {
		if err := bus.close(); err != nil {
			t.Error(err)
		}
	}()
	jobs, err := bus.newJobs(id, dir)
	if err != nil {
		t.Fatal(err)
	}
	if n, want := jobs.KnownNodes(), len(bus.Nodes()); n != want || n != 1 {
		t.Fatalf("KnownNodes = %d, Nodes lists %d, want 1 (a lone node)", n, want)
	}
	if allocs := testing.AllocsPerRun(100, func() { jobs.KnownNodes() }); allocs != 0 {
		t.Fatalf("KnownNodes allocates %v times per call, want 0 (no node list built)", allocs)
	}
}
