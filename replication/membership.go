package replication

import (
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"

	"github.com/diskque/diskque/internal/durable"

	"github.com/diskque/diskque/storage"
)

// NodeInfo is one node as this node sees it (CLUSTER NODES, HELLO).
type NodeInfo struct {
	ID         string // 40 lower-case hex
	ClientAddr string // "ip:port" of the client port (CLUSTER NODES, HELLO); "" = unknown (noaddr)
	BusAddr    string // "ip:port" of the bus port
	Myself     bool
	Suspect    bool // "fail?": no answer to our pings for 7/8 of the node timeout
	Failed     bool // "fail": memberlist declared it dead
	Leaving    bool
	PingSentMs int64 // Unix ms of the oldest unanswered ping, 0 = none
	PongRecvMs int64 // Unix ms of the last answer (or sign of life), 0 = none
}

// DefaultNodeTimeout is Disque's cluster-node-timeout.
const DefaultNodeTimeout = 15 * time.Second

// DefaultForgetBan is how long a FORGET keeps a node from being re-learned
// from gossip (Disque: 60 s).
const DefaultForgetBan = 60 * time.Second

// resetQuarantine is how long after Reset gossip about the forgotten nodes
// is refused (a few gossip rounds: what was already sent to us).
const resetQuarantine = 2 * time.Second

// MembershipConfig configures NewMembership.
type MembershipConfig struct {
	ID         string   // this node's id (the store's node id): 40 lower-case hex
	Dir        string   // data directory: the nodes file lives here ("" = no nodes file)
	ClientAddr string   // advertised client address "ip:port"
	Mux        *PortMux // the bus port; Membership registers KindGossipStream and KindGossipPacket on it
	// NodeTimeout is cluster-node-timeout; 0 = DefaultNodeTimeout.
	NodeTimeout time.Duration
	Secret      string // cluster-secret ("" = open bus): keys memberlist's gossip encryption
	Logger      *slog.Logger
	// OnChange is called (outside Membership's locks, in order, from one
	// goroutine) whenever a node joins, changes (address, flags) or is
	// forgotten (gone); never for this node. The daemon uses it to
	// SetPeer/RemovePeer on the Transport.
	OnChange func(n NodeInfo, gone bool)
	// ForgetBan is how long Forget keeps a node out; 0 = DefaultForgetBan.
	ForgetBan time.Duration
	// AdvertiseBus, if set, is the bus address ("ip:port") this node
	// tells its peers, instead of the one Mux listens on: for a node
	// behind NAT, a port forward or a fault proxy (the daemon's
	// cluster-announce-ip and cluster-announce-bus-port).
	AdvertiseBus string
	// SourceAddr, if valid, is the source address of the gossip
	// connections this node dials (dial_source.go).
	SourceAddr netip.Addr
}

var (
	// ErrInvalidNodeID: an id that is not 40 lower-case hex characters
	// (Disque: "Invalid node identifier").
	ErrInvalidNodeID = errors.New("replication: invalid node identifier")
	// ErrUnknownNode: Forget of a node this node does not know (wrapped with
	// the id; Disque: "Unknown node <id>").
	ErrUnknownNode = errors.New("replication: unknown node")
	// ErrForgetMyself: Forget of this node's own id (Disque: "I tried hard
	// but I can't forget myself...").
	ErrForgetMyself = errors.New("replication: a node can't forget itself")
	// ErrInvalidAddress: Meet with an address that is not an IP and a port
	// (Disque: "Invalid node address specified: ip:port").
	ErrInvalidAddress = errors.New("replication: invalid node address")
	// ErrMeetFailed: the peer's cluster bus could not be joined (MeetError).
	ErrMeetFailed = errors.New("replication: meet failed")
	// ErrMembershipClosed: the Membership was closed.
	ErrMembershipClosed = errors.New("replication: membership closed")
)

// MeetError says which bus could not be joined, and why. Its text is the
// reply's: "can't reach the cluster bus of ip:port (bus port N): …".
// errors.Is(err, ErrMeetFailed) holds.
type MeetError struct {
	ClientAddr string // "" when met by bus port (MeetBus)
	BusAddr    string
	Err        error
	// Retrying: the join is tried again in the background until the node
	// timeout (at least a second) has passed since the MEET, as Disque
	// keeps a node it was asked to meet in "handshake" that long: a node
	// starting a moment after the MEET is still met.
	Retrying bool
}

// InBackground reports whether the meet goes on in the background (CLUSTER
// MEET then answers +OK, as Disque does).
func (e *MeetError) InBackground() bool { return e.Retrying }

func (e *MeetError) Error() string {
	_, port, _ := net.SplitHostPort(e.BusAddr)
	if e.ClientAddr != "" {
		return fmt.Sprintf("can't reach the cluster bus of %s (bus port %s): %v", e.ClientAddr, port, e.Err)
	}
	return fmt.Sprintf("can't reach the cluster bus at %s: %v", e.BusAddr, e.Err)
}

