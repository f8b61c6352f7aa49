package faultproxy

import (
	"slices"
	"strings"
	"testing"
	"time"
)

func newNet(t *testing.T, n int) *Net {
	t.Helper()
	nt, err := New(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nt.Close() })
	return nt
}

// rules is the matrix of proxies' rules: r[x][y] is what x's proxy does to
// connections from y.
func rules(nt *Net) [][]Rule {
	r := square[Rule](nt.Len())
	for x := range r {
		for y := range r[x] {
			r[x][y] = nt.proxies[x].Rule(nt.Node(y).IP)
		}
	}
	return r
}

func TestNetNodesHaveTheirOwnAddressesAndFlags(t *testing.T) {
	nt := newNet(t, 3)
	for i := range 3 {
		nd := nt.Node(i)
		if want := firstIP.As4()[3] + byte(i); nd.IP.As4()[3] != want || nd.Proxy.Addr() != nd.IP {
			t.Fatalf("node %d = %+v, want IP 127.0.0.%d with its proxy on it", i, nd, want)
		}
		if nt.Index(nd.IP) != i {
			t.Fatalf("Index(%s) = %d, want %d", nd.IP, nt.Index(nd.IP), i)
		}
		flags := strings.Join(nd.Flags(), " ")
		if !strings.Contains(flags, "--bind "+nd.IP.String()) || !strings.Contains(flags, "--cluster-announce-bus-port") {
			t.Fatalf("flags %q", flags)
		}
	}
	if _, err := New(0); err == nil {
		t.Fatal("New(0) succeeded")
	}
}

func TestNetPartitionCutsBetweenGroupsOnly(t *testing.T) {
	nt := newNet(t, 4)
	nt.Partition([]int{0}, []int{1, 2}) // 3 is in no group: alone
	r := rules(nt)
	cut := func(a, b int) bool { return r[a][b].Reset }
	for _, c := range []struct {
		a, b int
		want bool
	}{{0, 1, true}, {0, 2, true}, {1, 2, false}, {3, 0, true}, {3, 1, true}, {2, 3, true}} {
		if cut(c.a, c.b) != c.want || cut(c.b, c.a) != c.want {
			t.Fatalf("after partition 0 | 1,2: cut(%d,%d) = %v/%v, want %v", c.a, c.b, cut(c.a, c.b), cut(c.b, c.a), c.want)
		}
	}
	nt.Partition([]int{0, 1, 2, 3})
	for x := range r {
		for y := range r {
			if rules(nt)[x][y].Reset {
				t.Fatalf("one group: %d still cuts %d", x, y)
			}
		}
	}
}

func TestNetOneWayFaultsLandOnBothKindsOfConnection(t *testing.T) {
	nt := newNet(t, 2)
	nt.Hold(0, 1)
	nt.DelayOneWay(1, 0, 30*time.Millisecond)
	r := rules(nt)
	// Bytes 0 → 1 are held: "up" on connections 0 dials to 1's proxy,
	// "down" on those 1 dials to 0's.
	if !r[1][0].HoldUp || r[1][0].HoldDown || !r[0][1].HoldDown || r[0][1].HoldUp {
		t.Fatalf("hold 0->1: rules %+v", r)
	}
	if r[0][1].Up != 30*time.Millisecond || r[1][0].Down != 30*time.Millisecond || r[1][0].Up != 0 {
		t.Fatalf("delay 1->0: rules %+v", r)
	}
	nt.Heal(0, 1)
	if r := rules(nt); r[0][1] != (Rule{}) || r[1][0] != (Rule{}) {
		t.Fatalf("after the heal: %+v", r)
	}
	var what []string
	for _, e := range nt.Events() {
		what = append(what, e.What)
	}
	if want := []string{"hold 0->1", "delay 1->0 30ms", "heal 0|1"}; !slices.Equal(what, want) {
		t.Fatalf("events %q, want %q", what, want)
	}
}

// TestNetCutResetsTrafficThroughTheProxy: real connections from node 1's
// address to node 0's proxy (standing in for node 0's bus) are reset by a
// cut and by CutOff, and flow again after HealAll; node 2's are untouched
// by a cut between 0 and 1.
func TestNetCutResetsTrafficThroughTheProxy(t *testing.T) {
	nt := newNet(t, 3)
	nt.SetTarget(0, echoServer(t, nt.Node(0).IP.String()))
	to0 := nt.Node(0).Proxy.String()
	c1 := dialFrom(t, nt.Node(1).IP, to0)
	c2 := dialFrom(t, nt.Node(2).IP, to0)
	if err := roundTrip(c1, "a", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	nt.Cut(0, 1)
	if err := roundTrip(c1, "b", 5*time.Second); err == nil {
		t.Fatal("node 1's connection to node 0 survived a cut")
	}
	if err := roundTrip(c2, "b", 5*time.Second); err != nil {
		t.Fatalf("node 2's connection, under a cut 0|1: %v", err)
	}
	nt.CutOff(0)
	if err := roundTrip(c2, "c", 5*time.Second); err == nil {
		t.Fatal("node 2's connection to node 0 survived CutOff(0)")
	}
	nt.HealAll()
	if err := roundTrip(dialFrom(t, nt.Node(1).IP, to0), "d", 5*time.Second); err != nil {
		t.Fatalf("after HealAll: %v", err)
	}
	if s := nt.Stats(0); s.Reset != 2 || s.Accepted != 3 {
		t.Fatalf("node 0's proxy stats = %+v, want 2 resets of 3 connections", s)
	}
}
