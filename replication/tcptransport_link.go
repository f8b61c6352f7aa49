package replication

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// linkBufSize is the size of a link's bufio buffers: many small frames go
// out in one write, and one read fills many frames.
const linkBufSize = 64 << 10

func newBufReader(r io.Reader) *bufio.Reader { return bufio.NewReaderSize(r, linkBufSize) }

// errLinkStopped: Send raced with RemovePeer or Close (Send reports which).
var errLinkStopped = errors.New("replication: link stopped")

// A link's queue is made of chunks of queueChunk bytes; up to
// maxFreeChunks empty ones are kept for reuse (1 MiB per link).
const (
	queueChunk    = 64 << 10
	maxFreeChunks = 16
)

// queueRecordHeader is the size of a queued message's header in a link's
// pending buffer: type u8 | payload length u32 | queued-at i64 (the
// transport's clock in Unix nanoseconds, for DownQueueTimeout).
const queueRecordHeader = 13

// errLinkReaddressed: a dial or handshake given up because SetPeer named
// another address meanwhile. The queue is for the node, not the address,
// so it is kept (as for no other failed attempt).
var errLinkReaddressed = errors.New("replication: link stopped or readdressed while dialling")

// tcpLink is the sending link to one peer: a queue Send appends to and one
// goroutine (run, started by SetPeer) that dials, handshakes and writes the
// queue out in batches, redialling with backoff when the connection breaks.
type tcpLink struct {
	t  *TCPTransport
	id string

	up atomic.Bool // a connection is handshaken and not broken

	mu   sync.Mutex
	addr string
	// pending holds the queued records (type | len | payload, in Send
	// order) in chunks of queueChunk bytes, or one chunk of its own for a
	// larger record: appending never copies what is queued, as growing one
	// buffer would.
	pending      [][]byte
	pendingBytes int
	pendingMsgs  int
	free         [][]byte // empty chunks to reuse, at most maxFreeChunks
	spareList    [][]byte // the writer's previous batch list, reused
	stopped      bool
	conn         net.Conn // the current connection, to close on stop or a new address

	ctx    context.Context // cancelled by stop: aborts a dial
	cancel context.CancelFunc

	wake   chan struct{} // cap 1: pending grew
	redial chan struct{} // cap 1: the address changed: skip the backoff
	quit   chan struct{} // closed by stop
	done   chan struct{} // closed when run returns (or at stop if never started)
}