func (e *MeetError) Unwrap() []error { return []error{ErrMeetFailed, e.Err} }

// Membership is this node's view of the cluster: memberlist (SWIM) over the
// bus port, the nodes Disque keeps (failed ones too, until FORGET or RESET),
// diskque's "fail?" flag from its own pings, and the nodes file. Safe for
// concurrent use.
type Membership struct {
	log       *slog.Logger
	dir       string
	client    string
	secret    string
	ban       time.Duration
	advertise *net.TCPAddr
	onChange  func(NodeInfo, bool)
	gt        *gossipTransport
	started   int64 // when NewMembership ran (Unix ms): in the node metadata

	// listMu guards list (memberlist is recreated by Reset and
	// SetNodeTimeout). Lock order: listMu, then memberlist's own locks
	// (its delegates run under them), then mu. No memberlist call is made
	// under mu.
	listMu sync.RWMutex
	list   *memberlist.Memberlist

	mu        sync.Mutex
	id        string
	gen       uint64 // which memberlist instance's events count
	timeout   time.Duration
	timings   gossipTimings
	leaving   bool
	resetting bool
	closed    bool
	peers     map[string]*peerState
	bans      map[string]forgetBan
	emitted   map[string]NodeInfo // what OnChange was last told
	joining   bool                // a rejoin is running
	// rejoinQueue: the bus addresses the running rejoin has yet to join.
	rejoinQueue []string
	// handshakes are the bus addresses of MEETs that failed, retried in
	// the background until their deadline or until a node at that
	// address is known (Disque's handshake nodes).
	handshakes map[string]time.Time

	kick     chan struct{} // the state changed: emit OnChange now
	saveKick chan struct{} // the nodes file is out of date
	done     chan struct{}
	wg       sync.WaitGroup
	saveMu   sync.Mutex
}

// peerState is what Membership knows of another node.
type peerState struct {
	info NodeInfo // ID, ClientAddr, BusAddr, Leaving, Failed
	// inList: the current memberlist instance has it alive (or suspect).
	inList bool
	// pending: known from the nodes file, or from before memberlist was
	// recreated, and not yet seen either way; the rejoin decides.
	pending bool
	// relearned: re-added from gossip after a FORGET ban, without
	// memberlist telling of a state change; our pings alone can fail it.
	relearned bool
	lastPong  time.Time
	pingSent  time.Time
	pinging   bool
}

type forgetBan struct {
	until time.Time
	bus   string
	reset bool // Reset's quarantine, not a FORGET: any MEET lifts it
}

// NewMembership starts memberlist on cfg.Mux and rejoins, in the
// background, the peers of the nodes file in cfg.Dir. Register it before
// cfg.Mux.Serve (or gossip arriving first is refused).
func NewMembership(cfg MembershipConfig) (*Membership, error) {
	if !storage.ValidNodeID(cfg.ID) {
		return nil, fmt.Errorf("%w: %q", ErrInvalidNodeID, cfg.ID)
	}
	if cfg.Mux == nil {
		return nil, errors.New("replication: MembershipConfig.Mux is nil")
	}
	if _, _, err := net.SplitHostPort(cfg.ClientAddr); err != nil {
		return nil, fmt.Errorf("replication: bad client address %q: %w", cfg.ClientAddr, err)
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.Default()
	}
	if cfg.NodeTimeout <= 0 {
		cfg.NodeTimeout = DefaultNodeTimeout
	}
	if cfg.ForgetBan <= 0 {
		cfg.ForgetBan = DefaultForgetBan
	}
	advertise := advertiseAddr(cfg.Mux.Addr(), cfg.ClientAddr)
	if cfg.AdvertiseBus != "" {
		ap, err := netip.ParseAddrPort(cfg.AdvertiseBus)
		if err != nil || ap.Port() == 0 || ap.Addr().IsUnspecified() {
			return nil, fmt.Errorf("%w: bus address to advertise %q: want a specific ip:port", ErrInvalidAddress, cfg.AdvertiseBus)
		}
		advertise = net.TCPAddrFromAddrPort(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()))
	}
	m := &Membership{
		log: logger, dir: cfg.Dir, started: time.Now().UnixMilli(), client: cfg.ClientAddr, secret: cfg.Secret, ban: cfg.ForgetBan,
		advertise: advertise,
		onChange:  cfg.OnChange,
		id:        cfg.ID, timeout: cfg.NodeTimeout, timings: timingsFor(cfg.NodeTimeout),
		peers: map[string]*peerState{}, bans: map[string]forgetBan{}, emitted: map[string]NodeInfo{},
		handshakes: map[string]time.Time{},
		kick:       make(chan struct{}, 1), saveKick: make(chan struct{}, 1), done: make(chan struct{}),
	}
	// Without a secret the bus is open: the TCP transport on the same port
	// says so once at start (one line per node, not one per part).
	var rejoin []string
	if f, ok := m.loadNodesFile(); ok {
		for _, p := range f.Peers {
			ps := &peerState{info: NodeInfo{ID: p.ID, ClientAddr: p.ClientAddr, BusAddr: p.BusAddr,
				Leaving: p.Leaving, Failed: p.Failed}, pending: true}
			m.peers[p.ID] = ps
			rejoin = append(rejoin, p.BusAddr)
		}
	}
	m.gt = newGossipTransport(cfg.Mux, m.advertise, cfg.SourceAddr, logger)
	if cfg.Secret == "" {
		// Without a secret anyone can claim any address anyway; with one,
		// only what memberlist decrypted counts as a sign of life.
		m.gt.heard = m.heardFrom
	}
	list, err := m.newList()
	if err != nil {
		m.gt.close()
		return nil, err
	}
	m.list = list
	m.wg.Add(2)
	go m.run()
	go m.saveLoop()
	m.markDirty()
	if len(rejoin) > 0 {
		m.startRejoin(rejoin)
	}
	return m, nil
}

