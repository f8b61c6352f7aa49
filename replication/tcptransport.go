package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// TCPConfig configures a TCPTransport. Zero fields take the default given
// in their comment.
type TCPConfig struct {
	// ID is this node's id (required; 1–64 printable characters, ours are
	// 40 hex).
	ID string
	// Mux is the bus port (required): the transport registers KindBus on
	// it. The caller runs Serve and closes it after the transport.
	Mux *PortMux
	// Secret is cluster-secret: "" leaves the bus open (logged at start).
	Secret string
	// SourceAddr, if valid, is the source address of every link this
	// transport dials (dial_source.go); the zero Addr lets the OS choose.
	SourceAddr netip.Addr
	// Handler receives every message from every peer (required unless
	// BatchHandler is set).
	Handler Handler
	// BatchHandler, if set, receives the messages instead of Handler: the
	// frames of a link already in its read buffer together (at least one;
	// see BatchHandler).
	BatchHandler BatchHandler
	// Logger defaults to slog.Default().
	Logger *slog.Logger

	// MaxFrame bounds one message's payload, compressed or not, both ways.
	// Default DefaultMaxFrame (a max-job-size body and its fields).
	MaxFrame int
	// QueueBytes bounds the payload bytes waiting on one link (while it is
	// down or slow); beyond it Send returns ErrLinkFull. A message larger
	// than the bound is still taken when the queue is empty. Default 16 MiB.
	QueueBytes int
	// CompressAbove: payloads longer than this are s2-compressed (when that
	// makes them smaller). Default 256; negative: never.
	CompressAbove int
	// DialTimeout bounds a connect; HandshakeTimeout the whole handshake
	// (on either side). Defaults 3 s and 5 s.
	DialTimeout, HandshakeTimeout time.Duration
	// WriteTimeout bounds one batch's write: a peer that stops reading
	// breaks its link instead of holding the writer. Default 15 s.
	WriteTimeout time.Duration
	// DownQueueTimeout bounds how long a message queued while no
	// connection to its peer is up waits for one: when a connection comes
	// up, what was queued longer ago is dropped (counted in Dropped). Its
	// job is the first dial after SetPeer and the quick redial after a
	// peer restarts; a failed attempt and a broken connection drop the
	// queue anyway (doc.go "What is dropped, and when" says why 1 s).
	// Default 1 s.
	DownQueueTimeout time.Duration
	// BackoffMin and BackoffMax bound the redial delay after a failure:
	// it starts at BackoffMin and doubles up to BackoffMax, each jittered
	// to between half and all of it. Defaults 100 ms and 3 s.
	BackoffMin, BackoffMax time.Duration
}

// DefaultMaxFrame is the default TCPConfig.MaxFrame: server's default
// max-job-size (64 MiB) plus room for the job's other fields.
const DefaultMaxFrame = 65 << 20