// startTCPLink returns the link to peer id at addr, its goroutine
// running. Called under t.mu with the transport open (so that Close's
// wait counts it).
func startTCPLink(t *TCPTransport, id, addr string) *tcpLink {
	ctx, cancel := context.WithCancel(t.ctx)
	l := &tcpLink{t: t, id: id, addr: addr, ctx: ctx, cancel: cancel, wake: make(chan struct{}, 1),
		redial: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	t.wg.Add(1)
	go l.run()
	return l
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// enqueue copies m onto the queue and wakes the writer. Called with t.mu
// not held.
func (l *tcpLink) enqueue(m Message) error {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		return errLinkStopped
	}
	need := queueRecordHeader + len(m.Payload)
	if l.pendingBytes > 0 && l.pendingBytes+need > l.t.cfg.QueueBytes {
		l.mu.Unlock()
		return ErrLinkFull
	}
	last := len(l.pending) - 1
	if last < 0 || cap(l.pending[last])-len(l.pending[last]) < need {
		var chunk []byte
		if n := len(l.free); need <= queueChunk && n > 0 {
			chunk, l.free = l.free[n-1], l.free[:n-1]
		} else {
			chunk = make([]byte, 0, max(need, queueChunk))
		}
		l.pending = append(l.pending, chunk)
		last++
	}
	var hdr [queueRecordHeader]byte
	hdr[0] = byte(m.Type)
	binary.BigEndian.PutUint32(hdr[1:5], uint32(len(m.Payload)))
	// Read under l.mu, so the records of a queue are in time order and
	// expirePending can drop a prefix.
	binary.BigEndian.PutUint64(hdr[5:], uint64(l.t.now().UnixNano()))
	c := append(l.pending[last], hdr[:]...)
	l.pending[last] = append(c, m.Payload...)
	l.pendingBytes += need
	l.pendingMsgs++
	l.mu.Unlock()
	signal(l.wake)
	return nil
}

// setAddr points the link at a new address: the current connection (to
// the old one) is closed and the next dial is at once.
func (l *tcpLink) setAddr(addr string) {
	l.mu.Lock()
	if l.addr == addr {
		l.mu.Unlock()
		return
	}
	l.addr = addr
	c := l.conn
	l.mu.Unlock()
	if c != nil {
		c.Close()
	}
	signal(l.redial)
}

// peerIsUp cuts short the backoff of a link that is not connected: the
// peer was heard from (it dialled us), so the next dial is at once.
func (l *tcpLink) peerIsUp() {
	if !l.up.Load() {
		signal(l.redial)
	}
}

// stop ends the link: its connection is closed, its queue dropped, and it
// returns once run has.
func (l *tcpLink) stop() {
	l.mu.Lock()
	if l.stopped {
		l.mu.Unlock()
		<-l.done
		return
	}
	l.stopped = true
	l.pending, l.pendingBytes, l.pendingMsgs, l.free, l.spareList = nil, 0, 0, nil, nil
	c := l.conn
	l.mu.Unlock()
	close(l.quit)
	l.cancel()
	if c != nil {
		c.Close()
	}
	<-l.done
}

// run is the link's goroutine: dial, handshake, write until the connection
// breaks, back off, again, until stop or Close.
func (l *tcpLink) run() {
	defer l.t.wg.Done()
	defer close(l.done)
	failures := 0
	for {
		select {
		case <-l.quit:
			return
		default:
		}
		c, addr, err := l.connect()
		if err != nil {
			failures++
			if l.stopping() {
				return
			}
			if !errors.Is(err, errLinkReaddressed) {
				// The peer is not there (or refuses us): what was queued
				// for it must not wait for its next life (doc.go "What is
				// dropped, and when").
				l.dropPending()
			}
			l.t.logDialError(l.id, addr, err, failures)
			select {
			case <-l.quit:
				return
			case <-l.redial:
				failures = 0
			case <-time.After(l.t.backoff(failures)):
			}
			continue
		}
		if failures > 0 {
			l.t.log.Info("replication: bus link up again", "peer", l.id, "remote", c.RemoteAddr().String(), "failed_attempts", failures)
		}
		failures = 0
		// What waited too long for this connection is stale: the peer
		// may have been down meanwhile, and the protocol has retried or
		// timed out what mattered.
		l.expirePending(l.t.now().Add(-l.t.cfg.DownQueueTimeout))
		l.serve(c)
		if l.stopping() {
			return
		}
		// What was queued for the connection that broke is dropped, not
		// carried over to the next one (the peer may have restarted and
		// the protocol moved on: an acked job's REPLJOB must not arrive
		// after its collection).
		l.dropPending()
		// A link that broke is redialled after the shortest delay: the
		// peer may just have restarted. Repeated failures back off.
		failures = 1
		select {
		case <-l.quit:
			return
		case <-l.redial:
			failures = 0
		case <-time.After(l.t.backoff(failures)):
		}
	}
}

func (l *tcpLink) stopping() bool {
	select {
	case <-l.quit:
		return true
	default:
		return false
	}
}

// connect dials the peer's current address and runs the handshake. The
// connection is registered on the link first, so stop and setAddr can
// interrupt a handshake too.
func (l *tcpLink) connect() (net.Conn, string, error) {
	l.mu.Lock()
	addr := l.addr
	l.mu.Unlock()
	c, err := sourceDialer(l.t.cfg.SourceAddr, l.t.cfg.DialTimeout).DialContext(l.ctx, "tcp", addr)
	if err != nil {
		return nil, addr, err
	}
	l.mu.Lock()
	if l.stopped || l.addr != addr {
		l.mu.Unlock()
		c.Close()
		return nil, addr, errLinkReaddressed
	}
	l.conn = c
	l.mu.Unlock()
	c.SetDeadline(time.Now().Add(l.t.cfg.HandshakeTimeout))
	_, err = dialHandshake(c, []byte{KindBus}, l.t.ID(), l.id, l.t.cfg.Secret)
	c.SetDeadline(time.Time{})
	if err != nil {
		l.dropConn(c)
		l.mu.Lock()
		readdressed := l.addr != addr
		l.mu.Unlock()
		if readdressed {
			return nil, addr, errLinkReaddressed // setAddr closed it
		}
		return nil, addr, err
	}
	return c, addr, nil
}

func (l *tcpLink) dropConn(c net.Conn) {
	c.Close()
	l.mu.Lock()
	if l.conn == c {
		l.conn = nil
	}
	l.mu.Unlock()
}

// serve writes the queue onto c until c breaks or the link stops. A
// watcher reads c: the acceptor never writes after the handshake, so any
// read result (EOF when the peer closes, RST, stray bytes) means the link
// is gone, and the writer learns it even while idle.
func (l *tcpLink) serve(c net.Conn) {
	broken := make(chan struct{})
	l.t.wg.Add(1)
	go func() {
		defer l.t.wg.Done()
		defer close(broken)
		var b [1]byte
		c.Read(b[:])
		c.Close()
	}()
	l.up.Store(true)
	err := l.writeLoop(c, broken)
	l.up.Store(false)
	l.dropConn(c)
	<-broken
	if err != nil && !l.stopping() {
		l.t.log.Debug("replication: bus link broke", "peer", l.id, "remote", c.RemoteAddr().String(), "err", err)
	}
}

// writeLoop takes the whole queue at once and writes it as frames into a
// buffered writer, flushing only when the queue is empty: messages Sent
// while a write is in progress go out together in the next one.
func (l *tcpLink) writeLoop(c net.Conn, broken <-chan struct{}) error {
	fw := &frameWriter{w: bufio.NewWriterSize(countingWriter{c, &l.t.stats.writes}, linkBufSize),
		compressAbove: l.t.cfg.CompressAbove}
	for {
		l.mu.Lock()
		batch := l.pending
		if len(batch) == 0 {
			l.mu.Unlock()
			select {
			case <-l.quit:
				return nil
			case <-broken:
				return errors.New("replication: the peer closed the link")
			case <-l.wake:
			}
			continue
		}
		// Take the whole queue: Sends go on filling new chunks while this
		// batch is written.
		l.pending, l.spareList = l.spareList[:0], nil
		l.pendingBytes, l.pendingMsgs = 0, 0
		l.mu.Unlock()

		c.SetWriteDeadline(time.Now().Add(l.t.cfg.WriteTimeout))
		var msgs, bytes int
		var err error
		for _, chunk := range batch {
			m, b, werr := writeBatch(fw, chunk)
			msgs, bytes = msgs+m, bytes+b
			if werr != nil {
				err = werr
				break
			}
		}
		l.t.stats.msgsSent.Add(int64(msgs))
		l.t.stats.bytesSent.Add(int64(bytes))
		if err != nil {
			return err
		}
		l.mu.Lock()
		more := len(l.pending) > 0
		if !l.stopped {
			for i, chunk := range batch {
				if cap(chunk) == queueChunk && len(l.free) < maxFreeChunks {
					l.free = append(l.free, chunk[:0])
				}
				batch[i] = nil
			}
			if l.spareList == nil && cap(batch) <= 1024 {
				l.spareList = batch[:0]
			}
		}
		l.mu.Unlock()
		if !more {
			if err := fw.w.Flush(); err != nil {
				return err
			}
		}
	}
}

// dropPending drops every queued message, counting them in Dropped. Only
// the link's goroutine calls it, while no writer runs.
func (l *tcpLink) dropPending() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped || l.pendingMsgs == 0 {
		return
	}
	l.t.stats.dropped.Add(int64(l.pendingMsgs))
	for _, chunk := range l.pending {
		l.recycle(chunk)
	}
	l.pending, l.pendingBytes, l.pendingMsgs = l.pending[:0], 0, 0
}