// advertiseAddr is the bus address other nodes reach us at: the mux's,
// unless it listens on every interface, then the client address's IP, or
// a private IP of this machine.
func advertiseAddr(bus *net.TCPAddr, client string) *net.TCPAddr {
	a := &net.TCPAddr{IP: bus.IP, Port: bus.Port}
	if a.IP != nil && !a.IP.IsUnspecified() {
		return a
	}
	host, _, _ := net.SplitHostPort(client)
	if ip := net.ParseIP(host); ip != nil && !ip.IsUnspecified() {
		a.IP = ip
		return a
	}
	if s, err := sockaddr.GetPrivateIP(); err == nil && s != "" {
		if ip := net.ParseIP(s); ip != nil {
			a.IP = ip
			return a
		}
	}
	a.IP = net.IPv4(127, 0, 0, 1)
	return a
}

// newList creates a memberlist instance for the current id and timings.
// Called under listMu (or before m is shared).
func (m *Membership) newList() (*memberlist.Memberlist, error) {
	m.mu.Lock()
	m.gen++
	gen, id, timings := m.gen, m.id, m.timings
	m.mu.Unlock()
	c := memberlist.DefaultLANConfig()
	c.Name = id
	c.BindAddr = m.advertise.IP.String()
	c.BindPort = m.advertise.Port
	c.AdvertiseAddr = c.BindAddr
	c.AdvertisePort = c.BindPort
	c.Transport = gossipShim{m.gt}
	timings.apply(c)
	// A node back after a death, at a new address, takes its entry back at
	// once (Disque keeps ids across address changes).
	c.DeadNodeReclaimTime = time.Millisecond
	d := &gossipDelegate{m: m, gen: gen}
	c.Delegate, c.Events, c.Alive, c.Ping = d, d, d, d
	c.Logger = log.New(&memberlistLog{log: m.log}, "", 0)
	if m.secret != "" {
		c.SecretKey = gossipKey(m.secret)
	}
	list, err := memberlist.Create(c)
	if err != nil {
		return nil, fmt.Errorf("replication: start memberlist: %w", err)
	}
	return list, nil
}

// Meet joins the node whose client port is given: its bus port is
// clientPort+10000 (a node with another cluster-bus-port is met with
// MeetBus). Gossip does the rest.
func (m *Membership) Meet(ip string, clientPort int) error {
	if net.ParseIP(ip) == nil || clientPort <= 0 || clientPort+10000 > 65535 {
		return fmt.Errorf("%w: %s:%d", ErrInvalidAddress, ip, clientPort)
	}
	return m.meet(joinHostPort(ip, clientPort), joinHostPort(ip, clientPort+10000))
}

// MeetBus joins the node whose bus port is given (CLUSTER MEET ip port
// busport).
func (m *Membership) MeetBus(ip string, busPort int) error {
	if net.ParseIP(ip) == nil || busPort <= 0 || busPort > 65535 {
		return fmt.Errorf("%w: %s:%d", ErrInvalidAddress, ip, busPort)
	}
	return m.meet("", joinHostPort(ip, busPort))
}

func (m *Membership) meet(client, bus string) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrMembershipClosed
	}
	// An explicit MEET lifts a FORGET ban on the node at that address,
	// and Reset's quarantine: the node wants a cluster again.
	for id, b := range m.bans {
		if b.bus == bus || b.reset {
			delete(m.bans, id)
		}
	}
	m.mu.Unlock()
	m.listMu.RLock()
	_, err := m.list.Join([]string{bus})
	m.listMu.RUnlock()
	if err != nil {
		m.mu.Lock()
		retrying := !m.closed
		if retrying {
			m.handshakes[bus] = time.Now().Add(max(m.timeout, time.Second))
		}
		m.mu.Unlock()
		return &MeetError{ClientAddr: client, BusAddr: bus, Err: unwrapJoinError(err), Retrying: retrying}
	}
	return nil
}

