package server

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/tidwall/redcon"
)

// Request bodies. redcon reads a command into one buffer that doubles as it
// fills and keeps it after the command (a 64 MiB body takes a 128 MiB
// buffer, plus a 64 MiB copy, for as long as the connection lives), so a
// few clients sending large bodies slowly could hold any amount of memory
// outside every limit. A bulk string of absorbMin bytes or more therefore
// never reaches redcon: limitConn reads it itself, into a buffer of its exact
// size, and hands redcon a short token in its place, which handle swaps
// back for the body before the command runs.
//
// Those bodies are held against one budget for all clients (maxmemory / 2,
// or DefaultRequestBudget without maxmemory; never less than one body of
// max-job-size): a body is charged from the moment its length is announced
// until its command has run. A body that does not fit waits, unread (its
// client is not read from, so TCP holds it back), for at most
// Options.BodyWait; then it is read and dropped, and its command gets
// errBodyBudget — the connection goes on.
const (
	// absorbMin: shorter bulk strings go through redcon as they are.
	absorbMin = 64 << 10
	// DefaultRequestBudget bounds the request bodies being read at once
	// when maxmemory is off.
	DefaultRequestBudget = 512 << 20
	// DefaultBodyWait is how long a body waits for room in the budget.
	DefaultBodyWait = 10 * time.Second
	// tokenLen is the length of the token that stands for a body: the
	// connection's secret, then the body's sequence number.
	tokenLen = 24
)

// errBodyBudget answers a command whose body found no room in the budget.
const errBodyBudget = "OOM request bodies being read use the memory allowed for them (%d bytes), try later"

// reqMem is the budget shared by all connections.
type reqMem struct {
	mu      sync.Mutex
	used    int64
	waiting int
	freed   chan struct{} // closed (and replaced) when bytes are released
}

func (m *reqMem) tryReserve(n, budget int64) (bool, chan struct{}) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.used+n <= budget {
		m.used += n
		return true, nil
	}
	if m.freed == nil {
		m.freed = make(chan struct{})
	}
	return false, m.freed
}

func (m *reqMem) release(n int64) {
	if n == 0 {
		return
	}
	m.mu.Lock()
	m.used -= n
	if m.freed != nil {
		close(m.freed)
		m.freed = nil
	}
	m.mu.Unlock()
}

func (m *reqMem) addWaiting(d int) {
	m.mu.Lock()
	m.waiting += d
	m.mu.Unlock()
}

// stats returns the bytes held and the bodies waiting for room.
func (m *reqMem) stats() (int64, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used, m.waiting
}

// requestBudget is the bytes of request bodies all clients may hold.
func (s *Server) requestBudget() int64 {
	b := s.opts.RequestBudget
	if b <= 0 {
		b = DefaultRequestBudget
		if m := s.guard.maxMemory.Load(); m > 0 {
			b = m / 2
		}
	}
	return max(b, s.maxJobSize.Load()+bulkSlack+2)
}

// connMem is what one connection holds of the budget. Close releases it
// from any goroutine, so it has a lock of its own.
type connMem struct {
	mu     sync.Mutex
	held   int64
	closed bool
	done   chan struct{} // closed by Close: wakes a wait for room
}

// body is a request body read by limitConn, waiting for its command.
type body struct {
	data    []byte // nil: refused (no room in the budget)
	charged int64
}

// bodyQueue holds the bodies read and not yet swapped into their commands,
// in the order of the stream. Only the connection's goroutine touches it.
type bodyQueue struct {
	secret [16]byte
	next   uint64 // sequence number of the next body read
	first  uint64 // sequence number of q[0]
	q      []body
}

func newLimitConn(c net.Conn, s *Server) *limitConn {
	lc := &limitConn{Conn: c, s: s}
	lc.mem.done = make(chan struct{})
	_, _ = rand.Read(lc.bodies.secret[:])
	return lc
}

// Close releases what the connection holds of the budget and closes it.
func (c *limitConn) Close() error {
	c.mem.mu.Lock()
	if !c.mem.closed {
		c.mem.closed = true
		c.s.reqMem.release(c.mem.held)
		c.mem.held = 0
		close(c.mem.done)
	}
	c.mem.mu.Unlock()
	return c.Conn.Close()
}

