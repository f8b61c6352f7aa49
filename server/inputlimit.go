package server

import (
	"errors"
	"net"
	"sync/atomic"
	"syscall"
)

// Input limits. redcon buffers a whole command before the server sees it,
// so a client could make it allocate any amount of memory — a 4 GiB bulk
// string, a multibulk of a billion arguments — before max-job-size or AUTH
// had a say. Every connection's bytes therefore pass through a small RESP
// scanner as redcon reads them; a command over a limit gets Redis's
// protocol error and the connection is closed before the bytes pile up.
// Like Redis, a client that has not authenticated (when requirepass is
// set) is held to much smaller limits.
const (
	// maxArgs bounds a command's arguments (Redis: 1024*1024 too, for
	// non-AUTH'd clients 10).
	maxArgs = 1 << 20
	// maxInline bounds an inline (telnet-style) command line, as Redis's
	// PROTO_INLINE_MAX_SIZE.
	maxInline = 64 << 10
	// bulkSlack is how far past max-job-size a bulk string may go and
	// still be read: a body a little too large gets ADDJOB's own error
	// reply, not a dropped connection.
	bulkSlack = 1 << 20
	// Before AUTH (Redis's limits for unauthenticated clients).
	maxArgsNoAuth = 10
	maxBulkNoAuth = 16 << 10
)

// The errors, Redis's texts.
const (
	errMultibulkLen       = "ERR Protocol error: invalid multibulk length"
	errBulkLen            = "ERR Protocol error: invalid bulk length"
	errNoAuthMultibulkLen = "ERR Protocol error: unauthenticated multibulk length"
	errNoAuthBulkLen      = "ERR Protocol error: unauthenticated bulk length"
	errInlineTooBig       = "ERR Protocol error: too big inline request"
)

// limitListener wraps every accepted connection in a limitConn.
type limitListener struct {
	net.Listener
	s *Server
}

func (l limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newLimitConn(c, l.s), nil
}

// limitConn scans what redcon reads, and reads large request bodies itself
// (reqmem.go). Read is only called from the connection's own goroutine, the
// one that runs its commands, so the client state it looks at (authed) and
// the fields below scan need no lock.
type limitConn struct {
	net.Conn
	s      *Server
	client atomic.Pointer[client] // set at accept
	scan   respScanner

	raw        []byte // read aside from the socket; raw[rpos:rend] not yet scanned
	rpos, rend int
	out        []byte // what redcon gets; out[opos:] not yet given
	opos       int
	rerr       error // the socket's error, returned once raw and out are drained
	absorb     int64 // a bulk of this length was announced: read it next
	bodies     bodyQueue
	mem        connMem
}

// SyscallConn exposes the socket, for watchPeer's peek at a blocked
// client's connection.
func (c *limitConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("server: connection has no socket")
	}
	return sc.SyscallConn()
}

func (c *limitConn) Read(p []byte) (int, error) {
	for {
		if c.opos < len(c.out) {
			n := copy(p, c.out[c.opos:])
			c.opos += n
			return n, nil
		}
		c.out, c.opos = c.out[:0], 0
		if c.absorb > 0 {
			// Only now, with what came before the body handled by redcon
			// (it reads only when it has no whole command left).
			if err := c.readBody(); err != nil {
				return 0, err
			}
			continue
		}
		if c.rpos < c.rend { // read before a body, and not yet scanned
			out, used, ok := c.scanned(c.raw[c.rpos:c.rend], c.out)
			if !ok {
				return 0, net.ErrClosed
			}
			c.out, c.rpos = out, c.rpos+used
			continue
		}
		if c.rerr != nil {
			return 0, c.rerr
		}
		if cap(c.raw) > maxInline {
			c.raw = nil // a large body's leftovers: do not keep the buffer
		}
		if c.scan.holding() {
			// The '$' line begun in an earlier read comes out whole now,
			// so the output can outgrow the input: read aside.
			c.raw = c.buf(4 << 10)
			n, err := c.Conn.Read(c.raw)
			c.rpos, c.rend, c.rerr = 0, n, err
			continue
		}
		// The usual case: read into p and scan it in place (what goes out
		// is never longer than what came in so far).
		n, err := c.Conn.Read(p)
		c.rerr = err
		out, used, ok := c.scanned(p[:n], p[:0])
		if !ok {
			return 0, net.ErrClosed
		}
		if used < n { // stopped before a body: keep the rest for readBody
			c.raw = c.buf(n - used)
			c.rpos, c.rend = 0, copy(c.raw, p[used:n])
		}
		if len(out) > 0 {
			return len(out), nil
		}
	}
}