// handshakeEvery is how often a MEET that failed is tried again.
const handshakeEvery = time.Second

// retryHandshakes joins, in the background, the addresses of the MEETs
// that failed and have not timed out; those that did are dropped, logged.
func (m *Membership) retryHandshakes(now time.Time) {
	m.mu.Lock()
	var addrs []string
	for bus, until := range m.handshakes {
		if now.After(until) {
			delete(m.handshakes, bus)
			m.log.Warn("replication: CLUSTER MEET: no node answered at this cluster bus address; gave up", "bus", bus)
			continue
		}
		addrs = append(addrs, bus)
	}
	m.mu.Unlock()
	if len(addrs) > 0 {
		m.startRejoin(addrs)
	}
}

// unwrapJoinError shortens memberlist's multierror ("1 error occurred:\n\t*
// failed to join …") to its first cause, on one line.
func unwrapJoinError(err error) error {
	s := err.Error()
	if i := strings.Index(s, "* "); i >= 0 {
		s = s[i+2:]
	}
	s = strings.TrimSpace(strings.ReplaceAll(s, "\n", " "))
	return errors.New(s)
}

// Nodes is every known node, self first, then by id.
func (m *Membership) Nodes() []NodeInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	out := []NodeInfo{m.selfLocked()}
	for _, p := range m.sortedPeersLocked() {
		out = append(out, m.infoLocked(p, now))
	}
	return out
}

// NodeCount is len(Nodes()) without building the list: ADDJOB's default
// REPLICATE and every ACKJOB's Clustered read it.
func (m *Membership) NodeCount() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.peers) + 1
}

// Reachable is every other node neither suspected nor failed: seen alive
// by this memberlist instance, or pending — known from the nodes file (or
// from before SetNodeTimeout recreated memberlist) and not yet found dead
// by the rejoin. Disque too counts the nodes of its nodes file reachable
// at once: a node restarted after a crash replicates a new job at once
// (REPLJOB to a pending node that is in fact down is answered by nobody,
// and ADDJOB adds another node while short).
func (m *Membership) Reachable() []NodeInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var out []NodeInfo
	for _, p := range m.sortedPeersLocked() {
		if n := m.infoLocked(p, now); (p.inList || p.pending) && !n.Suspect && !n.Failed {
			out = append(out, n)
		}
	}
	return out
}

// ID is this node's id (Reset may change it).
func (m *Membership) ID() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.id
}

func (m *Membership) selfLocked() NodeInfo {
	return NodeInfo{ID: m.id, ClientAddr: m.client, BusAddr: m.advertise.String(), Myself: true, Leaving: m.leaving}
}

func (m *Membership) sortedPeersLocked() []*peerState {
	ps := make([]*peerState, 0, len(m.peers))
	for _, p := range m.peers {
		ps = append(ps, p)
	}
	slices.SortFunc(ps, func(a, b *peerState) int { return strings.Compare(a.info.ID, b.info.ID) })
	return ps
}

// infoLocked is p's NodeInfo now: "fail?" when it answered nothing for
// SuspectAfter; "fail" also when a node memberlist cannot tell us about
// (relearned) answered nothing for twice the node timeout.
func (m *Membership) infoLocked(p *peerState, now time.Time) NodeInfo {
	n := p.info
	if p.inList && !n.Failed && !p.lastPong.IsZero() {
		silent := now.Sub(p.lastPong)
		n.Suspect = silent > m.timings.SuspectAfter
		if p.relearned && silent > 2*m.timeout {
			n.Suspect, n.Failed = false, true
		}
	}
	if !p.pingSent.IsZero() {
		n.PingSentMs = p.pingSent.UnixMilli()
	}
	if !p.lastPong.IsZero() {
		n.PongRecvMs = p.lastPong.UnixMilli()
	}
	return n
}

