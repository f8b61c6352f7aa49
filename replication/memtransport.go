package replication

import (
	"sync"
)

// MemNetwork is an in-memory bus for in-process clusters: each node's
// MemTransport delivers to the others' handlers through a per-link queue
// and goroutine, so a slow handler slows only its own link, as on TCP. It
// passes the same suite as the TCP transport (transport_suite_test.go).
// Cut and Heal make a link drop everything between two nodes, both ways.
//
// A message is for the peer's transport that was reachable when it was
// Sent, as a TCP message is for the connection it was queued on: one Sent
// to a peer that is down or cut off is dropped at once, and one still
// queued when its peer closes (a restart Joins a new transport) or is cut
// off is dropped rather than delivered to the next one or after the Heal
// (doc.go "What is dropped, and when"). Both are counted in Dropped.
type MemNetwork struct {
	mu    sync.Mutex
	nodes map[string]*MemTransport // by node id
	cut   map[[2]string]bool       // ordered pair (min, max)
	cuts  map[[2]string]uint64     // Cuts so far, by pair: a message's link epoch
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{nodes: map[string]*MemTransport{}, cut: map[[2]string]bool{}, cuts: map[[2]string]uint64{}}
}

// memLinkQueue bounds the messages queued on one link, as the TCP
// transport bounds its write queue.
const memLinkQueue = 4096

// Join returns node id's transport; h receives what others send it.
func (n *MemNetwork) Join(id string, h Handler) *MemTransport {
	return n.join(&MemTransport{net: n, id: id, handler: h})
}

// JoinBatch is Join with a BatchHandler: the messages queued on a link
// when its goroutine takes one are delivered with it, as the TCP reader
// delivers the frames it has read together.
func (n *MemNetwork) JoinBatch(id string, h BatchHandler) *MemTransport {
	return n.join(&MemTransport{net: n, id: id, batch: h})
}

func (n *MemNetwork) join(t *MemTransport) *MemTransport {
	id := t.id
	t.peers, t.links = map[string]bool{}, map[string]*memLink{}
	n.mu.Lock()
	n.nodes[id] = t
	n.mu.Unlock()
	return t
}

func pair(a, b string) [2]string {
	if a > b {
		a, b = b, a
	}
	return [2]string{a, b}
}

// Cut drops every message between a and b from now on, both ways.
func (n *MemNetwork) Cut(a, b string) {
	n.mu.Lock()
	n.cut[pair(a, b)] = true
	n.cuts[pair(a, b)]++
	n.mu.Unlock()
}

// Heal undoes Cut.
func (n *MemNetwork) Heal(a, b string) {
	n.mu.Lock()
	delete(n.cut, pair(a, b))
	n.mu.Unlock()
}

// memEnd is where a message is going: the peer's transport and the
// pair's Cut count when it was Sent.
type memEnd struct {
	t    *MemTransport
	cuts uint64
}

// reach returns the transport of to as seen from from, with the pair's
// Cut count, or a nil transport when it is not on the network, closed, or
// cut off. It takes n.mu and then to's mu: callers hold no transport's.
func (n *MemNetwork) reach(from, to string) memEnd {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[pair(from, to)] {
		return memEnd{}
	}
	t := n.nodes[to]
	if t == nil {
		return memEnd{}
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return memEnd{}
	}
	return memEnd{t: t, cuts: n.cuts[pair(from, to)]}
}

// MemTransport is one node's end of a MemNetwork.
type MemTransport struct {
	net     *MemNetwork
	id      string
	handler Handler      // one of handler and batch is set
	batch   BatchHandler // (JoinBatch)

	mu     sync.Mutex
	peers  map[string]bool
	links  map[string]*memLink // by destination
	closed bool
	stats  TransportStats
}

var _ Transport = (*MemTransport)(nil)

// memLink is the ordered queue from one node to another, drained by its
// own goroutine into the receiver's handler.
type memLink struct {
	ch   chan memMsg
	stop chan struct{}
	done chan struct{}
}

