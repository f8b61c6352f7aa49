package main

// Multi-process clusters: real diskque-server processes on 127.0.0.1 that
// MEET, gossip, are killed with SIGKILL and restarted on the same data
// directories (shared/CLUSTER.md "Identity, ports, membership").

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/diskque/diskque/replication"
)

// clusterInfoField is one field of CLUSTER INFO.
func clusterInfoField(t *testing.T, c *redis.Client, name string) string {
	t.Helper()
	for _, line := range strings.Split(doStr(t, c, "CLUSTER", "INFO"), "\r\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			return v
		}
	}
	return ""
}

// nodeLine is one line of CLUSTER NODES, split.
type nodeLine struct {
	id, addr, flags, link string
}

func clusterNodes(t *testing.T, c *redis.Client) map[string]nodeLine {
	t.Helper()
	out := map[string]nodeLine{}
	for _, line := range strings.Split(strings.TrimRight(doStr(t, c, "CLUSTER", "NODES"), "\n"), "\n") {
		f := strings.Fields(line)
		if len(f) != 6 {
			t.Fatalf("CLUSTER NODES line %q: want 6 fields", line)
		}
		out[f[0]] = nodeLine{id: f[0], addr: f[1], flags: f[2], link: f[5]}
	}
	return out
}

func hasFlag(flags, flag string) bool {
	for _, f := range strings.Split(flags, ",") {
		if f == flag {
			return true
		}
	}
	return false
}

// busPort is the node's bus port, from INFO cluster.
func busPortOf(t *testing.T, c *redis.Client) string {
	t.Helper()
	p := info(t, c, "cluster")["cluster_bus_port"]
	if n, err := strconv.Atoi(p); err != nil || n <= 0 {
		t.Fatalf("INFO cluster_bus_port = %q", p)
	}
	return p
}

// waitReachable waits until every client's CLUSTER INFO counts want
// reachable nodes.
func waitReachable(t *testing.T, timeout time.Duration, want int, clients ...*redis.Client) {
	t.Helper()
	w := strconv.Itoa(want)
	waitUntil(t, timeout, "cluster_reachable_nodes:"+w+" on every node", func() bool {
		for _, c := range clients {
			if clusterInfoField(t, c, "cluster_reachable_nodes") != w {
				return false
			}
		}
		return true
	})
}

// TestClusterProcessesMeetFailAndRejoin: three processes MEET in a chain
// and all see each other (CLUSTER INFO, HELLO priority 1, CLUSTER NODES);
// one killed with SIGKILL is flagged fail by the others within about twice
// cluster-node-timeout; restarted on its directory, on new ports and with no
// MEET, it rejoins and the flag clears.
func TestClusterProcessesMeetFailAndRejoin(t *testing.T) {
	const nodeTimeout = 2000 * time.Millisecond
	flags := []string{"--cluster-node-timeout", strconv.Itoa(int(nodeTimeout.Milliseconds()))}
	var nodes []*daemon
	var clients []*redis.Client
	var ids []string
	for range 3 {
		s := startServer(t, flags...)
		c := s.client(t)
		nodes, clients, ids = append(nodes, s), append(clients, c), append(ids, myID(t, c))
	}
	// A chain: 0 meets 1, 1 meets 2; gossip tells 0 and 2 of each other.
	for i := range 2 {
		next := nodes[i+1]
		if got := doStr(t, clients[i], "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(next.port), busPortOf(t, clients[i+1])); got != "OK" {
			t.Fatalf("CLUSTER MEET = %q", got)
		}
	}
	waitReachable(t, 20*time.Second, 2, clients...)
	for i, c := range clients {
		if got := clusterInfoField(t, c, "cluster_known_nodes"); got != "3" {
			t.Errorf("node %d: cluster_known_nodes = %s, want 3", i, got)
		}
	}
	// HELLO: every node at priority 1 once the bus links are up.
	waitUntil(t, 10*time.Second, "HELLO on node 0 to list 3 nodes at priority 1", func() bool {
		h := doArr(t, clients[0], "HELLO")
		if len(h) != 5 || h[1] != ids[0] {
			return false
		}
		for _, e := range h[2:] {
			if n, ok := e.([]any); !ok || len(n) != 4 || n[3] != "1" {
				return false
			}
		}
		return true
	})
	lines := clusterNodes(t, clients[0])
	for i, id := range ids {
		l, ok := lines[id]
		switch {
		case !ok:
			t.Errorf("node 0's CLUSTER NODES lacks node %d: %v", i, lines)
		case l.addr != "127.0.0.1:"+strconv.Itoa(nodes[i].port):
			t.Errorf("node 0's CLUSTER NODES gives node %d at %s, want port %d", i, l.addr, nodes[i].port)
		case i == 0 && l.flags != "myself", i > 0 && l.flags != "noflags":
			t.Errorf("node 0's CLUSTER NODES flags node %d %q", i, l.flags)
		case l.link != "connected":
			t.Errorf("node 0's CLUSTER NODES: node %d %s", i, l.link)
		}
	}

	// SIGKILL node 2: the others flag it fail within about 2× the timeout.
	// (SAVECONFIG first: the nodes file is written within a few ms of a
	// change, and this test does not race that.)
	if got := doStr(t, clients[2], "CLUSTER", "SAVECONFIG"); got != "OK" {
		t.Fatalf("CLUSTER SAVECONFIG = %q", got)
	}
	nodes[2].Kill()
	killed := time.Now()
	failed := waitUntil(t, 30*time.Second, "nodes 0 and 1 to flag node 2 fail", func() bool {
		for _, c := range clients[:2] {
			if !hasFlag(clusterNodes(t, c)[ids[2]].flags, "fail") {
				return false
			}
		}
		return true
	})
	took := failed.Sub(killed)
	t.Logf("node 2 flagged fail on both others %v after SIGKILL (cluster-node-timeout %v)", took.Round(time.Millisecond), nodeTimeout)
	// About 2× the timeout; the slack is for a loaded 2-core machine
	// running -race binaries.
	if took > 2*nodeTimeout+5*time.Second {
		t.Errorf("node 2 flagged fail %v after SIGKILL, want within about %v", took, 2*nodeTimeout)
	}
	if got := doArr(t, clients[0], "HELLO"); !strings.Contains(fmt.Sprint(got), ids[2]+" 127.0.0.1 "+strconv.Itoa(nodes[2].port)+" 100]") {
		t.Errorf("HELLO with node 2 failed = %v, want it at priority 100", got)
	}
	if got := info(t, clients[0], "cluster")["cluster_failed_nodes"]; got != "1" {
		t.Errorf("INFO cluster_failed_nodes = %q, want 1", got)
	}

	// Restarted on its directory (new client and bus ports), no MEET: it
	// rejoins from its nodes file and the flag clears everywhere.
	nodes[2].Start()
	clients[2] = nodes[2].client(t)
	if got := myID(t, clients[2]); got != ids[2] {
		t.Fatalf("node 2's id after the restart = %s, want %s", got, ids[2])
	}
	waitReachable(t, 20*time.Second, 2, clients...)
	waitUntil(t, 10*time.Second, "node 0 to give node 2 with no flag at its new port", func() bool {
		l := clusterNodes(t, clients[0])[ids[2]]
		return l.flags == "noflags" && l.addr == "127.0.0.1:"+strconv.Itoa(nodes[2].port)
	})
}