// reserve charges n bytes to the connection, waiting up to BodyWait for
// room; false: no room (or the connection or server closed meanwhile).
func (c *limitConn) reserve(n int64) bool {
	if cl := c.client.Load(); cl != nil && cl.rejected != "" {
		return false // read and dropped; the connection is on its way out
	}
	budget := c.s.requestBudget()
	if n > budget {
		return false
	}
	var timer *time.Timer
	for {
		c.mem.mu.Lock()
		if c.mem.closed {
			c.mem.mu.Unlock()
			return false
		}
		ok, freed := c.s.reqMem.tryReserve(n, budget)
		if ok {
			c.mem.held += n
		}
		c.mem.mu.Unlock()
		if ok {
			return true
		}
		if timer == nil {
			timer = time.NewTimer(time.Duration(c.s.bodyWait.Load()))
			defer timer.Stop()
			c.s.reqMem.addWaiting(1)
			defer c.s.reqMem.addWaiting(-1)
		}
		select {
		case <-freed:
		case <-timer.C:
			return false
		case <-c.mem.done:
			return false
		case <-c.s.ctx.Done():
			return false
		}
	}
}

// unreserve gives back n bytes the connection held.
func (c *limitConn) unreserve(n int64) {
	c.mem.mu.Lock()
	if !c.mem.closed {
		c.mem.held -= n
		c.s.reqMem.release(n)
	}
	c.mem.mu.Unlock()
}

// readBody reads the body of c.absorb bytes (and its CRLF) announced last
// — into a buffer of its own if the budget has room, else into nothing —
// and queues a token for redcon in its place.
func (c *limitConn) readBody() error {
	n := c.absorb + 2
	c.absorb = 0
	var data []byte
	charged := int64(0)
	if c.reserve(n) {
		data, charged = make([]byte, n), n
	}
	got := int64(0)
	var tail [2]byte // the last two bytes read (the CRLF, when all is read)
	take := func(b []byte) {
		if data != nil {
			copy(data[got:], b)
		}
		got += int64(len(b))
		switch {
		case len(b) >= 2:
			tail = [2]byte{b[len(b)-2], b[len(b)-1]}
		case len(b) == 1:
			tail = [2]byte{tail[1], b[0]}
		}
	}
	if k := min(int64(c.rend-c.rpos), n); k > 0 {
		take(c.raw[c.rpos : c.rpos+int(k)])
		c.rpos += int(k)
	}
	for got < n {
		if c.rerr != nil {
			c.unreserve(charged)
			return c.rerr
		}
		var buf []byte
		if data != nil {
			buf = data[got:]
		} else { // dropped: read through a scratch buffer
			buf = c.buf(16 << 10)
			buf = buf[:min(int64(len(buf)), n-got)]
		}
		k, err := c.Conn.Read(buf)
		if k > 0 {
			// take copies data onto itself here: a no-op copy.
			take(buf[:k])
		}
		c.rerr = err
	}
	if data != nil {
		data = data[:n-2]
	}
	q := &c.bodies
	q.q = append(q.q, body{data: data, charged: charged})
	var tok [tokenLen]byte
	copy(tok[:], q.secret[:])
	binary.BigEndian.PutUint64(tok[16:], q.next)
	q.next++
	c.out = append(c.out, fmt.Sprintf("$%d\r\n", tokenLen)...)
	c.out = append(append(c.out, tok[:]...), tail[:]...)
	c.scan.bulkDone()
	return nil
}

// takeBodies swaps the tokens in cmds for their bodies. It returns the
// bytes they were charged, to release once the commands have run, and
// marks in refused the commands whose body found no room.
func (c *limitConn) takeBodies(cmds []redcon.Command) (charged int64, refused []bool) {
	q := &c.bodies
	if len(q.q) == 0 {
		return 0, nil
	}
	for i := range cmds {
		for j, a := range cmds[i].Args {
			if len(a) != tokenLen || !bytes.Equal(a[:16], q.secret[:]) {
				continue
			}
			seq := binary.BigEndian.Uint64(a[16:])
			if seq < q.first || seq-q.first >= uint64(len(q.q)) {
				continue // not ours (cannot happen: the secret is)
			}
			// Bodies come in stream order: all before this one were
			// taken, or belong to commands redcon did not hand on.
			k := int(seq - q.first)
			b := q.q[k]
			for _, skipped := range q.q[:k] {
				charged += skipped.charged
			}
			q.q = q.q[k+1:]
			q.first = seq + 1
			charged += b.charged
			if b.data == nil {
				if refused == nil {
					refused = make([]bool, len(cmds))
				}
				refused[i] = true
				continue
			}
			cmds[i].Args[j] = b.data
		}
	}
	if len(q.q) == 0 {
		q.q = nil
	}
	return charged, refused
}
