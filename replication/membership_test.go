package replication

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/leakcheck"
)

// testNode is one in-process node: a PortMux on 127.0.0.1 and a Membership.
type testNode struct {
	t       *testing.T
	id, dir string
	mux     *PortMux
	m       *Membership
	serve   chan error

	mu      sync.Mutex
	changes []NodeInfo // OnChange calls, gone ones with ID prefixed "-"
}

type nodeOpts struct {
	timeout time.Duration
	secret  string
	ban     time.Duration
	addr    string // listen address; "" = 127.0.0.1:0
	warns   *warnRecorder
	// advertise and source are MembershipConfig.AdvertiseBus and
	// SourceAddr.
	advertise string
	source    netip.Addr
}

// warnRecorder is a slog.Handler keeping the messages at WARN and above.
type warnRecorder struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnRecorder) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (w *warnRecorder) Handle(_ context.Context, r slog.Record) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.msgs = append(w.msgs, r.Message)
	return nil
}
func (w *warnRecorder) WithAttrs([]slog.Attr) slog.Handler { return w }
func (w *warnRecorder) WithGroup(string) slog.Handler      { return w }

func (w *warnRecorder) has(sub string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, m := range w.msgs {
		if strings.Contains(m, sub) {
			return true
		}
	}
	return false
}

func randomID(t testing.TB) string {
	var b [20]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b[:])
}

func testLogger(t testing.TB) *slog.Logger {
	if testing.Verbose() && os.Getenv("MEMBERSHIP_DEBUG") != "" {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startNode starts a node with id and dir ("" = new ones).
func startNode(t *testing.T, id, dir string, o nodeOpts) *testNode {
	t.Helper()
	if id == "" {
		id = randomID(t)
	}
	if dir == "" {
		dir = t.TempDir()
	}
	if o.addr == "" {
		o.addr = "127.0.0.1:0"
	}
	if o.timeout == 0 {
		o.timeout = 2 * time.Second
	}
	n := &testNode{t: t, id: id, dir: dir, serve: make(chan error, 1)}
	var err error
	// The port of a node just closed may still be held for a moment.
	deadline := time.Now().Add(5 * time.Second)
	for {
		n.mux, err = ListenMux(o.addr, testLogger(t))
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // polling for the port, not synchronising
	}
	if err != nil {
		t.Fatal(err)
	}
	bus := n.mux.Addr()
	// A client port 10000 below the bus port, so Meet(ip, clientPort) finds it.
	client := net.JoinHostPort("127.0.0.1", strconv.Itoa(max(bus.Port-10000, 1)))
	logger := testLogger(t)
	if o.warns != nil {
		logger = slog.New(o.warns)
	}
	n.m, err = NewMembership(MembershipConfig{
		ID: id, Dir: dir, ClientAddr: client, Mux: n.mux, NodeTimeout: o.timeout,
		Secret: o.secret, Logger: logger, ForgetBan: o.ban,
		AdvertiseBus: o.advertise, SourceAddr: o.source,
		OnChange: func(info NodeInfo, gone bool) {
			n.mu.Lock()
			defer n.mu.Unlock()
			if gone {
				info.ID = "-" + info.ID
			}
			n.changes = append(n.changes, info)
		},
	})
	if err != nil {
		n.mux.Close()
		t.Fatal(err)
	}
	go func() { n.serve <- n.mux.Serve() }()
	t.Cleanup(n.stop)
	return n
}

// stop closes the node abruptly (no leave: peers see it fail, as after kill -9).
func (n *testNode) stop() {
	if n.m == nil {
		return
	}
	if err := n.m.Close(); err != nil {
		n.t.Errorf("close membership: %v", err)
	}
	n.mux.Close()
	<-n.serve
	n.m = nil
}

func (n *testNode) busPort() int { return n.mux.Addr().Port }

func (n *testNode) meet(t *testing.T, other *testNode) {
	t.Helper()
	if err := n.m.MeetBus("127.0.0.1", other.busPort()); err != nil {
		t.Fatalf("meet: %v", err)
	}
}

func (n *testNode) node(id string) (NodeInfo, bool) {
	for _, x := range n.m.Nodes() {
		if x.ID == id {
			return x, true
		}
	}
	return NodeInfo{}, false
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond) // polling with a deadline
	}
	return time.Since(start)
}

