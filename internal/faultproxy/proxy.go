package faultproxy

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// Rule is what a Proxy does to the connections from one source address.
// The zero Rule forwards everything at once.
type Rule struct {
	// Reset: connections from the source are closed with a TCP reset
	// (the ones open when the rule is set, and every new one as soon as
	// it is accepted).
	Reset bool
	// HoldUp and HoldDown black-hole one direction: bytes from the source
	// to the target (up) or back (down) are not forwarded until the rule
	// is lifted. The connection stays open and the proxy stops reading,
	// so the sender's writes stall as they would behind a lost route.
	HoldUp, HoldDown bool
	// Up and Down are latency added to every byte going to the target
	// (up) or back to the source (down).
	Up, Down time.Duration
}

// Stats counts what a Proxy did since it started.
type Stats struct {
	Accepted int64 // connections accepted and forwarded
	Refused  int64 // connections reset at accept (a Reset rule)
	Reset    int64 // open connections reset when a Reset rule was set
	DialErrs int64 // connections closed because the target could not be dialled
	Open     int64 // connections open now
	// BytesUp and BytesDown are bytes forwarded to the target and back.
	BytesUp, BytesDown int64
}

// Proxy listens on one address and forwards each connection to a target,
// applying the Rule of the connection's source IP. Safe for concurrent
// use.
type Proxy struct {
	ln net.Listener

	mu      sync.Mutex
	target  string
	rules   map[netip.Addr]Rule
	conns   map[*proxyConn]struct{}
	changed chan struct{} // closed (and replaced) whenever a rule changes
	closed  bool

	accepted, refused, reset, dialErrs atomic.Int64
	bytesUp, bytesDown                 atomic.Int64

	wg sync.WaitGroup
}

// chunkSize and chunkQueue bound a direction's buffered bytes: a held or
// delayed direction keeps at most chunkQueue chunks, then stops reading.
const (
	chunkSize   = 32 << 10
	chunkQueue  = 16
	dialTimeout = 3 * time.Second
)

// Listen starts a proxy on listen ("ip:port", port 0 picks one) that
// forwards to target ("ip:port"; SetTarget changes it for new
// connections).
func Listen(listen, target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p := &Proxy{ln: ln, target: target, rules: map[netip.Addr]Rule{},
		conns: map[*proxyConn]struct{}{}, changed: make(chan struct{})}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the address the proxy listens on.
func (p *Proxy) Addr() netip.AddrPort {
	return p.ln.Addr().(*net.TCPAddr).AddrPort()
}

// SetTarget changes where new connections are forwarded.
func (p *Proxy) SetTarget(target string) {
	p.mu.Lock()
	p.target = target
	p.mu.Unlock()
}

// SetRule sets the rule for connections from src (the zero Rule removes
// it). A Reset rule resets the source's open connections before it
// returns; lifting a hold releases the held bytes at once.
func (p *Proxy) SetRule(src netip.Addr, r Rule) {
	src = src.Unmap()
	p.mu.Lock()
	if r == (Rule{}) {
		delete(p.rules, src)
	} else {
		p.rules[src] = r
	}
	close(p.changed)
	p.changed = make(chan struct{})
	var victims []*proxyConn
	if r.Reset {
		for c := range p.conns {
			if c.src == src {
				victims = append(victims, c)
			}
		}
	}
	p.mu.Unlock()
	for _, c := range victims {
		p.reset.Add(1)
		c.kill(true)
	}
}

// Rule returns the rule in force for src.
func (p *Proxy) Rule(src netip.Addr) Rule {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rules[src.Unmap()]
}

// ClearRules removes every rule (held bytes are released).
func (p *Proxy) ClearRules() {
	p.mu.Lock()
	clear(p.rules)
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
}

// Stats returns the proxy's counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	open := int64(len(p.conns))
	p.mu.Unlock()
	return Stats{Accepted: p.accepted.Load(), Refused: p.refused.Load(), Reset: p.reset.Load(),
		DialErrs: p.dialErrs.Load(), Open: open, BytesUp: p.bytesUp.Load(), BytesDown: p.bytesDown.Load()}
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := make([]*proxyConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.kill(false)
	}
	p.wg.Wait()
	return err
}

