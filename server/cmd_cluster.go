package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/replication"
)

// The cluster commands: CLUSTER MEET / MYID / NODES / INFO / FORGET / RESET
// / SAVECONFIG / LEAVING, HELLO and INFO's Cluster section. Replies and
// error strings are Disque's (cluster.c), shared/CLUSTER.md says what they
// mean. The server holds no cluster state of its own: it asks the Cluster
// (membership, *replication.Membership in the daemon) and the Bus (the job
// transport) it was given with SetCluster. Until then a node is alone: it
// knows itself and nothing else, which is what a node with no peers looks
// like anyway.

func init() {
	register(
		&command{name: "hello", arity: -1, whileLoading: true, run: cmdHello},
		&command{name: "cluster", arity: -2, run: cmdCluster},
	)
}

// Cluster is what the cluster commands need of membership;
// *replication.Membership satisfies it. Its methods may do network I/O
// (Meet): the server calls them from the command's goroutine, holding no
// lock.
type Cluster interface {
	// Meet joins the node whose client port is ip:clientPort.
	Meet(ip string, clientPort int) error
	// Nodes are every known node, this one (Myself) included.
	Nodes() []replication.NodeInfo
	// Reachable are the other nodes neither suspected nor failed.
	Reachable() []replication.NodeInfo
	// Forget drops a node and keeps it from being re-learned for a while.
	Forget(id string) error
	// Reset forgets every node; newID != "" takes a new node id.
	Reset(newID string) error
	SetLeaving(on bool) error
	Leaving() bool
	// SaveConfig writes the nodes file now.
	SaveConfig() error
	// Stats are the gossip messages sent and received.
	Stats() (messagesSent, messagesReceived int64)
}

// Bus is what the cluster commands need of the job transport;
// replication.Transport satisfies it.
type Bus interface {
	// Connected: a link to the node is up (HELLO priority 5 when not,
	// CLUSTER NODES' connected|disconnected).
	Connected(id string) bool
	Stats() replication.TransportStats
}

// ClusterInfoSource is an optional interface of a Cluster or a Bus: lines
// ("key:value") it adds to INFO's Cluster section (the job protocol's
// pending REPLJOBs and SETACKs, round trips, …).
type ClusterInfoSource interface {
	InfoLines() []string
}

// NodeIDResetter is an optional interface of the Cluster: CLUSTER RESET HARD
// calls ResetNodeID(newID) after Reset and the flush of every job, for the
// parts of the node that keep the id beside membership (the store, whose job
// ids carry it, and the bus's handshakes).
type NodeIDResetter interface {
	ResetNodeID(newID string) error
}

// clusterRef is what SetCluster gave the server.
type clusterRef struct {
	c   Cluster
	bus Bus // nil: no job transport (membership only)
}

// SetCluster gives the server membership and the job transport (bus may be
// nil). Until it is called, and after SetCluster(nil, nil), the node is
// alone: CLUSTER NODES and HELLO list itself only, CLUSTER MEET is refused.
func (s *Server) SetCluster(c Cluster, bus Bus) {
	if c == nil {
		s.cluster.Store(nil)
		return
	}
	s.cluster.Store(&clusterRef{c: c, bus: bus})
}

// clusterOf is the server's cluster, or the lone node's view of itself
// (its id from the store) when there is none.
func (s *Server) clusterOf(c *call) *clusterRef {
	if r := s.cluster.Load(); r != nil {
		return r
	}
	id := ""
	if c.broker != nil {
		id = c.broker.NodeID()
	}
	return &clusterRef{c: &loneNode{id: id, leaving: &s.loneLeaving}}
}

// errNoClusterBus: CLUSTER MEET on a server that was given no Cluster (an
// embedded server: the daemon always has one).
var errNoClusterBus = errors.New("this node has no cluster bus")

// loneNode is the Cluster of a server without one: itself only.
type loneNode struct {
	id      string
	leaving *atomic.Bool
}

