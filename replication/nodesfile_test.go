package replication

import (
	"errors"
	"net"
	"strings"
	"testing"
	"time"
)

func TestNodesFileRoundTrip(t *testing.T) {
	self := NodeInfo{ID: strings.Repeat("a", 40), ClientAddr: "127.0.0.1:7711", BusAddr: "127.0.0.1:17711", Myself: true}
	peers := []NodeInfo{
		{ID: strings.Repeat("b", 40), ClientAddr: "10.0.0.2:7711", BusAddr: "10.0.0.2:17711"},
		{ID: strings.Repeat("c", 40), ClientAddr: "", BusAddr: "[::1]:17711", Failed: true, Leaving: true},
	}
	got, err := decodeNodesFile(nodesFile{Self: self, Peers: peers}.encode())
	if err != nil {
		t.Fatal(err)
	}
	if got.Self != self || len(got.Peers) != 2 || got.Peers[0] != peers[0] || got.Peers[1] != peers[1] {
		t.Fatalf("round trip: %+v", got)
	}
}

func TestNodesFileDamage(t *testing.T) {
	id, other := strings.Repeat("a", 40), strings.Repeat("b", 40)
	for name, content := range map[string]string{
		"empty":          "",
		"no myself":      "node " + other + " 1.2.3.4:1 1.2.3.4:2 noflags\n",
		"short line":     "myself " + id + " 1.2.3.4:1\n",
		"bad id":         "myself " + strings.Repeat("A", 40) + " 1.2.3.4:1 1.2.3.4:2 noflags\n",
		"bad address":    "myself " + id + " 1.2.3.4 1.2.3.4:2 noflags\n",
		"unknown flag":   "myself " + id + " 1.2.3.4:1 1.2.3.4:2 handshake\n",
		"two myself":     "myself " + id + " 1.2.3.4:1 1.2.3.4:2 noflags\nmyself " + other + " 1.2.3.4:1 1.2.3.4:2 noflags\n",
		"listed twice":   "myself " + id + " 1.2.3.4:1 1.2.3.4:2 noflags\nnode " + id + " 1.2.3.4:1 1.2.3.4:2 noflags\n",
		"unknown kind":   "myself " + id + " 1.2.3.4:1 1.2.3.4:2 noflags\npeer " + other + " 1.2.3.4:1 1.2.3.4:2 noflags\n",
		"binary garbage": "\x00\xff\xfe",
	} {
		if _, err := decodeNodesFile([]byte(content)); !errors.Is(err, errNodesFileDamaged) {
			t.Errorf("%s: err = %v; want errNodesFileDamaged", name, err)
		}
	}
}

func TestNodeMetaRoundTripAndLimits(t *testing.T) {
	m := nodeMeta{ID: strings.Repeat("f", 40), ClientAddr: "[2001:db8::1]:7711", BusAddr: "[2001:db8::1]:17711", Leaving: true}
	b := m.encode()
	if len(b) > 512 {
		t.Fatalf("metadata of %d bytes is over memberlist's limit", len(b))
	}
	got, err := decodeMeta(b)
	if err != nil || got != m {
		t.Fatalf("decodeMeta = %+v, %v; want %+v", got, err, m)
	}
	for _, bad := range []string{"", "dq1", "dq2 " + m.ID + " 1.2.3.4:1 1.2.3.4:2 -", "dq1 xyz 1.2.3.4:1 1.2.3.4:2 -",
		"dq1 " + m.ID + " nohost 1.2.3.4:2 -", strings.Repeat("x", 600)} {
		if _, err := decodeMeta([]byte(bad)); err == nil {
			t.Errorf("decodeMeta(%q) accepted", bad)
		}
	}
	// A flag from a newer version is ignored, not fatal.
	if got, err := decodeMeta([]byte("dq1 " + m.ID + " 1.2.3.4:1 1.2.3.4:2 leaving,shiny")); err != nil || !got.Leaving {
		t.Errorf("unknown flag: %+v, %v", got, err)
	}
}

func TestTimingsFitTwiceTheNodeTimeout(t *testing.T) {
	for _, T := range []int{1000, 3000, 15000, 60000} {
		d := msDuration(T)
		g := timingsFor(d)
		// Worst case to "fail": the probe that misses, its timeout, then the
		// longest suspicion (×2 for Lifeguard's awareness on the probe).
		worst := 2*(g.ProbeInterval+g.ProbeTimeout) + g.ProbeInterval*msDuration(g.SuspicionMult*g.SuspicionMaxTimeoutMult)/msDuration(1)
		if worst >= 2*d {
			t.Errorf("T=%v: worst-case fail after %v, over 2T", d, worst)
		}
		if g.SuspectAfter >= g.ProbeInterval*msDuration(g.SuspicionMult)/msDuration(1) {
			t.Errorf("T=%v: fail? (%v) would not come before the shortest suspicion", d, g.SuspectAfter)
		}
		if g.ProbeTimeout >= g.ProbeInterval {
			t.Errorf("T=%v: probe timeout %v not under the interval %v", d, g.ProbeTimeout, g.ProbeInterval)
		}
	}
}

func msDuration(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }

// TestRestartedNodeGossipsNewMetadata: memberlist tells a node's peers of
// its restart (NotifyUpdate, which they count as a sign of life) only when
// its metadata changed; the start time in it makes every start differ. A
// node restarted and killed again at once used to look to its peers as if
// it had stayed dead since its first death (Disque's suite, unit 02: "Sync
// REPLJOB messages are retried against old nodes" got -NOREPL).
func TestRestartedNodeGossipsNewMetadata(t *testing.T) {
	id := strings.Repeat("a", 40)
	meta := func(m *Membership) []byte { return (&gossipDelegate{m: m}).NodeMeta(512) }
	bus := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 17711}
	first := &Membership{id: id, client: "127.0.0.1:7711", advertise: bus, started: 1796000000000}
	// The same node, started again a millisecond later.
	second := &Membership{id: id, client: "127.0.0.1:7711", advertise: bus, started: first.started + 1}
	if a, b := meta(first), meta(second); string(a) == string(b) {
		t.Fatalf("two starts of one node gossip the same metadata %q", a)
	}
	got, err := decodeMeta(meta(first))
	if err != nil || got.Started != first.started || got.ID != id {
		t.Fatalf("decodeMeta = %+v, %v", got, err)
	}
	// A node from before the start time (5 fields) is still understood.
	if got, err := decodeMeta([]byte("dq1 " + id + " 1.2.3.4:1 1.2.3.4:2 -")); err != nil || got.Started != 0 {
		t.Fatalf("5-field metadata: %+v, %v", got, err)
	}
	if _, err := decodeMeta([]byte("dq1 " + id + " 1.2.3.4:1 1.2.3.4:2 - soon")); err == nil {
		t.Fatal("a bad start time accepted")
	}
}