func allReachable(nodes []*testNode) func() bool {
	return func() bool {
		for _, n := range nodes {
			if len(n.m.Reachable()) != len(nodes)-1 {
				return false
			}
		}
		return true
	}
}

func TestMembershipMeetThreeNodes(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	c := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	// Meet by client port: the bus is at client port + 10000.
	if err := c.m.Meet("127.0.0.1", b.busPort()-10000); err != nil {
		t.Fatalf("meet by client port: %v", err)
	}
	nodes := []*testNode{a, b, c}
	took := waitFor(t, 10*time.Second, "3 nodes see each other", allReachable(nodes))
	t.Logf("3 nodes converged in %v", took)
	for _, n := range nodes {
		got := n.m.Nodes()
		if len(got) != 3 || !got[0].Myself || got[0].ID != n.id {
			t.Fatalf("%s: Nodes() = %+v", n.id[:8], got)
		}
		for _, o := range nodes {
			info, ok := n.node(o.id)
			if !ok {
				t.Fatalf("%s does not know %s", n.id[:8], o.id[:8])
			}
			if info.BusAddr != o.mux.Addr().String() || info.ClientAddr != o.m.client {
				t.Errorf("%s sees %s at bus %s client %s; want %s %s", n.id[:8], o.id[:8],
					info.BusAddr, info.ClientAddr, o.mux.Addr(), o.m.client)
			}
			if info.Suspect || info.Failed || info.Leaving {
				t.Errorf("%s sees %s flagged: %+v", n.id[:8], o.id[:8], info)
			}
		}
		// OnChange told of both peers.
		n.mu.Lock()
		seen := map[string]bool{}
		for _, ch := range n.changes {
			seen[ch.ID] = true
		}
		n.mu.Unlock()
		for _, o := range nodes {
			if o != n && !seen[o.id] {
				waitFor(t, 2*time.Second, "OnChange for a peer", func() bool {
					n.mu.Lock()
					defer n.mu.Unlock()
					for _, ch := range n.changes {
						if ch.ID == o.id {
							return true
						}
					}
					return false
				})
			}
		}
	}
	// a may have converged on what b sent it alone (b's join, then its
	// gossip about c) before its own first probe or gossip round: wait
	// for a send, within a few probe intervals, rather than expecting one
	// at the moment the views agree.
	waitFor(t, 5*time.Second, "a's gossip stats to count packets sent and received", func() bool {
		s, r := a.m.Stats()
		return s > 0 && r > 0
	})
}

func TestMembershipMeetErrors(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	if err := a.m.Meet("not-an-ip", 7711); !errors.Is(err, ErrInvalidAddress) {
		t.Errorf("Meet(bad ip) = %v; want ErrInvalidAddress", err)
	}
	if err := a.m.Meet("127.0.0.1", 60000); !errors.Is(err, ErrInvalidAddress) {
		t.Errorf("Meet(port whose bus port is over 65535) = %v; want ErrInvalidAddress", err)
	}
	// A port nobody listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	err = a.m.MeetBus("127.0.0.1", port)
	if !errors.Is(err, ErrMeetFailed) {
		t.Fatalf("MeetBus(closed port) = %v; want ErrMeetFailed", err)
	}
	if port > 10000 {
		err = a.m.Meet("127.0.0.1", port-10000)
		want := fmt.Sprintf("can't reach the cluster bus of 127.0.0.1:%d (bus port %d): ", port-10000, port)
		if err == nil || len(err.Error()) <= len(want) || err.Error()[:len(want)] != want {
			t.Errorf("Meet(nobody) = %q; want it to start with %q", err, want)
		}
	}
	if len(a.m.Nodes()) != 1 {
		t.Errorf("a failed meet added nodes: %+v", a.m.Nodes())
	}
}