func (l *loneNode) Meet(string, int) error { return errNoClusterBus }
func (l *loneNode) Nodes() []replication.NodeInfo {
	return []replication.NodeInfo{{ID: l.id, Myself: true, Leaving: l.Leaving()}}
}
func (l *loneNode) Reachable() []replication.NodeInfo { return nil }
func (l *loneNode) Forget(id string) error            { return fmt.Errorf("unknown node %s", id) }
func (l *loneNode) Reset(string) error                { return nil }
func (l *loneNode) SaveConfig() error                 { return nil }
func (l *loneNode) Stats() (int64, int64)             { return 0, 0 }
func (l *loneNode) SetLeaving(on bool) error          { l.leaving.Store(on); return nil }
func (l *loneNode) Leaving() bool                     { return l.leaving.Load() }

// self is this node's entry of nodes (zero if missing).
func self(nodes []replication.NodeInfo) replication.NodeInfo {
	for _, n := range nodes {
		if n.Myself {
			return n
		}
	}
	return replication.NodeInfo{}
}

// myID is this node's id: membership's (CLUSTER RESET HARD changes it
// there), else the store's.
func (s *Server) myID(c *call, nodes []replication.NodeInfo) string {
	if id := self(nodes).ID; id != "" {
		return id
	}
	if c.broker != nil {
		return c.broker.NodeID()
	}
	return ""
}

// nodeAddr is the ip and client port a node is given as, in CLUSTER NODES
// and HELLO. This node's is the address the client reached (advertised),
// which is right even when the server listens on a wildcard address.
func (s *Server) nodeAddr(c *call, n replication.NodeInfo) (string, string) {
	if n.Myself {
		return s.advertised(c)
	}
	host, port, err := net.SplitHostPort(n.ClientAddr)
	if err != nil {
		return n.ClientAddr, "0"
	}
	return host, port
}

// connected: a node CLUSTER NODES calls connected, and HELLO does not give
// priority 5 (no link). Its link is the bus link, or gossip's: the bus
// dials a peer only when there is a message for it, so an idle peer that
// gossip hears from (it answers on the same bus port) is linked too.
func (r *clusterRef) connected(n replication.NodeInfo) bool {
	switch {
	case n.Myself:
		return true
	case r.bus != nil && r.bus.Connected(n.ID):
		return true
	}
	return !n.Failed && !n.Suspect && n.PongRecvMs > 0
}

// helloPriority is HELLO's priority of n (Disque's helloCommand): 1
// reachable, 5 no bus link, 10 suspected, 100 failed or leaving.
func (r *clusterRef) helloPriority(n replication.NodeInfo) int {
	switch {
	case n.Failed || n.Leaving:
		return 100
	case n.Suspect:
		return 10
	case !r.connected(n):
		return 5
	}
	return 1
}

// nodeFlags is CLUSTER NODES' flags field, in Disque's order.
func nodeFlags(n replication.NodeInfo) string {
	var f []string
	if n.Myself {
		f = append(f, "myself")
	}
	if n.Suspect && !n.Failed {
		f = append(f, "fail?")
	}
	if n.Failed {
		f = append(f, "fail")
	}
	if n.Leaving {
		f = append(f, "leaving")
	}
	if len(f) == 0 {
		return "noflags"
	}
	return strings.Join(f, ",")
}

// cmdHello: HELLO → [1, my-id, [id, ip, port, priority]…], every known
// node, this one included. Any argument (go-redis sends HELLO 3 to try
// RESP3) is an error, so RESP3 clients fall back to RESP2.
func cmdHello(s *Server, c *call) {
	if len(c.args) > 1 {
		c.conn.WriteError("ERR unsupported HELLO version or arguments: diskque speaks RESP2 (Disque's HELLO takes none)")
		return
	}
	r := s.cluster.Load()
	if r == nil && c.broker == nil {
		c.conn.WriteError(errLoading) // no id to give yet
		return
	}
	if r == nil {
		r = s.clusterOf(c)
	}
	nodes := r.c.Nodes()
	c.conn.WriteArray(2 + len(nodes))
	c.conn.WriteInt(1)
	c.conn.WriteBulkString(s.myID(c, nodes))
	for _, n := range nodes {
		host, port := s.nodeAddr(c, n)
		c.conn.WriteArray(4)
		c.conn.WriteBulkString(n.ID)
		c.conn.WriteBulkString(host)
		c.conn.WriteBulkString(port)
		c.conn.WriteBulkString(strconv.Itoa(r.helloPriority(n)))
	}
}

