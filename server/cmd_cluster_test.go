package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/diskque/diskque/replication"
	"github.com/redis/go-redis/v9"
)

// clusterDo runs a command and returns its reply or its error's text.
func clusterDo(t *testing.T, c *redis.Client, args ...any) (any, string) {
	t.Helper()
	v, err := c.Do(context.Background(), args...).Result()
	if err != nil {
		return nil, err.Error()
	}
	return v, ""
}

// TestClusterLoneNode: a server given no Cluster is a node alone — itself
// in CLUSTER NODES and HELLO, no reachable node, MEET refused — and every
// subcommand's bad arguments get Disque's replies (cluster.c).
func TestClusterLoneNode(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	c := newClientOn(t, addr)
	me := b.NodeID()
	// The port from the listener, not s.addrParts(): Serve records its
	// address in its own goroutine, which may not have run yet here.
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}

	if v, _ := clusterDo(t, c, "CLUSTER", "MYID"); v != me {
		t.Errorf("CLUSTER MYID = %v, want %s", v, me)
	}
	want := fmt.Sprintf("%s 127.0.0.1:%s myself 0 0 connected\n", me, port)
	if v, _ := clusterDo(t, c, "CLUSTER", "NODES"); v != want {
		t.Errorf("CLUSTER NODES = %q, want %q", v, want)
	}
	wantInfo := "cluster_state:ok\r\ncluster_known_nodes:1\r\ncluster_reachable_nodes:0\r\ncluster_size:1\r\n" +
		"cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n"
	if v, _ := clusterDo(t, c, "CLUSTER", "INFO"); v != wantInfo {
		t.Errorf("CLUSTER INFO = %q, want %q", v, wantInfo)
	}
	hello, _ := clusterDo(t, c, "HELLO")
	wantHello := fmt.Sprint([]any{int64(1), me, []any{me, "127.0.0.1", port, "1"}})
	if fmt.Sprint(hello) != wantHello {
		t.Errorf("HELLO = %v, want %v", hello, wantHello)
	}

	// LEAVING: +no, set, +yes (HELLO priority 100, flag in NODES), back.
	if v, _ := clusterDo(t, c, "CLUSTER", "LEAVING"); v != "no" {
		t.Errorf("CLUSTER LEAVING = %v, want no", v)
	}
	if v, e := clusterDo(t, c, "CLUSTER", "LEAVING", "YES"); v != "OK" {
		t.Errorf("CLUSTER LEAVING YES = %v %s", v, e)
	}
	if v, _ := clusterDo(t, c, "CLUSTER", "LEAVING"); v != "yes" {
		t.Errorf("CLUSTER LEAVING after yes = %v", v)
	}
	if v, _ := clusterDo(t, c, "CLUSTER", "NODES"); !strings.Contains(fmt.Sprint(v), " myself,leaving 0 0 connected") {
		t.Errorf("CLUSTER NODES while leaving = %q", v)
	}
	if hello, _ := clusterDo(t, c, "HELLO"); !strings.HasSuffix(fmt.Sprint(hello), " 100]]") {
		t.Errorf("HELLO while leaving = %v, want priority 100", hello)
	}
	clusterDo(t, c, "CLUSTER", "LEAVING", "no")

	// RESET flushes the jobs.
	if _, e := clusterDo(t, c, "ADDJOB", "q", "x", 0); e != "" {
		t.Fatal(e)
	}
	if v, e := clusterDo(t, c, "CLUSTER", "RESET", "soft"); v != "OK" {
		t.Errorf("CLUSTER RESET soft = %v %s", v, e)
	}
	if v, _ := clusterDo(t, c, "QLEN", "q"); v != int64(0) {
		t.Errorf("QLEN after CLUSTER RESET = %v, want 0", v)
	}
	if v, e := clusterDo(t, c, "CLUSTER", "SAVECONFIG"); v != "OK" {
		t.Errorf("CLUSTER SAVECONFIG = %v %s", v, e)
	}

	for _, tc := range []struct {
		args []any
		want string
	}{
		{[]any{"CLUSTER", "BOGUS"}, "ERR Wrong CLUSTER subcommand or number of arguments"},
		{[]any{"CLUSTER", "MYID", "x"}, "ERR Wrong CLUSTER subcommand or number of arguments"},
		{[]any{"CLUSTER", "MEET", "127.0.0.1"}, "ERR Wrong CLUSTER subcommand or number of arguments"},
		{[]any{"CLUSTER", "MEET", "127.0.0.1", "x"}, "ERR Invalid TCP port specified: x"},
		{[]any{"CLUSTER", "MEET", "not-an-ip", "7711"}, "ERR Invalid node address specified: not-an-ip:7711"},
		{[]any{"CLUSTER", "MEET", "127.0.0.1", "0"}, "ERR Invalid node address specified: 127.0.0.1:0"},
		{[]any{"CLUSTER", "MEET", "127.0.0.1", "70000"}, "ERR Invalid node address specified: 127.0.0.1:70000"},
		{[]any{"CLUSTER", "MEET", "127.0.0.1", "7711", "x"}, "ERR Invalid TCP bus port specified: x"},
		{[]any{"CLUSTER", "MEET", "127.0.0.1", "7711"}, "ERR CLUSTER MEET 127.0.0.1:7711 failed: this node has no cluster bus"},
		{[]any{"CLUSTER", "FORGET", "abc"}, "ERR Invalid node identifier"},
		{[]any{"CLUSTER", "FORGET", strings.Repeat("a", 40)}, "ERR Unknown node " + strings.Repeat("a", 40)},
		{[]any{"CLUSTER", "FORGET", me}, "ERR I tried hard but I can't forget myself..."},
		{[]any{"CLUSTER", "RESET", "medium"}, "ERR syntax error"},
		{[]any{"CLUSTER", "RESET", "hard", "x"}, "ERR Wrong CLUSTER subcommand or number of arguments"},
		{[]any{"CLUSTER", "LEAVING", "maybe"}, "ERR Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'"},
		{[]any{"CLUSTER"}, "ERR wrong number of arguments for 'cluster' command"},
	} {
		if _, e := clusterDo(t, c, tc.args...); e != tc.want {
			t.Errorf("%v = %q, want %q", tc.args, e, tc.want)
		}
	}
}