// memMsg is a queued message and the transport it is for.
type memMsg struct {
	Message
	to memEnd
}

// SetPeer implements Transport (the address is not used).
func (t *MemTransport) SetPeer(id, _ string) {
	if id == t.id {
		return
	}
	t.mu.Lock()
	t.peers[id] = true
	t.mu.Unlock()
}

// RemovePeer implements Transport.
func (t *MemTransport) RemovePeer(id string) {
	t.mu.Lock()
	delete(t.peers, id)
	l := t.links[id]
	delete(t.links, id)
	t.mu.Unlock()
	if l != nil {
		close(l.stop)
		<-l.done
	}
}

// Send implements Transport.
func (t *MemTransport) Send(id string, m Message) error {
	// Before t.mu: reach takes the peer's mu, and the peer may be
	// Sending to us.
	to := t.net.reach(t.id, id)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrTransportClosed
	}
	if !t.peers[id] {
		return ErrUnknownPeer
	}
	if to.t == nil {
		t.stats.Dropped++ // down or cut off: no link to wait on
		return nil
	}
	l := t.links[id]
	if l == nil {
		l = &memLink{ch: make(chan memMsg, memLinkQueue), stop: make(chan struct{}), done: make(chan struct{})}
		t.links[id] = l
		go t.drain(id, l)
	}
	m.Payload = append([]byte(nil), m.Payload...)
	select {
	case l.ch <- memMsg{Message: m, to: to}:
		t.stats.MessagesSent++
		t.stats.BytesSent += int64(len(m.Payload)) + 1
		return nil
	default:
		t.stats.Dropped++
		return ErrLinkFull
	}
}

// drain delivers one link's messages in order; those for a peer's
// transport that is no longer the one reachable (it closed, restarted, or
// was cut off since) are dropped, as on a broken TCP link.
func (t *MemTransport) drain(to string, l *memLink) {
	defer close(l.done)
	for {
		select {
		case <-l.stop:
			return
		case m := <-l.ch:
			end := t.net.reach(t.id, to)
			stale := 0
			var batch []Message
			bytes := 0
			take := func(m memMsg) {
				if m.to != end || end.t == nil {
					stale++
					return
				}
				batch, bytes = append(batch, m.Message), bytes+len(m.Payload)
			}
			take(m)
		more:
			for len(batch) < maxBatchMessages && bytes < maxBatchBytes {
				select {
				case m := <-l.ch:
					take(m)
				default:
					break more
				}
			}
			if stale > 0 {
				t.mu.Lock()
				t.stats.Dropped += int64(stale)
				t.mu.Unlock()
			}
			dst := end.t
			if len(batch) == 0 {
				continue
			}
			dst.mu.Lock()
			dst.stats.MessagesReceived += int64(len(batch))
			dst.stats.BytesReceived += int64(bytes + len(batch))
			dst.mu.Unlock()
			if dst.batch != nil {
				dst.batch(t.id, batch)
				continue
			}
			for _, m := range batch {
				dst.handler(t.id, m)
			}
		}
	}
}

// Connected implements Transport: the peer is on the network, open and not
// cut off.
func (t *MemTransport) Connected(id string) bool {
	t.mu.Lock()
	known := t.peers[id] && !t.closed
	t.mu.Unlock()
	return known && t.net.reach(t.id, id).t != nil
}

// Stats implements Transport.
func (t *MemTransport) Stats() TransportStats {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats
}

// Close implements Transport: it leaves the network.
func (t *MemTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	links := t.links
	t.links = map[string]*memLink{}
	t.mu.Unlock()
	for _, l := range links {
		close(l.stop)
		<-l.done
	}
	t.net.mu.Lock()
	if t.net.nodes[t.id] == t {
		delete(t.net.nodes, t.id)
	}
	t.net.mu.Unlock()
	return nil
}