// A MEET of a node that is not up yet fails, but goes on in the
// background (Disque's handshake, CLUSTER MEET answers +OK): the node,
// started a moment later, is met with no new MEET. A MEET nobody ever
// answers is given up after the node timeout.
func TestMembershipMeetRetriesInTheBackground(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{timeout: 2 * time.Second})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	err = a.m.MeetBus("127.0.0.1", port)
	var me *MeetError
	if !errors.As(err, &me) || !me.InBackground() {
		t.Fatalf("MeetBus(nobody yet) = %v; want a MeetError retried in the background", err)
	}
	b := startNode(t, "", "", nodeOpts{addr: addr})
	waitFor(t, 15*time.Second, "the node started after the MEET to be met", allReachable([]*testNode{a, b}))
	a.m.mu.Lock()
	left := len(a.m.handshakes)
	a.m.mu.Unlock()
	if left != 0 {
		t.Errorf("%d handshakes left after the node was met, want 0", left)
	}

	// Nobody ever answers: dropped once the node timeout has passed.
	ln, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port = ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	if err := a.m.MeetBus("127.0.0.1", port); err == nil {
		t.Fatal("MeetBus(nobody) succeeded")
	}
	waitFor(t, 20*time.Second, "the MEET nobody answers to be given up", func() bool {
		a.m.mu.Lock()
		defer a.m.mu.Unlock()
		return len(a.m.handshakes) == 0
	})
	if got := len(a.m.Nodes()); got != 2 {
		t.Errorf("after the MEET nobody answered, %d nodes known, want 2", got)
	}
}

func TestMembershipChainOfSevenConverges(t *testing.T) {
	leakcheck.Check(t)
	var nodes []*testNode
	for range 7 {
		nodes = append(nodes, startNode(t, "", "", nodeOpts{timeout: 3 * time.Second}))
	}
	start := time.Now()
	for i := 0; i+1 < len(nodes); i++ {
		nodes[i].meet(t, nodes[i+1])
	}
	waitFor(t, 15*time.Second, "a MEET chain of 7 converges", allReachable(nodes))
	t.Logf("a chain of 7 converged in %v (meets included)", time.Since(start))

	// With 7 nodes memberlist waits for confirmations before "fail": still
	// within 2× the node timeout on every other node.
	dead := nodes[3]
	dead.stop()
	killed := time.Now()
	others := append(append([]*testNode(nil), nodes[:3]...), nodes[4:]...)
	waitFor(t, 6*time.Second+time.Second, "the killed node is failed on all 6 others", func() bool {
		for _, n := range others {
			if info, _ := n.node(dead.id); !info.Failed {
				return false
			}
		}
		return true
	})
	t.Logf("failed on all 6 after %v (node timeout 3s)", time.Since(killed))
	if took := time.Since(killed); took > 6*time.Second {
		t.Errorf("failed after %v: over 2× the node timeout", took)
	}
}

func TestMembershipFailureDetectedAndCleared(t *testing.T) {
	leakcheck.Check(t)
	const timeout = 2 * time.Second
	a := startNode(t, "", "", nodeOpts{timeout: timeout})
	b := startNode(t, "", "", nodeOpts{timeout: timeout})
	c := startNode(t, "", "", nodeOpts{timeout: timeout})
	b.meet(t, a)
	c.meet(t, b)
	waitFor(t, 10*time.Second, "3 nodes converge", allReachable([]*testNode{a, b, c}))
	waitFor(t, 2*time.Second, "c's nodes file lists both peers", func() bool {
		data, err := os.ReadFile(filepath.Join(c.dir, NodesFileName))
		if err != nil {
			return false
		}
		f, err := decodeNodesFile(data)
		return err == nil && len(f.Peers) == 2
	})

	cAddr := c.mux.Addr().String()
	c.stop() // abrupt: no leave
	killed := time.Now()
	var suspectSeen, failedAt [2]time.Duration
	waitFor(t, 2*timeout+time.Second, "c failed on a and b", func() bool {
		done := true
		for i, n := range []*testNode{a, b} {
			info, ok := n.node(c.id)
			if !ok {
				t.Fatalf("%s forgot the failed node", n.id[:8])
			}
			if info.Suspect && suspectSeen[i] == 0 {
				suspectSeen[i] = time.Since(killed)
			}
			if info.Failed && failedAt[i] == 0 {
				failedAt[i] = time.Since(killed)
				if info.Suspect {
					t.Errorf("failed and suspect at once: %+v", info)
				}
			}
			done = done && failedAt[i] != 0
		}
		return done
	})
	t.Logf("suspect after %v, failed after %v (node timeout %v)", suspectSeen, failedAt, timeout)
	for i := range 2 {
		if suspectSeen[i] == 0 || suspectSeen[i] > failedAt[i] {
			t.Errorf("node %d: suspect at %v, failed at %v: want suspect first", i, suspectSeen[i], failedAt[i])
		}
	}
	if r := a.m.Reachable(); len(r) != 1 || r[0].ID != b.id {
		t.Errorf("a.Reachable() = %+v; want only b", r)
	}
	if info, _ := a.node(c.id); info.PingSentMs == 0 {
		t.Errorf("a failed node has no ping sent: %+v", info)
	}

	// c restarts with its id, directory and address: it rejoins from its
	// nodes file (no MEET) and the flags clear.
	c2 := startNode(t, c.id, c.dir, nodeOpts{timeout: timeout, addr: cAddr})
	took := waitFor(t, 3*timeout, "c back on a and b, and c sees them", allReachable([]*testNode{a, b, c2}))
	t.Logf("flags cleared %v after the restart", took)
	for _, n := range []*testNode{a, b} {
		if info, _ := n.node(c.id); info.Failed || info.Suspect {
			t.Errorf("still flagged: %+v", info)
		}
	}
}