// Forget removes the node; gossip does not re-add it for ForgetBan.
func (m *Membership) Forget(id string) error {
	if !storage.ValidNodeID(id) {
		return ErrInvalidNodeID
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if id == m.id {
		return ErrForgetMyself
	}
	p := m.peers[id]
	if p == nil {
		return fmt.Errorf("%w %s", ErrUnknownNode, id)
	}
	delete(m.peers, id)
	m.bans[id] = forgetBan{until: time.Now().Add(m.ban), bus: p.info.BusAddr}
	m.kickLocked()
	return nil
}

// bannedLocked reports whether id is under a FORGET ban, dropping an
// expired one.
func (m *Membership) bannedLocked(id string, now time.Time) bool {
	b, ok := m.bans[id]
	if !ok {
		return false
	}
	if now.Before(b.until) {
		return true
	}
	delete(m.bans, id)
	return false
}

// Reset forgets every node: it tells the cluster it is leaving, stops its
// memberlist instance and starts a new one that knows nobody; newID != ""
// takes a new id. OnChange reports every peer gone.
func (m *Membership) Reset(newID string) error {
	if newID != "" && !storage.ValidNodeID(newID) {
		return fmt.Errorf("%w: %q", ErrInvalidNodeID, newID)
	}
	m.listMu.Lock()
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.listMu.Unlock()
		return ErrMembershipClosed
	}
	m.resetting = true
	leaveTimeout := m.timings.TCPTimeout
	m.mu.Unlock()
	// The "reset" flag makes peers forget us at once; the leave marks us
	// left in memberlist so nobody gossips to the new instance.
	if err := m.list.UpdateNode(leaveTimeout); err != nil {
		m.log.Debug("replication: reset: announcing the reset", "err", err)
	}
	if err := m.list.Leave(leaveTimeout); err != nil {
		m.log.Debug("replication: reset: leaving the cluster", "err", err)
	}
	m.list.Shutdown()
	m.mu.Lock()
	// Gossip already on its way (sent before the peers saw us leave)
	// would teach the new instance the old cluster again: keep the old
	// peers, and our old id, out for a moment (a MEET lifts it).
	until := time.Now().Add(resetQuarantine)
	bans := map[string]forgetBan{m.id: {until: until, bus: m.advertise.String(), reset: true}}
	for id, p := range m.peers {
		bans[id] = forgetBan{until: until, bus: p.info.BusAddr, reset: true}
	}
	m.peers, m.bans = map[string]*peerState{}, bans
	m.handshakes = map[string]time.Time{}
	m.rejoinQueue = nil // the old nodes' addresses
	if newID != "" {
		m.id = newID
	}
	m.resetting = false
	m.mu.Unlock()
	list, err := m.newList()
	if err != nil {
		m.listMu.Unlock()
		return err
	}
	m.list = list
	m.listMu.Unlock()
	m.mu.Lock()
	m.kickLocked()
	m.mu.Unlock()
	return m.SaveConfig()
}

// SetLeaving sets this node's leaving flag and gossips it.
func (m *Membership) SetLeaving(on bool) error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return ErrMembershipClosed
	}
	changed := m.leaving != on
	m.leaving = on
	timeout := m.timings.TCPTimeout
	m.mu.Unlock()
	if !changed {
		return nil
	}
	m.markDirty()
	m.listMu.RLock()
	defer m.listMu.RUnlock()
	if err := m.list.UpdateNode(timeout); err != nil {
		// The flag is set and will spread with the next gossip or
		// push/pull; only the wait for the first broadcast timed out.
		m.log.Debug("replication: gossiping the leaving flag", "err", err)
	}
	return nil
}

// Leaving reports this node's leaving flag.
func (m *Membership) Leaving() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.leaving
}

// SetNodeTimeout applies a new cluster-node-timeout at once. memberlist
// reads its timings without locks (and its tickers keep the old ones), so
// the instance is recreated under the same id and rejoins every known
// peer; the nodes are kept meanwhile.
func (m *Membership) SetNodeTimeout(d time.Duration) {
	if d <= 0 {
		return
	}
	m.listMu.Lock()
	defer m.listMu.Unlock()
	m.mu.Lock()
	if m.closed || d == m.timeout {
		m.mu.Unlock()
		return
	}
	m.timeout, m.timings = d, timingsFor(d)
	var rejoin []string
	for _, p := range m.peers {
		if p.inList {
			p.inList, p.pending = false, true
		}
		rejoin = append(rejoin, p.info.BusAddr)
	}
	m.mu.Unlock()
	m.list.Shutdown()
	list, err := m.newList()
	if err != nil {
		// Cannot happen with our transport (memberlist.Create binds
		// nothing); keep the old instance's goroutines stopped, log.
		m.log.Error("replication: recreating memberlist for a new node timeout", "err", err)
		return
	}
	m.list = list
	m.mu.Lock()
	m.kickLocked()
	m.mu.Unlock()
	m.startRejoin(rejoin)
}

// Stats counts gossip packets and streams sent and received.
func (m *Membership) Stats() (messagesSent, messagesReceived int64) {
	return m.gt.sent.Load(), m.gt.received.Load()
}

// Close stops gossip without leaving the cluster (peers see this node
// fail, as after a kill, and see it back when it restarts), and writes the
// nodes file.
func (m *Membership) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.done)
	m.mu.Unlock()
	m.listMu.Lock()
	m.list.Shutdown()
	m.listMu.Unlock()
	m.gt.close()
	m.wg.Wait()
	return m.SaveConfig()
}