// scanned scans b into out with the connection's limits; false: a limit
// was crossed, and the connection is closed.
func (c *limitConn) scanned(b, out []byte) ([]byte, int, bool) {
	lim := scanLimits{maxBulk: c.s.maxJobSize.Load() + bulkSlack, maxArgs: maxArgs, absorb: absorbMin}
	if cl := c.client.Load(); cl != nil && !cl.authed && c.s.password() != "" {
		lim = scanLimits{maxBulk: maxBulkNoAuth, maxArgs: maxArgsNoAuth, noAuth: true}
	}
	out, used, absorb, msg := c.scan.scan(b, out, lim)
	if msg != "" {
		// Tell the client why, then end the connection: what follows
		// in its stream can no longer be framed.
		_, _ = c.Conn.Write([]byte("-" + msg + "\r\n"))
		c.s.opts.Logger.Warn("connection closed: input over a limit", "addr", c.RemoteAddr().String(), "reason", msg)
		_ = c.Close()
		return nil, 0, false
	}
	c.absorb = absorb
	return out, used, true
}

// buf returns c.raw with room for n bytes.
func (c *limitConn) buf(n int) []byte {
	if len(c.raw) < n {
		c.raw = make([]byte, n)
	}
	return c.raw
}

// respScanner follows the framing of a RESP request stream without
// keeping it: where a command starts, how many arguments it announced, how
// long the bulk string being read is. It checks only sizes; malformed input
// is redcon's to refuse, and the scanner resynchronises at the next command.
type respScanner struct {
	state   scanState
	header  [24]byte // a '*' or '$' line, without its CRLF
	hlen    int
	inline  int   // bytes of the inline command line so far
	args    int64 // arguments of the multibulk still to come
	bulk    int64 // bytes of the current bulk string (and its CRLF) to skip
	isArray bool  // the header being read is a '*' line
}

type scanState uint8

const (
	scanCommand scanState = iota // at the start of a command
	scanHeader                   // in a '*' or '$' line
	scanInline                   // in an inline command line
	scanArg                      // expecting an argument's '$' line
	scanBulk                     // in a bulk string's bytes
	scanAbsorb                   // after the '$' line of a bulk the caller reads
)

// scanLimits are the limits a scan applies.
type scanLimits struct {
	maxBulk, maxArgs int64
	noAuth           bool
	// absorb: a bulk string at least this long is not passed on; scan
	// stops after its header and says how long it is (0: none is).
	absorb int64
}

// feed scans b and returns an error reply text if a limit is crossed.
func (sc *respScanner) feed(b []byte, maxBulk, maxArgs int64, noAuth bool) string {
	_, _, _, msg := sc.scan(b, nil, scanLimits{maxBulk: maxBulk, maxArgs: maxArgs, noAuth: noAuth})
	return msg
}