// errClusterSubcommand is Disque's reply to an unknown subcommand or a
// known one with the wrong number of arguments.
const errClusterSubcommand = "ERR Wrong CLUSTER subcommand or number of arguments"

func cmdCluster(s *Server, c *call) {
	r := s.clusterOf(c)
	sub := strings.ToLower(string(c.args[1]))
	argc := len(c.args)
	switch {
	case sub == "meet" && (argc == 4 || argc == 5):
		clusterMeet(s, r, c)
	case sub == "nodes" && argc == 2:
		var b strings.Builder
		for _, n := range r.c.Nodes() {
			host, port := s.nodeAddr(c, n)
			link := "disconnected"
			if r.connected(n) {
				link = "connected"
			}
			fmt.Fprintf(&b, "%s %s:%s %s %d %d %s\n", n.ID, host, port, nodeFlags(n), n.PingSentMs, n.PongRecvMs, link)
		}
		c.conn.WriteBulkString(b.String())
	case sub == "myid" && argc == 2:
		c.conn.WriteBulkString(s.myID(c, r.c.Nodes()))
	case sub == "info" && argc == 2:
		known := len(r.c.Nodes())
		sent, recv := r.messages()
		c.conn.WriteBulkString(fmt.Sprintf("cluster_state:ok\r\ncluster_known_nodes:%d\r\ncluster_reachable_nodes:%d\r\n"+
			"cluster_size:%d\r\ncluster_stats_messages_sent:%d\r\ncluster_stats_messages_received:%d\r\n",
			known, len(r.c.Reachable()), known, sent, recv))
	case sub == "saveconfig" && argc == 2:
		if err := r.c.SaveConfig(); err != nil {
			c.conn.WriteError("ERR error saving the cluster node config: " + oneLine(err.Error()))
			return
		}
		c.conn.WriteString("OK")
	case sub == "forget" && argc == 3:
		clusterForget(s, r, c)
	case sub == "reset" && (argc == 2 || argc == 3):
		clusterReset(r, c)
	case sub == "leaving" && (argc == 2 || argc == 3):
		if argc == 2 {
			c.conn.WriteString(yesNoReply(r.c.Leaving()))
			return
		}
		var on bool
		switch strings.ToLower(string(c.args[2])) {
		case "yes":
			on = true
		case "no":
		default:
			c.conn.WriteError("ERR Wrong argument for CLUSTER LEAVING. Use 'yes' or 'no'")
			return
		}
		if err := r.c.SetLeaving(on); err != nil {
			c.conn.WriteError("ERR " + oneLine(err.Error()))
			return
		}
		c.conn.WriteString("OK")
	default:
		c.conn.WriteError(errClusterSubcommand)
	}
}