// kickLocked wakes run to emit OnChange and mark the nodes file dirty.
func (m *Membership) kickLocked() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// run is the membership's loop: every probe interval it pings the peers
// (our "fail?" evidence) and retries failed ones; on every change it tells
// OnChange and schedules a nodes-file write.
func (m *Membership) run() {
	defer m.wg.Done()
	timer := time.NewTimer(0)
	defer timer.Stop()
	var lastRejoin, lastHandshake time.Time
	for {
		select {
		case <-m.done:
			return
		case <-m.kick:
			m.emit()
		case <-timer.C:
			m.mu.Lock()
			timings := m.timings
			rejoinEvery := clampDuration(m.timeout, time.Second, 10*time.Second)
			m.mu.Unlock()
			m.probePeers()
			if time.Since(lastRejoin) >= rejoinEvery {
				lastRejoin = time.Now()
				m.rejoinFailed()
			}
			if time.Since(lastHandshake) >= handshakeEvery {
				lastHandshake = time.Now()
				m.retryHandshakes(lastHandshake)
			}
			m.emit()
			timer.Reset(timings.ProbeInterval)
		}
	}
}

// emit tells OnChange what changed since it was last told, and marks the
// nodes file dirty when something it holds changed.
func (m *Membership) emit() {
	type change struct {
		n    NodeInfo
		gone bool
	}
	var changes []change
	dirty := false
	m.mu.Lock()
	now := time.Now()
	for _, p := range m.sortedPeersLocked() {
		n := m.infoLocked(p, now)
		old, ok := m.emitted[n.ID]
		flagsOnly := ok && old.ClientAddr == n.ClientAddr && old.BusAddr == n.BusAddr &&
			old.Failed == n.Failed && old.Leaving == n.Leaving
		if flagsOnly && old.Suspect == n.Suspect {
			continue
		}
		if !flagsOnly {
			dirty = true
		}
		m.emitted[n.ID] = n
		changes = append(changes, change{n: n})
	}
	for id, n := range m.emitted {
		if _, ok := m.peers[id]; !ok {
			delete(m.emitted, id)
			changes = append(changes, change{n: n, gone: true})
			dirty = true
		}
	}
	m.mu.Unlock()
	if dirty {
		m.markDirty()
	}
	if m.onChange != nil {
		for _, c := range changes {
			m.onChange(c.n, c.gone)
		}
	}
}

// probePeers pings every peer memberlist has alive that no ping is out to.
func (m *Membership) probePeers() {
	m.mu.Lock()
	now := time.Now()
	type target struct{ id, bus string }
	var targets []target
	for _, p := range m.peers {
		if p.inList && !p.info.Failed && !p.pinging {
			p.pinging = true
			if p.pingSent.IsZero() {
				p.pingSent = now
			}
			targets = append(targets, target{p.info.ID, p.info.BusAddr})
		}
	}
	m.mu.Unlock()
	if len(targets) == 0 {
		return
	}
	m.listMu.RLock()
	list := m.list
	m.listMu.RUnlock()
	for _, t := range targets {
		addr, err := parsePeerAddr(t.bus) // never a DNS lookup
		if err != nil {
			m.pingDone(t.id, false)
			continue
		}
		m.wg.Add(1)
		go func() {
			defer m.wg.Done()
			// A Ping on an instance that was shut down meanwhile just
			// times out: the transport outlives it.
			_, err := list.Ping(t.id, addr)
			m.pingDone(t.id, err == nil)
		}()
	}
}

func (m *Membership) pingDone(id string, ok bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.peers[id]
	if p == nil {
		return
	}
	p.pinging = false
	if ok {
		p.pongLocked(time.Now())
	}
}

func (p *peerState) pongLocked(now time.Time) {
	p.lastPong = now
	p.pingSent = time.Time{}
}

// heardFrom records a packet from the node at bus address addr as a sign
// of life (open bus only).
func (m *Membership) heardFrom(addr string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.peers {
		if p.info.BusAddr == addr && p.inList && !p.info.Failed {
			p.pongLocked(time.Now())
			return
		}
	}
}

// rejoinFailed tries, in the background, to join the failed peers again:
// the way two nodes that both restarted while the other was down find each
// other, and a node back at its old address is seen at once.
func (m *Membership) rejoinFailed() {
	m.mu.Lock()
	var addrs []string
	for _, p := range m.peers {
		if p.info.Failed {
			addrs = append(addrs, p.info.BusAddr)
		}
	}
	m.mu.Unlock()
	if len(addrs) > 0 {
		m.startRejoin(addrs)
	}
}