// scan follows b and appends to out what the reader of the stream gets:
// b itself, except that a bulk string's '$' line is held back until it is
// whole, and a bulk of at least lim.absorb bytes is not passed on at all:
// scan stops after its '$' line and returns how much of b it used and the
// bulk's length, and the caller reads the body itself and calls bulkDone.
// A crossed limit returns its error reply text.
func (sc *respScanner) scan(b, out []byte, lim scanLimits) (_ []byte, used int, absorb int64, msg string) {
	from := 0 // b[from:i] is passed on, not yet appended
	for i := 0; i < len(b); i++ {
		switch sc.state {
		case scanCommand:
			switch b[i] {
			case '*':
				sc.state, sc.hlen, sc.isArray = scanHeader, 0, true
			case '\r', '\n':
			default:
				sc.state, sc.inline = scanInline, 1
			}
		case scanArg:
			if b[i] != '$' {
				sc.state = scanCommand // not RESP: redcon will say so
				i--
				continue
			}
			sc.state, sc.hlen, sc.isArray = scanHeader, 0, false
			out, from = append(out, b[from:i]...), i+1 // held back
		case scanInline:
			if b[i] == '\n' {
				sc.state = scanCommand
				continue
			}
			if sc.inline++; sc.inline > maxInline {
				return out, i, 0, errInlineTooBig
			}
		case scanHeader:
			if b[i] != '\n' {
				if sc.hlen == len(sc.header) {
					sc.state = scanCommand // no valid header is this long
					if !sc.isArray {
						out, from = sc.appendHeld(out, false), i
					}
					continue
				}
				sc.header[sc.hlen] = b[i]
				sc.hlen++
				if !sc.isArray {
					from = i + 1
				}
				continue
			}
			n, ok := parseHeaderInt(sc.header[:sc.hlen])
			if !sc.isArray {
				from = i + 1
			}
			switch {
			case !ok:
				sc.state = scanCommand
			case sc.isArray && n > lim.maxArgs && lim.noAuth:
				return out, i, 0, errNoAuthMultibulkLen
			case sc.isArray && n > lim.maxArgs:
				return out, i, 0, errMultibulkLen
			case sc.isArray && n <= 0:
				sc.state = scanCommand
			case sc.isArray:
				sc.args, sc.state = n, scanArg
			case n > lim.maxBulk && lim.noAuth:
				return out, i, 0, errNoAuthBulkLen
			case n > lim.maxBulk:
				return out, i, 0, errBulkLen
			case n < 0:
				sc.state = scanCommand
			case lim.absorb > 0 && n >= lim.absorb:
				sc.state = scanAbsorb
				return out, i + 1, n, ""
			default:
				sc.bulk, sc.state = n+2, scanBulk
			}
			if !sc.isArray {
				out = sc.appendHeld(out, true)
			}
		case scanBulk:
			skip := min(int64(len(b)-i), sc.bulk)
			sc.bulk -= skip
			i += int(skip) - 1
			if sc.bulk == 0 {
				sc.bulkDone()
			}
		case scanAbsorb:
			// The caller did not take the body (feed): nothing more can be
			// framed.
			return out, i, 0, errBulkLen
		}
	}
	return append(out, b[from:]...), len(b), 0, ""
}

// holding says whether a '$' line is being held back.
func (sc *respScanner) holding() bool { return sc.state == scanHeader && !sc.isArray }

// appendHeld appends the held-back '$' line (with its LF if whole).
func (sc *respScanner) appendHeld(out []byte, lf bool) []byte {
	out = append(append(out, '$'), sc.header[:sc.hlen]...)
	if lf {
		out = append(out, '\n')
	}
	return out
}

// bulkDone moves past a bulk string's body.
func (sc *respScanner) bulkDone() {
	if sc.args--; sc.args > 0 {
		sc.state = scanArg
	} else {
		sc.state = scanCommand
	}
}

// parseHeaderInt parses the number of a "*n\r" or "$n\r" line (the CR
// still on it).
func parseHeaderInt(h []byte) (int64, bool) {
	if len(h) > 0 && h[len(h)-1] == '\r' {
		h = h[:len(h)-1]
	}
	neg := len(h) > 0 && h[0] == '-'
	if neg {
		h = h[1:]
	}
	if len(h) == 0 {
		return 0, false
	}
	var n int64
	for _, c := range h {
		if c < '0' || c > '9' {
			return 0, false
		}
		if n > 1<<59 {
			n = 1 << 62 // past every limit; no need to be exact
			continue
		}
		n = n*10 + int64(c-'0')
	}
	if neg {
		n = -n
	}
	return n, true
}