// expirePending drops the queued messages queued before cutoff (a prefix
// of the queue: records are in time order), counting them in Dropped.
// Only the link's goroutine calls it, while no writer runs.
func (l *tcpLink) expirePending(cutoff time.Time) {
	limit := cutoff.UnixNano()
	l.mu.Lock()
	defer l.mu.Unlock()
	dropped, i := 0, 0
	for ; i < len(l.pending); i++ {
		chunk := l.pending[i]
		off := 0
		for off+queueRecordHeader <= len(chunk) {
			if int64(binary.BigEndian.Uint64(chunk[off+5:off+queueRecordHeader])) >= limit {
				break
			}
			off += queueRecordHeader + int(binary.BigEndian.Uint32(chunk[off+1:off+5]))
			dropped++
		}
		l.pendingBytes -= off
		if off < len(chunk) {
			// Keep the rest of this chunk, moved to its start so the
			// chunk keeps its capacity (and can be reused).
			n := copy(chunk, chunk[off:])
			l.pending[i] = chunk[:n]
			break
		}
		l.recycle(chunk)
	}
	l.pending = append(l.pending[:0], l.pending[i:]...)
	l.pendingMsgs -= dropped
	l.t.stats.dropped.Add(int64(dropped))
}

// recycle keeps an emptied chunk for reuse. Called under l.mu.
func (l *tcpLink) recycle(chunk []byte) {
	if cap(chunk) == queueChunk && len(l.free) < maxFreeChunks {
		l.free = append(l.free, chunk[:0])
	}
}