// TestDisqueSuiteClusterSetup is the setup Disque's own cluster test suite
// runs before each unit: 7 instances from disque_N/disque.conf in one
// working directory, then on each CLUSTER RESET HARD, CLUSTER LEAVING no,
// CONFIG SET cluster-node-timeout 3000 and CONFIG REWRITE, a chain of
// CLUSTER MEET 127.0.0.1 <next port>, and a wait until every node's CLUSTER
// INFO says cluster_reachable_nodes:6. It must converge in seconds (the
// suite allows 50).
func TestDisqueSuiteClusterSetup(t *testing.T) {
	if testing.Short() {
		t.Skip("7 processes; CI runs it (no -short)")
	}
	const n = 7
	work := t.TempDir()
	var clients []*redis.Client
	var ports []int
	used := map[int]bool{}
	for i := range n {
		port := freeClusterPort(t)
		for used[port] {
			port = freeClusterPort(t)
		}
		used[port] = true
		s := disqueInstance(t, work, i, port)
		s.Start()
		clients, ports = append(clients, s.client(t)), append(ports, port)
	}
	start := time.Now()
	ids := map[string]bool{}
	for i, c := range clients {
		before := myID(t, c)
		for _, cmd := range [][]any{
			{"CLUSTER", "RESET", "HARD"},
			{"CLUSTER", "LEAVING", "no"},
			{"CONFIG", "SET", "cluster-node-timeout", "3000"},
			{"CONFIG", "REWRITE"},
		} {
			if got := doStr(t, c, cmd...); got != "OK" {
				t.Fatalf("node %d: %v = %q", i, cmd, got)
			}
		}
		id := myID(t, c)
		if id == before {
			t.Errorf("node %d: CLUSTER RESET HARD kept the node id %s", i, id)
		}
		ids[id] = true
	}
	if len(ids) != n {
		t.Fatalf("%d distinct node ids after CLUSTER RESET HARD, want %d", len(ids), n)
	}
	for i := range n - 1 {
		if got := doStr(t, clients[i], "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(ports[i+1])); got != "OK" {
			t.Fatalf("node %d: CLUSTER MEET = %q", i, got)
		}
	}
	waitReachable(t, 50*time.Second, n-1, clients...)
	t.Logf("7 nodes converged %v after the setup began", time.Since(start).Round(time.Millisecond))
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the 7-node cluster took %v to converge, want seconds", took)
	}
}