func yesNoReply(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// messages are the cluster messages sent and received: gossip and bus.
func (r *clusterRef) messages() (sent, recv int64) {
	sent, recv = r.c.Stats()
	if r.bus != nil {
		st := r.bus.Stats()
		sent += st.MessagesSent
		recv += st.MessagesReceived
	}
	return sent, recv
}

// clusterMeet: CLUSTER MEET ip port [busport]. The port is the peer's
// client port, as in Disque, whose bus is at port + 10000; busport, when
// given, is its bus port (a cluster-bus-port other than port + 10000) for a
// Cluster that can use it (BusMeeter), and port is then only checked.
func clusterMeet(s *Server, r *clusterRef, c *call) {
	ip, portArg := string(c.args[2]), string(c.args[3])
	port, err := strconv.ParseInt(portArg, 10, 64)
	if err != nil {
		c.conn.WriteError("ERR Invalid TCP port specified: " + truncate(portArg, 64))
		return
	}
	if port <= 0 || port > 65535 {
		c.conn.WriteError(fmt.Sprintf("ERR Invalid node address specified: %s:%s", truncate(ip, 64), truncate(portArg, 64)))
		return
	}
	if net.ParseIP(ip) == nil {
		// A name, given by the user: looked up here, once, with a
		// timeout; membership and gossip take addresses only.
		resolved, ok := resolveMeetHost(ip)
		if !ok {
			c.conn.WriteError(fmt.Sprintf("ERR Invalid node address specified: %s:%s", truncate(ip, 64), truncate(portArg, 64)))
			return
		}
		ip = resolved
	}
	if len(c.args) == 5 {
		busArg := string(c.args[4])
		bus, err := strconv.ParseInt(busArg, 10, 64)
		if err != nil || bus <= 0 || bus > 65535 {
			c.conn.WriteError("ERR Invalid TCP bus port specified: " + truncate(busArg, 64))
			return
		}
		bm, ok := r.c.(BusMeeter)
		if !ok {
			c.conn.WriteError("ERR this node cannot meet a node on a given bus port: use CLUSTER MEET ip port")
			return
		}
		err = bm.MeetBus(ip, int(bus))
		meetReply(s, c, ip, portArg, err)
		return
	}
	meetReply(s, c, ip, portArg, r.c.Meet(ip, int(port)))
}

// meetResolveTimeout bounds CLUSTER MEET's lookup of a host name.
const meetResolveTimeout = 2 * time.Second

// resolveMeetHost looks up host (CLUSTER MEET of a name) and returns its
// first address, IPv4 preferred, or false if it has none in time.
func resolveMeetHost(host string) (string, bool) {
	if host == "" || len(host) > 253 {
		return "", false
	}
	ctx, cancel := context.WithTimeout(context.Background(), meetResolveTimeout)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupNetIP(ctx, "ip", host)
	if err != nil || len(addrs) == 0 {
		return "", false
	}
	best := addrs[0].Unmap()
	for _, a := range addrs {
		if a.Unmap().Is4() {
			best = a.Unmap()
			break
		}
	}
	return best.String(), true
}

// BusMeeter is an optional interface of the Cluster
// (*replication.Membership has it): MeetBus joins the node whose bus
// listens on ip:busPort (CLUSTER MEET's third argument, for a node whose
// cluster-bus-port is not its port + 10000).
type BusMeeter interface {
	MeetBus(ip string, busPort int) error
}

// backgroundMeet is an error of a Cluster's Meet whose join goes on in the
// background (*replication.MeetError: the node is tried again for the node
// timeout, Disque's handshake).
type backgroundMeet interface{ InBackground() bool }

func meetReply(s *Server, c *call, ip, port string, err error) {
	var bg backgroundMeet
	if errors.As(err, &bg) && bg.InBackground() {
		// Disque answers +OK and handshakes in the background; so do we
		// when the first attempt did not reach the node (it may be
		// starting): the reason goes to the log, the retries go on for the
		// node timeout, and a node that never answers is logged too.
		s.opts.Logger.Warn("CLUSTER MEET: the node did not answer yet; retrying in the background",
			"addr", net.JoinHostPort(ip, port), "err", oneLine(err.Error()))
		c.conn.WriteString("OK")
		return
	}
	if err != nil {
		// An error that no retry cures (no cluster bus, membership
		// closed) is said at once.
		c.conn.WriteError(fmt.Sprintf("ERR CLUSTER MEET %s:%s failed: %s", truncate(ip, 64), truncate(port, 64), oneLine(err.Error())))
		return
	}
	c.conn.WriteString("OK")
}

// clusterForget: CLUSTER FORGET id, Disque's checks and replies.
func clusterForget(s *Server, r *clusterRef, c *call) {
	id := string(c.args[2])
	if len(id) != 40 {
		c.conn.WriteError("ERR Invalid node identifier")
		return
	}
	nodes := r.c.Nodes()
	known := false
	for _, n := range nodes {
		if n.ID == id {
			if n.Myself {
				c.conn.WriteError("ERR I tried hard but I can't forget myself...")
				return
			}
			known = true
		}
	}
	if !known {
		c.conn.WriteError("ERR Unknown node " + id)
		return
	}
	if err := r.c.Forget(id); err != nil {
		c.conn.WriteError("ERR " + oneLine(err.Error()))
		return
	}
	c.conn.WriteString("OK")
}

// clusterReset: CLUSTER RESET [SOFT|HARD]: forget every node and flush
// every job; HARD also takes a new node id.
func clusterReset(r *clusterRef, c *call) {
	hard := false
	if len(c.args) == 3 {
		switch strings.ToLower(string(c.args[2])) {
		case "hard":
			hard = true
		case "soft":
		default:
			c.conn.WriteError("ERR syntax error")
			return
		}
	}
	newID := ""
	if hard {
		newID = randomNodeID()
	}
	if err := r.c.Reset(newID); err != nil {
		c.conn.WriteError("ERR " + oneLine(err.Error()))
		return
	}
	if c.broker != nil {
		if err := c.broker.FlushAll(); err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
	}
	// After the flush: the store takes a new id only while it holds no job
	// (the ids of its jobs carry the old one).
	if res, ok := r.c.(NodeIDResetter); ok && hard {
		if err := res.ResetNodeID(newID); err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
	}
	c.conn.WriteString("OK")
}

// randomNodeID is a new node id: 40 lower-case hex characters.
func randomNodeID() string {
	var b [20]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// clusterInfo is INFO's Cluster section: what membership knows and what the
// bus carried.
func (s *Server) clusterInfo(c *call) []string {
	r := s.clusterOf(c)
	nodes := r.c.Nodes()
	var failed, suspected, leaving int
	for _, n := range nodes {
		switch {
		case n.Failed:
			failed++
		case n.Suspect:
			suspected++
		}
		if n.Leaving && !n.Myself {
			leaving++
		}
	}
	gossipSent, gossipRecv := r.c.Stats()
	var bus replication.TransportStats
	if r.bus != nil {
		bus = r.bus.Stats()
	}
	busPort := "0"
	if _, p, err := net.SplitHostPort(self(nodes).BusAddr); err == nil {
		busPort = p
	}
	lines := []string{
		fmt.Sprintf("cluster_enabled:%d", boolInt(s.cluster.Load() != nil)),
		"cluster_bus_port:" + busPort,
		fmt.Sprintf("cluster_known_nodes:%d", len(nodes)),
		fmt.Sprintf("cluster_reachable_nodes:%d", len(r.c.Reachable())),
		fmt.Sprintf("cluster_failed_nodes:%d", failed),
		fmt.Sprintf("cluster_suspected_nodes:%d", suspected),
		fmt.Sprintf("cluster_leaving_nodes:%d", leaving),
		fmt.Sprintf("cluster_leaving:%d", boolInt(r.c.Leaving())),
		fmt.Sprintf("cluster_gossip_messages_sent:%d", gossipSent),
		fmt.Sprintf("cluster_gossip_messages_received:%d", gossipRecv),
		fmt.Sprintf("cluster_bus_messages_sent:%d", bus.MessagesSent),
		fmt.Sprintf("cluster_bus_messages_received:%d", bus.MessagesReceived),
		fmt.Sprintf("cluster_bus_bytes_sent:%d", bus.BytesSent),
		fmt.Sprintf("cluster_bus_bytes_received:%d", bus.BytesReceived),
		fmt.Sprintf("cluster_bus_messages_dropped:%d", bus.Dropped),
	}
	if src, ok := r.c.(ClusterInfoSource); ok {
		lines = append(lines, src.InfoLines()...)
	}
	if src, ok := r.bus.(ClusterInfoSource); ok {
		lines = append(lines, src.InfoLines()...)
	}
	return lines
}
