package replication

import (
	"sync"
)

// MemNetwork is an in-memory bus for in-process clusters: each node's
// MemTransport delivers to the others' handlers through a per-link queue
// and goroutine, so a slow handler slows only its own link, as on TCP. It
// passes the same suite as the TCP transport (transport_suite_test.go).
// Cut and Heal make a link drop everything between two nodes, both ways.
type MemNetwork struct {
	mu    sync.Mutex
	nodes map[string]*MemTransport // by node id
	cut   map[[2]string]bool       // ordered pair (min, max)
}

// NewMemNetwork returns an empty network.
func NewMemNetwork() *MemNetwork {
	return &MemNetwork{nodes: map[string]*MemTransport{}, cut: map[[2]string]bool{}}
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
	n.mu.Unlock()
}

// Heal undoes Cut.
func (n *MemNetwork) Heal(a, b string) {
	n.mu.Lock()
	delete(n.cut, pair(a, b))
	n.mu.Unlock()
}

// reach returns the transport of to as seen from from, or nil when it is
// not on the network, closed, or cut off.
func (n *MemNetwork) reach(from, to string) *MemTransport {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cut[pair(from, to)] {
		return nil
	}
	t := n.nodes[to]
	if t == nil {
		return nil
	}
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil
	}
	return t
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
	ch   chan Message
	stop chan struct{}
	done chan struct{}
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
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return ErrTransportClosed
	}
	if !t.peers[id] {
		return ErrUnknownPeer
	}
	l := t.links[id]
	if l == nil {
		l = &memLink{ch: make(chan Message, memLinkQueue), stop: make(chan struct{}), done: make(chan struct{})}
		t.links[id] = l
		go t.drain(id, l)
	}
	m.Payload = append([]byte(nil), m.Payload...)
	select {
	case l.ch <- m:
		t.stats.MessagesSent++
		t.stats.BytesSent += int64(len(m.Payload)) + 1
		return nil
	default:
		t.stats.Dropped++
		return ErrLinkFull
	}
}

// drain delivers one link's messages in order; those to a peer that is
// down or cut off are lost, as on a broken TCP link.
func (t *MemTransport) drain(to string, l *memLink) {
	defer close(l.done)
	for {
		select {
		case <-l.stop:
			return
		case m := <-l.ch:
			batch := []Message{m}
			bytes := len(m.Payload)
		more:
			for len(batch) < maxBatchMessages && bytes < maxBatchBytes {
				select {
				case m := <-l.ch:
					batch, bytes = append(batch, m), bytes+len(m.Payload)
				default:
					break more
				}
			}
			dst := t.net.reach(t.id, to)
			if dst == nil {
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
	return known && t.net.reach(t.id, id) != nil
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