func TestMembershipRestartOfEveryNodeRejoins(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	waitFor(t, 10*time.Second, "2 nodes converge", allReachable([]*testNode{a, b}))
	aAddr, bAddr := a.mux.Addr().String(), b.mux.Addr().String()
	a.stop()
	b.stop() // both down at once; a's file says b, b's says a
	a2 := startNode(t, a.id, a.dir, nodeOpts{addr: aAddr})
	// a2 found nobody: b is failed for it until b is back, then b's
	// rejoin (or a2's retry of failed peers) finds it.
	b2 := startNode(t, b.id, b.dir, nodeOpts{addr: bAddr})
	took := waitFor(t, 10*time.Second, "both back, no MEET", allReachable([]*testNode{a2, b2}))
	t.Logf("rejoined in %v", took)
}

// A node restarted on its directory counts the peers of its nodes file
// reachable at once, before its rejoin has reached them (Disque does: its
// test suite sends a REPLICATE 3 ADDJOB to a node right after restarting
// it), and they stay so once the rejoin found them.
func TestMembershipPeersFromTheNodesFileAreReachableAtOnce(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	waitFor(t, 10*time.Second, "2 nodes converge", allReachable([]*testNode{a, b}))
	aAddr := a.mux.Addr().String()
	a.stop()
	a2 := startNode(t, a.id, a.dir, nodeOpts{addr: aAddr})
	if r := a2.m.Reachable(); len(r) != 1 || r[0].ID != b.id {
		t.Fatalf("right after the restart, Reachable() = %+v; want b, from the nodes file", r)
	}
	waitFor(t, 10*time.Second, "the rejoin to find b", func() bool {
		n, ok := a2.node(b.id)
		return ok && len(a2.m.Reachable()) == 1 && !n.Failed
	})
}

func TestMembershipForgetBan(t *testing.T) {
	leakcheck.Check(t)
	const ban = time.Second
	a := startNode(t, "", "", nodeOpts{ban: ban})
	b := startNode(t, "", "", nodeOpts{})
	c := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	c.meet(t, b)
	waitFor(t, 10*time.Second, "3 nodes converge", allReachable([]*testNode{a, b, c}))

	if err := a.m.Forget(a.id); !errors.Is(err, ErrForgetMyself) {
		t.Errorf("Forget(myself) = %v", err)
	}
	if err := a.m.Forget("abc"); !errors.Is(err, ErrInvalidNodeID) {
		t.Errorf("Forget(abc) = %v", err)
	}
	if err := a.m.Forget(randomID(t)); !errors.Is(err, ErrUnknownNode) {
		t.Errorf("Forget(unknown) = %v", err)
	}
	// OnChange tells what changed since it last ran: c learned and
	// forgotten before it ran is no change to it, and no "gone" comes (the
	// transport was never told of c either). allReachable reads the table,
	// not what OnChange was told, so wait for that first.
	heard := func(id string) func() bool {
		return func() bool {
			a.mu.Lock()
			defer a.mu.Unlock()
			for _, ch := range a.changes {
				if ch.ID == id {
					return true
				}
			}
			return false
		}
	}
	waitFor(t, 10*time.Second, "OnChange says c is there", heard(c.id))
	// Taken before Forget, so the ban ends at forgot + ban or later.
	forgot := time.Now()
	if err := a.m.Forget(c.id); err != nil {
		t.Fatal(err)
	}
	if _, ok := a.node(c.id); ok {
		t.Fatal("c still listed right after Forget")
	}
	if n, want := a.m.NodeCount(), len(a.m.Nodes()); n != want || n != 2 {
		t.Fatalf("NodeCount = %d after Forget, Nodes lists %d, want 2", n, want)
	}
	// A deadline, not a timing claim: OnChange is called from the
	// membership's own goroutine, late on a loaded machine (2 s failed).
	waitFor(t, 10*time.Second, "OnChange says c is gone", heard("-"+c.id))
	// Gossip goes on (c changes its metadata, b pushes its state); c must
	// stay out for the ban.
	if err := c.m.SetLeaving(true); err != nil {
		t.Fatal(err)
	}
	// Each sample's time is read after the lookup: c seen then is c
	// listed within the ban only if that time is short of it. (Read
	// before, as it was, a lookup delayed past the ban's end on a loaded
	// machine found c re-learned, rightly, and failed.)
	for {
		_, ok := a.node(c.id)
		at := time.Since(forgot)
		if ok && at < ban {
			t.Fatalf("c re-learned %v after Forget, within the %v ban", at, ban)
		}
		if ok || at >= ban*8/10 {
			break
		}
		time.Sleep(20 * time.Millisecond) // sampling during the ban window
	}
	// After the ban, gossip brings it back (Disque: re-learned after 60 s).
	waitFor(t, 15*time.Second, "c re-learned after the ban", func() bool {
		_, ok := a.node(c.id)
		return ok
	})
}