// ruleFor returns src's rule and the channel closed at its next change.
func (p *Proxy) ruleFor(src netip.Addr) (Rule, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rules[src], p.changed
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// A transient accept error (EMFILE, a connection reset
			// before accept): wait a little rather than spin.
			time.Sleep(10 * time.Millisecond)
			continue
		}
		src := c.RemoteAddr().(*net.TCPAddr).AddrPort().Addr().Unmap()
		pc := &proxyConn{p: p, src: src, client: c, done: make(chan struct{})}
		p.mu.Lock()
		if p.closed || p.rules[src].Reset {
			refused := !p.closed
			p.mu.Unlock()
			if refused {
				p.refused.Add(1)
			}
			resetConn(c)
			continue
		}
		p.conns[pc] = struct{}{}
		target := p.target
		p.wg.Add(1)
		p.mu.Unlock()
		p.accepted.Add(1)
		go pc.run(target)
	}
}

// proxyConn is one forwarded connection.
type proxyConn struct {
	p      *Proxy
	src    netip.Addr
	client net.Conn

	mu       sync.Mutex
	upstream net.Conn
	killed   bool
	done     chan struct{} // closed by kill
}

func (c *proxyConn) run(target string) {
	defer c.p.wg.Done()
	defer c.forget()
	d := net.Dialer{Timeout: dialTimeout}
	up, err := d.Dial("tcp", target)
	if err != nil {
		c.p.dialErrs.Add(1)
		c.kill(true)
		return
	}
	c.mu.Lock()
	if c.killed {
		c.mu.Unlock()
		up.Close()
		return
	}
	c.upstream = up
	c.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); c.pipe(c.client, up, true) }()
	go func() { defer wg.Done(); c.pipe(up, c.client, false) }()
	wg.Wait()
	c.kill(false)
}

func (c *proxyConn) forget() {
	c.p.mu.Lock()
	delete(c.p.conns, c)
	c.p.mu.Unlock()
}

// kill closes both sides (once); rst sends the source a TCP reset.
func (c *proxyConn) kill(rst bool) {
	c.mu.Lock()
	if c.killed {
		c.mu.Unlock()
		return
	}
	c.killed = true
	close(c.done)
	up := c.upstream
	c.mu.Unlock()
	if rst {
		resetConn(c.client)
		if up != nil {
			resetConn(up)
		}
		return
	}
	c.client.Close()
	if up != nil {
		up.Close()
	}
}

type chunk struct {
	data []byte
	read time.Time
}

// pipe forwards from → to in one direction (up: source to target): a
// reader fills a bounded queue of chunks stamped with their read time,
// the writer sends each once its delay has passed and no hold is on.
func (c *proxyConn) pipe(from, to net.Conn, up bool) {
	q := make(chan chunk, chunkQueue)
	var readErr error // set before q closes
	go func() {
		defer close(q)
		buf := make([]byte, chunkSize)
		for {
			n, err := from.Read(buf)
			if n > 0 {
				// A copy of exactly what was read: gossip's reads are a
				// few hundred bytes, and a held queue keeps them.
				data := append([]byte(nil), buf[:n]...)
				select {
				case q <- chunk{data: data, read: time.Now()}:
				case <-c.done:
					readErr = net.ErrClosed
					return
				}
			}
			if err != nil {
				readErr = err
				return
			}
		}
	}()
	counter := &c.p.bytesDown
	if up {
		counter = &c.p.bytesUp
	}
	for ch := range q {
		if !c.waitSendable(ch.read, up) {
			for range q { // let the reader end
			}
			return
		}
		if _, err := to.Write(ch.data); err != nil {
			c.kill(false)
			for range q {
			}
			return
		}
		counter.Add(int64(len(ch.data)))
	}
	if readErr != io.EOF {
		c.kill(false) // a reset or a closed connection: end both ways
		return
	}
	// The sender closed its side: pass the EOF on, keep the other way.
	if tc, ok := to.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}

// waitSendable waits until a chunk read at read may be written: no hold on
// the direction and its delay passed. False: the connection was killed.
func (c *proxyConn) waitSendable(read time.Time, up bool) bool {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		r, changed := c.p.ruleFor(c.src)
		hold, delay := r.HoldDown, r.Down
		if up {
			hold, delay = r.HoldUp, r.Up
		}
		var wake <-chan time.Time
		if !hold {
			wait := time.Until(read.Add(delay))
			if wait <= 0 {
				return true
			}
			if timer == nil {
				timer = time.NewTimer(wait)
			} else {
				timer.Reset(wait)
			}
			wake = timer.C
		}
		select {
		case <-c.done:
			return false
		case <-changed:
		case <-wake:
			return true
		}
	}
}

// resetConn closes c with a TCP reset rather than a FIN: the peer's next
// read or write fails at once, as when a route goes away mid-connection.
func resetConn(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}