// startRejoin joins addrs on a goroutine (one at a time); once no address
// is left to join, every pending peer memberlist still does not have is
// failed. Addresses given while a rejoin runs join its queue (they were
// dropped: a recreated instance's rejoin of every peer, asked while the
// old instance's ran, never happened, and its pending peers were failed),
// and each join uses the memberlist instance current when it starts.
func (m *Membership) startRejoin(addrs []string) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return
	}
	m.rejoinQueue = append(m.rejoinQueue, addrs...)
	if m.joining {
		m.mu.Unlock()
		return
	}
	m.joining = true
	// Under mu, with closed false: Close's wg.Wait cannot have begun.
	m.wg.Add(1)
	m.mu.Unlock()
	go m.runRejoin()
}

// runRejoin is startRejoin's goroutine: it joins the queued addresses,
// each once per batch, until the queue is empty.
func (m *Membership) runRejoin() {
	defer m.wg.Done()
	for {
		m.mu.Lock()
		batch := m.rejoinQueue
		m.rejoinQueue = nil
		if len(batch) == 0 || m.closed {
			m.joining = false
			if !m.closed {
				for _, p := range m.peers {
					if p.pending && !p.inList {
						p.pending, p.info.Failed = false, true
						if p.pingSent.IsZero() {
							p.pingSent = time.Now()
						}
					}
				}
				m.kickLocked()
			}
			m.mu.Unlock()
			return
		}
		m.mu.Unlock()
		slices.Sort(batch)
		for _, a := range slices.Compact(batch) {
			select {
			case <-m.done:
				continue // the next turn ends the rejoin
			default:
			}
			m.listMu.RLock()
			list := m.list
			m.listMu.RUnlock()
			if _, err := list.Join([]string{a}); err != nil {
				m.log.Debug("replication: rejoining a known node", "bus", a, "err", unwrapJoinError(err))
			}
		}
	}
}

// markDirty schedules a nodes-file write.
func (m *Membership) markDirty() {
	select {
	case m.saveKick <- struct{}{}:
	default:
	}
}

// saveMinInterval is the least time between two nodes-file writes: a change
// is written at once unless the last write was less than this ago, and the
// changes made meanwhile are written together. It is short because until
// the write a kill -9 loses what changed: with 250 ms, counted from the
// write at start, a node killed a moment after the MEETs that built its
// cluster restarted knowing nobody. A write is ~100 bytes and two fsyncs,
// so even flapping membership costs at most 50 small writes a second.
const saveMinInterval = 20 * time.Millisecond

func (m *Membership) saveLoop() {
	defer m.wg.Done()
	for {
		select {
		case <-m.done:
			return
		case <-m.saveKick:
		}
		if err := m.SaveConfig(); err != nil {
			m.log.Warn("replication: writing the nodes file", "err", err)
		}
		select {
		case <-m.done:
			return
		case <-time.After(saveMinInterval):
		}
	}
}

// SaveConfig writes the nodes file now (atomically, fsynced).
func (m *Membership) SaveConfig() error {
	if m.dir == "" {
		return nil
	}
	m.saveMu.Lock()
	defer m.saveMu.Unlock()
	m.mu.Lock()
	f := nodesFile{Self: m.selfLocked()}
	for _, p := range m.sortedPeersLocked() {
		f.Peers = append(f.Peers, p.info)
	}
	m.mu.Unlock()
	if err := durable.WriteFile(vfs.Default, filepath.Join(m.dir, NodesFileName), f.encode(), 0o644); err != nil {
		return fmt.Errorf("replication: write the nodes file: %w", err)
	}
	return nil
}

// loadNodesFile reads the nodes file; a missing, damaged or foreign one
// is logged and yields no peers (it is a cache).
func (m *Membership) loadNodesFile() (nodesFile, bool) {
	if m.dir == "" {
		return nodesFile{}, false
	}
	path := filepath.Join(m.dir, NodesFileName)
	fh, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nodesFile{}, false
	}
	var data []byte
	if err == nil {
		data, err = io.ReadAll(io.LimitReader(fh, nodesFileMaxSize+1))
		fh.Close()
	}
	if err != nil {
		m.log.Warn("replication: cannot read the nodes file; starting with no known peers", "path", path, "err", err)
		return nodesFile{}, false
	}
	f, err := decodeNodesFile(data)
	if err != nil {
		m.log.Warn("replication: the nodes file is damaged; starting with no known peers (it is rewritten)",
			"path", path, "err", err)
		return nodesFile{}, false
	}
	if f.Self.ID != m.id {
		m.log.Warn("replication: the nodes file belongs to another node id; ignored and rewritten",
			"path", path, "file_id", f.Self.ID, "id", m.id)
		return nodesFile{}, false
	}
	f.Peers = slices.DeleteFunc(f.Peers, func(p NodeInfo) bool { return p.ID == m.id })
	return f, true
}

// gossipDelegate is one memberlist instance's view into Membership; events
// of an instance that was replaced (gen) are ignored. Its methods run
// under memberlist's locks: they take only m.mu and never call memberlist.
type gossipDelegate struct {
	m   *Membership
	gen uint64
}