func TestMembershipReset(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	c := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	c.meet(t, b)
	waitFor(t, 10*time.Second, "3 nodes converge", allReachable([]*testNode{a, b, c}))
	if err := a.m.Reset("zz"); !errors.Is(err, ErrInvalidNodeID) {
		t.Errorf("Reset(bad id) = %v", err)
	}
	newID := randomID(t)
	if err := a.m.Reset(newID); err != nil {
		t.Fatal(err)
	}
	if got := a.m.Nodes(); len(got) != 1 || got[0].ID != newID || !got[0].Myself {
		t.Fatalf("after Reset: %+v", got)
	}
	if a.m.ID() != newID {
		t.Fatalf("ID() = %s", a.m.ID())
	}
	waitFor(t, 5*time.Second, "b and c forget a's old id", func() bool {
		_, okb := b.node(a.id)
		_, okc := c.node(a.id)
		return !okb && !okc
	})
	// Nothing re-teaches a the cluster by itself.
	for range 20 {
		if n := len(a.m.Nodes()); n != 1 {
			t.Fatalf("a re-learned nodes after Reset: %+v", a.m.Nodes())
		}
		time.Sleep(25 * time.Millisecond) // sampling
	}
	data, err := os.ReadFile(filepath.Join(a.dir, NodesFileName))
	if err != nil {
		t.Fatal(err)
	}
	if f, err := decodeNodesFile(data); err != nil || f.Self.ID != newID || len(f.Peers) != 0 {
		t.Fatalf("nodes file after Reset: %+v, %v", f, err)
	}
	// A MEET brings it back under its new id.
	a.meet(t, c)
	waitFor(t, 10*time.Second, "a rejoins under its new id", func() bool {
		for _, n := range []*testNode{b, c} {
			if _, ok := n.node(newID); !ok {
				return false
			}
		}
		return len(a.m.Reachable()) == 2
	})
}

func TestMembershipLeavingIsGossiped(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	c := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	c.meet(t, b)
	waitFor(t, 10*time.Second, "3 nodes converge", allReachable([]*testNode{a, b, c}))
	if a.m.Leaving() {
		t.Fatal("leaving at start")
	}
	if err := a.m.SetLeaving(true); err != nil {
		t.Fatal(err)
	}
	if !a.m.Leaving() || !a.m.Nodes()[0].Leaving {
		t.Fatal("Leaving() false after SetLeaving(true)")
	}
	leavingOn := func(want bool) func() bool {
		return func() bool {
			ib, _ := b.node(a.id)
			ic, _ := c.node(a.id)
			return ib.Leaving == want && ic.Leaving == want
		}
	}
	waitFor(t, 5*time.Second, "peers see leaving", leavingOn(true))
	if err := a.m.SetLeaving(false); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "peers see leaving cleared", leavingOn(false))
}