func (c *TCPConfig) withDefaults() (TCPConfig, error) {
	o := *c
	switch {
	case !validLinkID(o.ID):
		return o, fmt.Errorf("replication: TCPConfig.ID %q is not a node id", o.ID)
	case o.Mux == nil:
		return o, errors.New("replication: TCPConfig.Mux is required")
	case o.Handler == nil && o.BatchHandler == nil:
		return o, errors.New("replication: TCPConfig.Handler or BatchHandler is required")
	case o.MaxFrame < 0 || o.QueueBytes < 0 || o.DialTimeout < 0 || o.HandshakeTimeout < 0 ||
		o.WriteTimeout < 0 || o.BackoffMin < 0 || o.BackoffMax < 0 || o.DownQueueTimeout < 0:
		return o, errors.New("replication: TCPConfig limits must not be negative")
	case o.MaxFrame > 1<<31:
		return o, errors.New("replication: TCPConfig.MaxFrame over 2 GiB")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	def := func(v *time.Duration, d time.Duration) {
		if *v == 0 {
			*v = d
		}
	}
	if o.MaxFrame == 0 {
		o.MaxFrame = DefaultMaxFrame
	}
	if o.QueueBytes == 0 {
		o.QueueBytes = 16 << 20
	}
	if o.CompressAbove == 0 {
		o.CompressAbove = 256
	}
	def(&o.DialTimeout, 3*time.Second)
	def(&o.HandshakeTimeout, 5*time.Second)
	def(&o.WriteTimeout, 15*time.Second)
	def(&o.DownQueueTimeout, time.Second)
	def(&o.BackoffMin, 100*time.Millisecond)
	def(&o.BackoffMax, 3*time.Second)
	o.BackoffMax = max(o.BackoffMax, o.BackoffMin)
	return o, nil
}

// ErrMessageTooLarge: Send of a payload over TCPConfig.MaxFrame.
var ErrMessageTooLarge = errors.New("replication: message larger than the bus frame limit")

// TCPTransport is the Transport of the bus port (doc.go "TCP links"). Each
// direction of a peer pair has its own connection: the node that sends
// dials, the node that receives accepts, so a link's ordering and its
// reconnects belong to one side. All methods are safe for concurrent use.
type TCPTransport struct {
	cfg TCPConfig
	log *slog.Logger
	lim *logLimiter
	// id is this node's id in handshakes: cfg.ID until SetID (CLUSTER
	// RESET HARD) gives another.
	id atomic.Pointer[string]
	// now is the clock of the queue's DownQueueTimeout (time.Now; tests
	// set another before the first SetPeer).
	now func() time.Time

	ctx    context.Context // cancelled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine: link writers, watchers, inbound readers

	// mu guards the maps and closed; never held across I/O or a wait.
	mu       sync.Mutex
	closed   bool
	links    map[string]*tcpLink     // outbound, by peer id
	inbound  map[string]*inboundConn // the current accepted link, by peer id
	accepted map[net.Conn]struct{}   // every accepted connection, handshaking or reading

	stats struct {
		msgsSent, msgsRecv, bytesSent, bytesRecv, dropped atomic.Int64
		writes                                            atomic.Int64 // write system calls on sending links
	}
}

var _ Transport = (*TCPTransport)(nil)

// NewTCPTransport registers KindBus on cfg.Mux and returns the transport.
func NewTCPTransport(cfg TCPConfig) (*TCPTransport, error) {
	o, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	t := &TCPTransport{cfg: o, log: o.Logger, lim: newLogLimiter(10 * time.Second),
		ctx: ctx, cancel: cancel, now: time.Now, links: map[string]*tcpLink{},
		inbound: map[string]*inboundConn{}, accepted: map[net.Conn]struct{}{}}
	if o.Secret == "" {
		t.log.Warn("replication: the cluster bus is open: no cluster-secret, peers are not authenticated",
			"bus", o.Mux.Addr().String())
	}
	t.id.Store(&o.ID)
	o.Mux.Handle(KindBus, t.accept)
	return t, nil
}

// ID is the node id this transport gives in its handshakes.
func (t *TCPTransport) ID() string { return *t.id.Load() }

// SetID makes this node id (CLUSTER RESET HARD took a new one) and closes
// every sending link: a peer knows the node by its new id only, and the
// links' handshakes named the old one. Membership's reset has forgotten
// every peer already, and its next MEET names them again (SetPeer).
func (t *TCPTransport) SetID(id string) error {
	if !validLinkID(id) {
		return fmt.Errorf("replication: %q is not a node id", id)
	}
	t.id.Store(&id)
	t.mu.Lock()
	ids := make([]string, 0, len(t.links))
	for peer := range t.links {
		ids = append(ids, peer)
	}
	t.mu.Unlock()
	for _, peer := range ids {
		t.RemovePeer(peer)
	}
	return nil
}

// SetPeer implements Transport. The link is dialled at once (not at the
// first Send), so Connected reports on every known peer, as CLUSTER NODES
// needs. A new address makes the link redial at once; what is queued while
// no connection is up is kept for it (the messages are for the node, not
// the address), but a connection to the old address that it closes drops
// what was queued for that connection, as any broken one does.
func (t *TCPTransport) SetPeer(id, addr string) {
	if id == t.ID() {
		return // we do not dial ourselves: the acceptor would refuse it
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	if l := t.links[id]; l != nil {
		l.setAddr(addr)
		return
	}
	t.links[id] = startTCPLink(t, id, addr)
}

// RemovePeer implements Transport: it closes the sending link to id, drops
// what is queued on it and waits for its goroutines. Messages id sends us
// are still accepted.
func (t *TCPTransport) RemovePeer(id string) {
	t.mu.Lock()
	l := t.links[id]
	delete(t.links, id)
	t.mu.Unlock()
	if l != nil {
		l.stop()
	}
}

// Send implements Transport: it copies m onto id's queue and wakes the
// link's writer.
func (t *TCPTransport) Send(id string, m Message) error {
	if len(m.Payload) > t.cfg.MaxFrame {
		return ErrMessageTooLarge
	}
	if m.Type == 0 {
		return errors.New("replication: message type 0 is not sent")
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return ErrTransportClosed
	}
	l := t.links[id]
	t.mu.Unlock()
	if l == nil {
		return ErrUnknownPeer
	}
	err := l.enqueue(m)
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrLinkFull):
		t.stats.dropped.Add(1)
	case errors.Is(err, errLinkStopped):
		t.mu.Lock()
		closed := t.closed
		t.mu.Unlock()
		if closed {
			return ErrTransportClosed
		}
		return ErrUnknownPeer
	}
	return err
}