// TestInfoClusterSection: INFO has a Cluster section before CPU, and INFO
// cluster alone.
func TestInfoClusterSection(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	c := newClientOn(t, addr)
	all, _ := clusterDo(t, c, "INFO")
	text := fmt.Sprint(all)
	ci, cpu := strings.Index(text, "# Cluster\r\n"), strings.Index(text, "# CPU\r\n")
	if ci < 0 || cpu < ci {
		t.Fatalf("INFO: Cluster section at %d, CPU at %d:\n%s", ci, cpu, text)
	}
	only, _ := clusterDo(t, c, "INFO", "cluster")
	got := fmt.Sprint(only)
	for _, line := range []string{"cluster_enabled:0", "cluster_known_nodes:1", "cluster_reachable_nodes:0",
		"cluster_failed_nodes:0", "cluster_bus_messages_sent:0", "cluster_bus_bytes_received:0"} {
		if !strings.Contains(got, "\r\n"+line+"\r\n") {
			t.Errorf("INFO cluster lacks %q:\n%s", line, got)
		}
	}
	if strings.Contains(got, "# CPU") {
		t.Errorf("INFO cluster has other sections:\n%s", got)
	}
}

// memberOn runs a real Membership on a bus port of 127.0.0.1:0, with the
// given client address, closed at cleanup.
func memberOn(t *testing.T, id, clientAddr string) (*replication.Membership, *replication.PortMux) {
	t.Helper()
	mux, err := replication.ListenMux("127.0.0.1:0", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	m, err := replication.NewMembership(replication.MembershipConfig{
		ID: id, Dir: t.TempDir(), ClientAddr: clientAddr, Mux: mux, NodeTimeout: time.Second,
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		mux.Close()
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- mux.Serve() }()
	t.Cleanup(func() {
		m.Close()
		mux.Close()
		<-served
	})
	return m, mux
}

// TestClusterCommandsOnMembership: the cluster commands over the real
// Membership: MEET (with a bus port), NODES, INFO, HELLO, LEAVING, FORGET
// and RESET HARD (a new id) between a server's node and a second node.
func TestClusterCommandsOnMembership(t *testing.T) {
	s, addr := startServer(t)
	b := newBroker(t)
	s.SetBroker(b)
	me := b.NodeID()
	m, _ := memberOn(t, me, addr)
	other := strings.Repeat("ab", 20)
	_, otherMux := memberOn(t, other, "127.0.0.1:7799")
	s.SetCluster(m, nil)
	c := newClientOn(t, addr)

	busPort := fmt.Sprint(otherMux.Addr().Port)
	if v, e := clusterDo(t, c, "CLUSTER", "MEET", "127.0.0.1", "7799", busPort); v != "OK" {
		t.Fatalf("CLUSTER MEET = %v %s", v, e)
	}
	eventually(t, "the other node reachable", func() bool {
		v, _ := clusterDo(t, c, "CLUSTER", "INFO")
		return strings.Contains(fmt.Sprint(v), "cluster_reachable_nodes:1\r\n")
	})
	nodes, _ := clusterDo(t, c, "CLUSTER", "NODES")
	if !strings.Contains(fmt.Sprint(nodes), other+" 127.0.0.1:7799 noflags ") || !strings.Contains(fmt.Sprint(nodes), me+" ") {
		t.Errorf("CLUSTER NODES = %q", nodes)
	}
	eventually(t, "HELLO to give the other node priority 1", func() bool {
		v, _ := clusterDo(t, c, "HELLO")
		return strings.Contains(fmt.Sprint(v), "["+other+" 127.0.0.1 7799 1]")
	})
	if v, _ := clusterDo(t, c, "INFO", "cluster"); !strings.Contains(fmt.Sprint(v), "cluster_enabled:1\r\n") {
		t.Errorf("INFO cluster = %q", v)
	}

	clusterDo(t, c, "CLUSTER", "LEAVING", "yes")
	if !m.Leaving() {
		t.Errorf("CLUSTER LEAVING yes did not reach membership")
	}
	clusterDo(t, c, "CLUSTER", "LEAVING", "no")

	if v, e := clusterDo(t, c, "CLUSTER", "FORGET", other); v != "OK" {
		t.Fatalf("CLUSTER FORGET = %v %s", v, e)
	}
	if v, _ := clusterDo(t, c, "CLUSTER", "NODES"); strings.Contains(fmt.Sprint(v), other) {
		t.Errorf("CLUSTER NODES after FORGET = %q", v)
	}
	if v, e := clusterDo(t, c, "CLUSTER", "RESET", "HARD"); v != "OK" {
		t.Fatalf("CLUSTER RESET HARD = %v %s", v, e)
	}
	if v, _ := clusterDo(t, c, "CLUSTER", "MYID"); v == me || len(fmt.Sprint(v)) != 40 {
		t.Errorf("CLUSTER MYID after RESET HARD = %v, want a new id (was %s)", v, me)
	}
}