// TestClusterWrongSecretIsRefused: a node whose cluster-secret differs is
// refused (it never becomes reachable) and the refusal is logged, while
// the nodes that share the secret form their cluster.
func TestClusterWrongSecretIsRefused(t *testing.T) {
	a := startServer(t, "--cluster-secret", "right", "--cluster-node-timeout", "2000")
	b := startServer(t, "--cluster-secret", "right", "--cluster-node-timeout", "2000")
	c := startServer(t, "--cluster-secret", "wrong", "--cluster-node-timeout", "2000")
	ca, cb, cc := a.client(t), b.client(t), c.client(t)
	if got := doArr(t, ca, "CONFIG", "GET", "cluster-secret"); len(got) != 2 || got[1] != redacted {
		t.Errorf("CONFIG GET cluster-secret = %v, want it %s", got, redacted)
	}
	if got := doStr(t, ca, "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(b.port), busPortOf(t, cb)); got != "OK" {
		t.Fatalf("CLUSTER MEET b = %q", got)
	}
	waitReachable(t, 20*time.Second, 1, ca, cb)
	// The MEET of the node with the wrong secret fails, now or in the
	// background; either way it is refused and logged.
	meet, err := ca.Do(t.Context(), "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(c.port), busPortOf(t, cc)).Result()
	t.Logf("CLUSTER MEET of the node with the wrong secret: %v, %v", meet, err)
	refusal := func() bool {
		for _, s := range []*daemon{a, c} {
			out := strings.ToLower(s.logs[len(s.logs)-1].String())
			if strings.Contains(out, "secret") && (strings.Contains(out, "refused") || strings.Contains(out, "rejected")) {
				return true
			}
		}
		return false
	}
	waitUntil(t, 20*time.Second, "the refusal of the wrong secret in a log", refusal)
	for _, cl := range []*redis.Client{ca, cb} {
		if _, ok := clusterNodes(t, cl)[myID(t, cc)]; ok {
			t.Errorf("a node with the right secret knows the node with the wrong one: %v", clusterNodes(t, cl))
		}
	}
	if got := clusterInfoField(t, cc, "cluster_reachable_nodes"); got != "0" {
		t.Errorf("the node with the wrong secret reaches %s nodes, want 0", got)
	}
}

// TestClusterNodesFileKeepsPeersLearnedByGossip: A MEETs B and B MEETs C,
// so A and C learn of each other by gossip alone. C starts last, and as soon
// as the three see each other and C's nodes file lists A (written on its
// own: no SAVECONFIG), B and C are killed with SIGKILL and C is restarted
// on its directory, on another bus port: it rejoins A, the only live node,
// from its nodes file alone, with no MEET.
// (The nodes file used to be written at most every 250 ms, counting from
// the write at start: a node killed within 250 ms of its start had not
// saved the peers it learned meanwhile. It is written within milliseconds
// of a change now, but after it: the test used to kill C as soon as its
// CLUSTER NODES listed A, and on a loaded machine C, alive 150 ms, was
// killed before its write — an fsync and a rename — was done, and
// restarted knowing only B, dead. replication/doc.go: "until the write a
// kill -9 loses the change".)
func TestClusterNodesFileKeepsPeersLearnedByGossip(t *testing.T) {
	var nodes []*daemon
	var clients []*redis.Client
	var buses []int
	for range 3 {
		bus := freePort(t)
		s := startServer(t, "--cluster-node-timeout", "2000", "--cluster-bus-port", strconv.Itoa(bus))
		nodes, clients, buses = append(nodes, s), append(clients, s.client(t)), append(buses, bus)
	}
	a, b, c := 0, 1, 2
	// A chain: A meets B, B meets C.
	for _, m := range [][2]int{{a, b}, {b, c}} {
		if got := doStr(t, clients[m[0]], "CLUSTER", "MEET", "127.0.0.1", strconv.Itoa(nodes[m[1]].port), strconv.Itoa(buses[m[1]])); got != "OK" {
			t.Fatalf("CLUSTER MEET = %q", got)
		}
	}
	waitReachable(t, 20*time.Second, 2, clients...)
	idA := myID(t, clients[a])
	listed := waitUntil(t, 10*time.Second, "C to list A in CLUSTER NODES", func() bool {
		_, ok := clusterNodes(t, clients[c])[idA]
		return ok
	})
	nodesFile := filepath.Join(nodes[c].dir, replication.NodesFileName)
	saved := waitUntil(t, 10*time.Second, "C's nodes file to list A", func() bool {
		b, err := os.ReadFile(nodesFile)
		return err == nil && strings.Contains(string(b), "\nnode "+idA+" ")
	})
	t.Logf("C's nodes file listed A %v after its CLUSTER NODES did", saved.Sub(listed).Round(time.Millisecond))
	nodes[c].Kill()
	nodes[b].Kill()
	// C comes back on another bus port: A cannot find it at the old one,
	// only C's nodes file can lead it back.
	nodes[c].flags = []string{"--cluster-node-timeout", "2000"}
	nodes[c].Start()
	clients[c] = nodes[c].client(t)
	waitReachable(t, 20*time.Second, 1, clients[a], clients[c])
	if l, ok := clusterNodes(t, clients[c])[idA]; !ok || hasFlag(l.flags, "fail") {
		t.Errorf("after its restart, C's CLUSTER NODES gives A as %+v (known %v), want it reachable", l, ok)
	}
}
