package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Node is what node i of a Net must be configured with (diskque-server
// directives in brackets).
type Node struct {
	// IP is the node's own loopback address (bind): its client port, its
	// bus port and the source of its outgoing bus connections.
	IP netip.Addr
	// BusPort is the port the node's bus must listen on, on IP
	// (cluster-bus-port): the proxy forwards there.
	BusPort int
	// Proxy is the node's proxy: the bus address the node announces to its
	// peers (cluster-announce-bus-port Proxy.Port(); the IP is IP's) and
	// the one to MEET it at (CLUSTER MEET ip port busport).
	Proxy netip.AddrPort
}

// Flags are the node's command-line directives for diskque-server.
func (n Node) Flags() []string {
	return []string{"--bind", n.IP.String(), "--cluster-bus-port", strconv.Itoa(n.BusPort),
		"--cluster-announce-bus-port", strconv.Itoa(int(n.Proxy.Port()))}
}

// Event is one change a Net made, At after it was created.
type Event struct {
	At   time.Duration
	What string
}

func (e Event) String() string { return fmt.Sprintf("%8.3fs %s", e.At.Seconds(), e.What) }

// Net is a proxy in front of the bus of each of n nodes, and the faults
// between them. Node indexes are 0..n-1. Safe for concurrent use.
type Net struct {
	nodes   []Node
	proxies []*Proxy
	start   time.Time

	mu    sync.Mutex
	cut   [][]bool          // cut[a][b] == cut[b][a]
	hold  [][]bool          // hold[from][to]: bytes from → to held
	delay [][]time.Duration // delay[from][to]: added to bytes from → to
	log   []Event
}

// firstIP is node 0's address; node i has 127.0.0.(2+i) (all of 127/8 is
// the loopback interface on Linux; 127.0.0.1 stays the tests' own).
var firstIP = netip.AddrFrom4([4]byte{127, 0, 0, 2})

// New starts a proxy for each of n nodes (1..250), each on its node's IP
// (node i: 127.0.0.(2+i)), and picks each node a free bus port to forward
// to. Nets may coexist: a proxy sees only the nodes that were told its
// port.
func New(n int) (*Net, error) {
	if n < 1 || n > 250 {
		return nil, fmt.Errorf("faultproxy: %d nodes: want 1 to 250", n)
	}
	nt := &Net{start: time.Now()}
	ip := firstIP
	for range n {
		bus, err := freePort(ip)
		if err != nil {
			nt.Close()
			return nil, err
		}
		p, err := Listen(netip.AddrPortFrom(ip, 0).String(), netip.AddrPortFrom(ip, uint16(bus)).String())
		if err != nil {
			nt.Close()
			return nil, err
		}
		nt.nodes = append(nt.nodes, Node{IP: ip, BusPort: bus, Proxy: p.Addr()})
		nt.proxies = append(nt.proxies, p)
		ip = ip.Next()
	}
	nt.cut, nt.hold, nt.delay = square[bool](n), square[bool](n), square[time.Duration](n)
	return nt, nil
}

func square[T any](n int) [][]T {
	m := make([][]T, n)
	for i := range m {
		m[i] = make([]T, n)
	}
	return m
}

// freePort returns a port free on ip a moment ago.
func freePort(ip netip.Addr) (int, error) {
	ln, err := net.Listen("tcp", netip.AddrPortFrom(ip, 0).String())
	if err != nil {
		return 0, fmt.Errorf("faultproxy: no port on %s: %w", ip, err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// Len is the number of nodes.
func (n *Net) Len() int { return len(n.nodes) }

// Node is node i's configuration.
func (n *Net) Node(i int) Node { return n.nodes[i] }

// Index is the node whose IP is ip, or -1.
func (n *Net) Index(ip netip.Addr) int {
	for i, nd := range n.nodes {
		if nd.IP == ip.Unmap() {
			return i
		}
	}
	return -1
}

// SetTarget points node i's proxy at another bus address (for a node that
// had to listen elsewhere); new connections go there.
func (n *Net) SetTarget(i int, busAddr string) {
	n.proxies[i].SetTarget(busAddr)
	n.note("node %d's bus is at %s", i, busAddr)
}

// Stats is node i's proxy's counters (connections from every peer to i).
func (n *Net) Stats(i int) Stats { return n.proxies[i].Stats() }

// Events is every change made so far, oldest first.
func (n *Net) Events() []Event {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]Event(nil), n.log...)
}

// Cut cuts a and b apart both ways: their open connections are reset and
// new ones are reset at accept, until a heal.
func (n *Net) Cut(a, b int) {
	n.change(func() { n.setCut(a, b, true) }, "cut %d|%d", a, b)
}

// CutOff cuts a from every other node.
func (n *Net) CutOff(a int) {
	n.change(func() {
		for b := range n.nodes {
			n.setCut(a, b, true)
		}
	}, "cut off %d", a)
}

// Partition makes the cuts exactly those between the groups: nodes of one
// group reach each other, no node reaches one of another group, and a node
// in no group reaches nobody. Holds and delays are kept.
func (n *Net) Partition(groups ...[]int) {
	group := make([]int, len(n.nodes))
	for i := range group {
		group[i] = -1 - i // alone
	}
	var parts []string
	for g, members := range groups {
		var s []string
		for _, i := range members {
			group[i] = g
			s = append(s, strconv.Itoa(i))
		}
		parts = append(parts, strings.Join(s, ","))
	}
	n.change(func() {
		for a := range n.nodes {
			for b := range n.nodes {
				n.setCut(a, b, a != b && group[a] != group[b])
			}
		}
	}, "partition %s", strings.Join(parts, " | "))
}

// Hold black-holes the bytes from → to (one way) on open and new
// connections alike: they wait in the proxy (and then in the sender's
// socket buffer) until a heal, as behind a lost route.
func (n *Net) Hold(from, to int) {
	n.change(func() { n.hold[from][to] = from != to }, "hold %d->%d", from, to)
}

// Delay adds d of latency to the traffic between a and b, both ways.
func (n *Net) Delay(a, b int, d time.Duration) {
	n.change(func() {
		if a != b {
			n.delay[a][b], n.delay[b][a] = d, d
		}
	}, "delay %d<->%d %v", a, b, d)
}

// DelayOneWay adds d of latency to the bytes from → to.
func (n *Net) DelayOneWay(from, to int, d time.Duration) {
	n.change(func() {
		if from != to {
			n.delay[from][to] = d
		}
	}, "delay %d->%d %v", from, to, d)
}

// Heal removes every fault between a and b, both ways.
func (n *Net) Heal(a, b int) {
	n.change(func() {
		n.setCut(a, b, false)
		n.hold[a][b], n.hold[b][a] = false, false
		n.delay[a][b], n.delay[b][a] = 0, 0
	}, "heal %d|%d", a, b)
}

// HealAll removes every fault.
func (n *Net) HealAll() {
	n.change(func() {
		for a := range n.nodes {
			clear(n.cut[a])
			clear(n.hold[a])
			clear(n.delay[a])
		}
	}, "heal all")
}

// Close closes every proxy.
func (n *Net) Close() error {
	var errs []error
	for _, p := range n.proxies {
		errs = append(errs, p.Close())
	}
	return errors.Join(errs...)
}

func (n *Net) setCut(a, b int, on bool) {
	if a != b {
		n.cut[a][b], n.cut[b][a] = on, on
	}
}

// change applies f to the fault matrices, logs it and gives every proxy
// the rules that follow. The proxy in front of x sees the connections y
// dials to x: bytes up are y → x, bytes down x → y.
func (n *Net) change(f func(), format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	f()
	n.log = append(n.log, Event{At: time.Since(n.start), What: fmt.Sprintf(format, args...)})
	for x, p := range n.proxies {
		for y, src := range n.nodes {
			if x == y {
				continue
			}
			r := Rule{Reset: n.cut[x][y], HoldUp: n.hold[y][x], HoldDown: n.hold[x][y],
				Up: n.delay[y][x], Down: n.delay[x][y]}
			if p.Rule(src.IP) != r {
				p.SetRule(src.IP, r)
			}
		}
	}
}

func (n *Net) note(format string, args ...any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.log = append(n.log, Event{At: time.Since(n.start), What: fmt.Sprintf(format, args...)})
}