// writeBatch frames every record of a queue chunk. It returns how many messages
// and wire bytes it wrote (buffered, not necessarily flushed).
func writeBatch(fw *frameWriter, batch []byte) (msgs, bytes int, err error) {
	for len(batch) >= queueRecordHeader {
		typ := MsgType(batch[0])
		n := int(binary.BigEndian.Uint32(batch[1:5]))
		payload := batch[queueRecordHeader : queueRecordHeader+n]
		batch = batch[queueRecordHeader+n:]
		w, err := fw.writeFrame(typ, payload)
		if err != nil {
			return msgs, bytes, err
		}
		msgs++
		bytes += w
	}
	return msgs, bytes, nil
}

// logDialError logs a failed connect: the first failure and then at most
// one line per peer per 10 s; refusals (wrong secret, wrong node) are
// warnings, an unreachable peer info.
func (t *TCPTransport) logDialError(peer, addr string, err error, failures int) {
	if t.ctx.Err() != nil {
		return
	}
	if errors.Is(err, errRefused) {
		t.lim.warn(t.log, "dial:"+peer, "replication: bus link refused", "peer", peer, "remote", addr, "err", err, "attempt", failures)
		return
	}
	// Anything else (no listener, a reset, a handshake cut short by a
	// peer that is shutting down) is the network: info, as rarely.
	if held, ok := t.lim.allow("dial:" + peer); ok || failures == 1 {
		t.log.Info("replication: cannot reach peer on the bus", "peer", peer, "remote", addr, "err", err,
			"attempt", failures, "similar_lines_suppressed", held)
	}
}

// countingWriter counts the writes (system calls) under a link's bufio
// writer: tests and benchmarks check that messages share them.
type countingWriter struct {
	w      io.Writer
	writes *atomic.Int64
}

func (cw countingWriter) Write(p []byte) (int, error) {
	cw.writes.Add(1)
	return cw.w.Write(p)
}