// Connected implements Transport: the sending link to id is up (dialled,
// handshake done, not broken since).
func (t *TCPTransport) Connected(id string) bool {
	t.mu.Lock()
	l := t.links[id]
	t.mu.Unlock()
	return l != nil && l.up.Load()
}

// Stats implements Transport. Messages and bytes are counted as framed on
// the wire (bytes after compression, headers included) once written or
// read; Dropped counts Sends refused with ErrLinkFull and the queued
// messages a link dropped: those queued for a connection that broke or an
// attempt that failed, and those that waited over DownQueueTimeout.
func (t *TCPTransport) Stats() TransportStats {
	return TransportStats{
		MessagesSent: t.stats.msgsSent.Load(), MessagesReceived: t.stats.msgsRecv.Load(),
		BytesSent: t.stats.bytesSent.Load(), BytesReceived: t.stats.bytesRecv.Load(),
		Dropped: t.stats.dropped.Load(),
	}
}

// Close implements Transport: it closes every link, outbound and inbound,
// and returns once every goroutine of the transport has. Messages still
// queued are dropped.
func (t *TCPTransport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	links := t.links
	t.links = map[string]*tcpLink{}
	for c := range t.accepted {
		c.Close()
	}
	t.mu.Unlock()
	t.cancel()
	for _, l := range links {
		l.stop()
	}
	t.wg.Wait()
	return nil
}

// inboundConn is an accepted link being read.
type inboundConn struct {
	conn net.Conn
	done chan struct{} // closed when its reader has returned
}

// accept is the PortMux handler for KindBus: it authenticates the dialler
// and then reads its frames into the Handler until the link ends. It runs
// on the PortMux's goroutine for the connection.
func (t *TCPTransport) accept(c net.Conn) {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		c.Close()
		return
	}
	t.accepted[c] = struct{}{}
	t.wg.Add(1)
	t.mu.Unlock()
	defer t.wg.Done()
	defer func() {
		t.mu.Lock()
		delete(t.accepted, c)
		t.mu.Unlock()
		c.Close()
	}()
	remote := c.RemoteAddr().String()

	c.SetDeadline(time.Now().Add(t.cfg.HandshakeTimeout))
	peer, err := acceptHandshake(c, t.ID(), t.cfg.Secret)
	c.SetDeadline(time.Time{})
	if err != nil {
		t.logHandshakeError("replication: bus connection refused", err, remote)
		return
	}

	// One reader per peer at a time: a redial replaces the link it broke
	// (which we may not have noticed yet), and the Handler sees the peer's
	// messages in order, never from two goroutines.
	me := &inboundConn{conn: c, done: make(chan struct{})}
	defer close(me.done)
	t.mu.Lock()
	old := t.inbound[peer]
	t.inbound[peer] = me
	out := t.links[peer]
	t.mu.Unlock()
	// The peer just reached us, so it is up: our link to it, if waiting
	// out a backoff (up to BackoffMax after the peer was down a while),
	// dials now. Else, for seconds after a restart, what we send it —
	// GOTJOB, GOTACK, DELJOB — was dropped: its ADDJOBs kept adding nodes
	// (a REPLICATE 5 job on all 7) and its acks stayed uncollected.
	// Disque's cron reconnects a link within 100 ms.
	if out != nil {
		out.peerIsUp()
	}
	if old != nil {
		old.conn.Close()
		<-old.done
	}
	defer func() {
		t.mu.Lock()
		if t.inbound[peer] == me {
			delete(t.inbound, peer)
		}
		t.mu.Unlock()
	}()

	br := newBufReader(c)
	fr := &frameReader{r: br, maxFrame: t.cfg.MaxFrame}
	ended := func(err error) {
		if errors.Is(err, errMalformedFrame) {
			t.lim.warn(t.log, "malformed:"+peer, "replication: malformed frame on a bus link; link closed",
				"peer", peer, "remote", remote, "err", err)
		} else if t.ctx.Err() == nil {
			t.log.Debug("replication: inbound bus link ended", "peer", peer, "remote", remote, "err", err)
		}
	}
	for {
		m, wire, err := fr.readFrame()
		if err != nil {
			ended(err)
			return
		}
		t.stats.msgsRecv.Add(1)
		t.stats.bytesRecv.Add(int64(wire))
		if t.cfg.BatchHandler == nil {
			t.cfg.Handler(peer, m)
			continue
		}
		// The frames already read with this one go with it: reading them
		// takes no system call and waits for nothing.
		batch, bytes := []Message{m}, len(m.Payload)
		for len(batch) < maxBatchMessages && bytes < maxBatchBytes && frameBuffered(br) {
			m, wire, err = fr.readFrame()
			if err != nil {
				break // the good ones first; then the link ends
			}
			t.stats.msgsRecv.Add(1)
			t.stats.bytesRecv.Add(int64(wire))
			batch, bytes = append(batch, m), bytes+len(m.Payload)
		}
		t.cfg.BatchHandler(peer, batch)
		if err != nil {
			ended(err)
			return
		}
	}
}