func (d *gossipDelegate) NodeMeta(limit int) []byte {
	m := d.m
	m.mu.Lock()
	meta := nodeMeta{ID: m.id, ClientAddr: m.client, BusAddr: m.advertise.String(),
		Leaving: m.leaving, Reset: m.resetting, Started: m.started}.encode()
	m.mu.Unlock()
	if len(meta) > limit {
		return nil // cannot happen: ids and addresses are short
	}
	return meta
}

func (d *gossipDelegate) NotifyMsg([]byte)                           {}
func (d *gossipDelegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (d *gossipDelegate) LocalState(join bool) []byte                { return nil }
func (d *gossipDelegate) MergeRemoteState(buf []byte, join bool)     {}

func (d *gossipDelegate) NotifyJoin(n *memberlist.Node)   { d.alive(n, false) }
func (d *gossipDelegate) NotifyUpdate(n *memberlist.Node) { d.alive(n, false) }

// NotifyLeave: memberlist declared the node dead, or it left (Reset).
func (d *gossipDelegate) NotifyLeave(n *memberlist.Node) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if d.gen != m.gen {
		return
	}
	if p := m.peers[n.Name]; p != nil {
		// memberlist tells a leave from a death only internally. A dead
		// node was silent for its whole suspicion (T at least, more than
		// SuspectAfter); one that answered our pings a moment ago
		// left: it reset itself (its "reset" flag can be overtaken by its
		// leave in memberlist's broadcast queue). Forget it.
		if !p.lastPong.IsZero() && time.Since(p.lastPong) <= m.timings.SuspectAfter {
			delete(m.peers, n.Name)
			m.kickLocked()
			return
		}
		p.inList, p.pending, p.info.Failed = false, false, true
		if p.pingSent.IsZero() {
			p.pingSent = time.Now()
		}
		m.kickLocked()
	}
}

// NotifyAlive refuses a FORGET-banned node's alive messages, so gossip
// cannot re-add it, and re-learns a node whose ban expired.
func (d *gossipDelegate) NotifyAlive(n *memberlist.Node) error {
	m := d.m
	m.mu.Lock()
	banned := m.bannedLocked(n.Name, time.Now())
	_, known := m.peers[n.Name]
	m.mu.Unlock()
	if banned {
		return errors.New("forgotten (CLUSTER FORGET) a short while ago")
	}
	if !known {
		d.alive(n, true)
	}
	return nil
}

func (d *gossipDelegate) AckPayload() []byte { return nil }

func (d *gossipDelegate) NotifyPingComplete(other *memberlist.Node, rtt time.Duration, payload []byte) {
	m := d.m
	m.mu.Lock()
	defer m.mu.Unlock()
	if p := m.peers[other.Name]; p != nil && d.gen == m.gen && p.inList {
		p.pongLocked(time.Now())
	}
}

// alive records what memberlist says of a live node. relearn: from an
// alive message alone (NotifyAlive), for a node not in the table.
func (d *gossipDelegate) alive(n *memberlist.Node, relearn bool) {
	m := d.m
	bus := joinHostPort(n.Addr.String(), int(n.Port))
	meta, err := decodeMeta(n.Meta)
	if err != nil || meta.ID != n.Name {
		if err == nil {
			err = errors.New("its metadata names another id")
		}
		m.log.Debug("replication: gossip about a node with bad metadata", "node", n.Name, "err", err)
		meta = nodeMeta{ID: n.Name}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	if d.gen != m.gen || m.closed || n.Name == m.id || m.bannedLocked(n.Name, now) || !storage.ValidNodeID(n.Name) {
		return
	}
	p := m.peers[n.Name]
	if meta.Reset {
		if p != nil {
			delete(m.peers, n.Name)
			m.kickLocked()
		}
		return
	}
	if p == nil {
		p = &peerState{relearned: relearn}
		m.peers[n.Name] = p
	} else if relearn {
		return
	} else {
		p.relearned = false
	}
	p.info = NodeInfo{ID: n.Name, ClientAddr: meta.ClientAddr, BusAddr: bus, Leaving: meta.Leaving}
	p.inList, p.pending = true, false
	delete(m.handshakes, bus) // a MEET retried in the background succeeded
	p.pongLocked(now)
	m.kickLocked()
}

// memberlistLog routes memberlist's log lines into slog at debug level
// (it logs a lot, failed sends to a dead node included); a refused
// decryption — a node with another cluster-secret — is a warning.
type memberlistLog struct{ log *slog.Logger }

func (w *memberlistLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	if strings.Contains(line, "decrypt") || strings.Contains(line, "encryption") {
		w.log.Warn("replication: gossip refused: the other node has another cluster-secret (or none)", "memberlist", line)
	} else {
		w.log.Debug("memberlist: " + line)
	}
	return len(p), nil
}