func TestMembershipWrongSecretRefused(t *testing.T) {
	leakcheck.Check(t)
	warns := &warnRecorder{}
	a := startNode(t, "", "", nodeOpts{secret: "s3cret", warns: warns})
	b := startNode(t, "", "", nodeOpts{secret: "other"})
	open := startNode(t, "", "", nodeOpts{})
	c := startNode(t, "", "", nodeOpts{secret: "s3cret"})
	if err := b.m.MeetBus("127.0.0.1", a.busPort()); !errors.Is(err, ErrMeetFailed) {
		t.Fatalf("meet with a wrong secret = %v; want ErrMeetFailed", err)
	}
	if err := open.m.MeetBus("127.0.0.1", a.busPort()); !errors.Is(err, ErrMeetFailed) {
		t.Fatalf("meet with no secret = %v; want ErrMeetFailed", err)
	}
	waitFor(t, 5*time.Second, "the refusal is logged", func() bool { return warns.has("gossip refused") })
	c.meet(t, a)
	waitFor(t, 10*time.Second, "same secret joins", allReachable([]*testNode{a, c}))
	for _, n := range []*testNode{a, c} {
		for _, stranger := range []*testNode{b, open} {
			if _, ok := n.node(stranger.id); ok {
				t.Errorf("%s knows %s, which has another secret", n.id[:8], stranger.id[:8])
			}
		}
	}
	if len(b.m.Nodes()) != 1 || len(open.m.Nodes()) != 1 {
		t.Errorf("refused nodes learned the cluster: %+v %+v", b.m.Nodes(), open.m.Nodes())
	}
}

func TestMembershipDamagedNodesFileStartsEmpty(t *testing.T) {
	leakcheck.Check(t)
	id := randomID(t)
	other := randomID(t)
	for name, content := range map[string]string{
		"garbage":   "\x00\x01 not a nodes file\n",
		"truncated": "myself " + id + " 127.0.0.1:7711",
		"foreign":   "myself " + other + " 127.0.0.1:7711 127.0.0.1:17711 noflags\nnode " + id + " 127.0.0.1:1 127.0.0.1:2 noflags\n",
	} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, NodesFileName)
			if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
			n := startNode(t, id, dir, nodeOpts{})
			if got := n.m.Nodes(); len(got) != 1 || got[0].ID != id {
				t.Fatalf("Nodes() = %+v; want only self", got)
			}
			// It is rewritten under our id.
			waitFor(t, 5*time.Second, "the nodes file is rewritten", func() bool {
				data, err := os.ReadFile(path)
				if err != nil {
					return false
				}
				f, err := decodeNodesFile(data)
				return err == nil && f.Self.ID == id && len(f.Peers) == 0
			})
		})
	}
}

func TestMembershipSetNodeTimeoutKeepsMembership(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	b.meet(t, a)
	nodes := []*testNode{a, b}
	waitFor(t, 10*time.Second, "2 nodes converge", allReachable(nodes))
	a.m.SetNodeTimeout(3 * time.Second)
	a.m.mu.Lock()
	got := a.m.timings
	a.m.mu.Unlock()
	if got != timingsFor(3*time.Second) {
		t.Fatalf("timings not applied: %+v", got)
	}
	// The new instance rejoins at once; nobody is flagged meanwhile for long.
	waitFor(t, 5*time.Second, "still converged after SetNodeTimeout", allReachable(nodes))
	for range 20 {
		if !allReachable(nodes)() {
			t.Fatalf("a node became unreachable after SetNodeTimeout: %+v / %+v", a.m.Nodes(), b.m.Nodes())
		}
		time.Sleep(50 * time.Millisecond) // sampling
	}
}

func TestMembershipMalformedPacketFrameClosesThatLinkOnly(t *testing.T) {
	leakcheck.Check(t)
	a := startNode(t, "", "", nodeOpts{})
	b := startNode(t, "", "", nodeOpts{})
	c, err := DialKind(a.mux.Addr().String(), KindGossipPacket, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	self := "127.0.0.1:1"
	frame := append([]byte{byte(len(self))}, self...)
	frame = append(frame, 0xff, 0xff, 0xff, 0xff) // a 4 GiB packet
	if _, err := c.Write(frame); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection with a malformed frame is still open")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the connection with a malformed frame was not closed")
	}
	b.meet(t, a)
	waitFor(t, 10*time.Second, "gossip still works", allReachable([]*testNode{a, b}))
}