// frameBuffered reports whether br holds a whole frame already (its
// header and as many bytes as the header announces), so that reading it
// waits for nothing. A frame larger than the buffer never is.
func frameBuffered(br *bufio.Reader) bool {
	if br.Buffered() < frameHeaderLen {
		return false
	}
	hdr, err := br.Peek(frameHeaderLen)
	if err != nil {
		return false
	}
	return uint64(br.Buffered()-frameHeaderLen) >= uint64(binary.BigEndian.Uint32(hdr[0:4]))
}

// logHandshakeError logs a failed handshake: refusals (a wrong secret, a
// wrong node) as warnings, rate-limited; network noise at debug level.
func (t *TCPTransport) logHandshakeError(msg string, err error, remote string) {
	if t.ctx.Err() != nil {
		return
	}
	host, _, _ := net.SplitHostPort(remote)
	if errors.Is(err, errRefused) {
		t.lim.warn(t.log, "refused:"+host, msg, "remote", remote, "err", err)
		return
	}
	t.lim.warn(t.log, "handshake:"+host, msg, "remote", remote, "err", err)
}

// backoff returns the jittered delay before redial attempt n (n ≥ 1).
func (t *TCPTransport) backoff(n int) time.Duration {
	d := t.cfg.BackoffMin
	for i := 1; i < n && d < t.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, t.cfg.BackoffMax)
	// Between half and all of d: peers that failed together do not redial
	// together.
	return d/2 + rand.N(d/2+1)
}

// logLimiter lets through one line per key per interval and counts the
// rest, so a peer that keeps failing cannot flood the log. Keys name a
// category and a peer or remote host; past maxLogKeys distinct keys, new
// ones share one, so peer input cannot grow the map without bound.
type logLimiter struct {
	mu    sync.Mutex
	every time.Duration
	last  map[string]time.Time
	held  map[string]int
}

const maxLogKeys = 256

func newLogLimiter(every time.Duration) *logLimiter {
	return &logLimiter{every: every, last: map[string]time.Time{}, held: map[string]int{}}
}

// setInterval changes the interval (tests that read every line).
func (l *logLimiter) setInterval(every time.Duration) {
	l.mu.Lock()
	l.every = every
	l.mu.Unlock()
}

// allow says whether a line for key may be written now, and how many were
// held back since the last one.
func (l *logLimiter) allow(key string) (held int, ok bool) {
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, seen := l.last[key]; !seen && len(l.last) >= maxLogKeys {
		key = "(other)"
	}
	if last, seen := l.last[key]; seen && now.Sub(last) < l.every {
		l.held[key]++
		return 0, false
	}
	held = l.held[key]
	l.last[key] = now
	l.held[key] = 0
	return held, true
}

func (l *logLimiter) warn(log *slog.Logger, key, msg string, args ...any) {
	held, ok := l.allow(key)
	if !ok {
		return
	}
	if held > 0 {
		args = append(args, "similar_lines_suppressed", held)
	}
	log.Warn(msg, args...)
}
