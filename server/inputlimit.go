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
	return &limitConn{Conn: c, s: l.s}, nil
}

// limitConn scans what redcon reads. Read is only called from the
// connection's own goroutine, the one that runs its commands, so the client
// state it looks at (authed) needs no lock.
type limitConn struct {
	net.Conn
	s      *Server
	client atomic.Pointer[client] // set at accept
	scan   respScanner
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
	n, err := c.Conn.Read(p)
	if n > 0 {
		maxBulk, args := c.s.maxJobSize.Load()+bulkSlack, int64(maxArgs)
		noAuth := false
		if cl := c.client.Load(); cl != nil && !cl.authed && c.s.password() != "" {
			maxBulk, args, noAuth = maxBulkNoAuth, maxArgsNoAuth, true
		}
		if msg := c.scan.feed(p[:n], maxBulk, args, noAuth); msg != "" {
			// Tell the client why, then end the connection: what follows
			// in its stream can no longer be framed.
			_, _ = c.Conn.Write([]byte("-" + msg + "\r\n"))
			c.s.opts.Logger.Warn("connection closed: input over a limit", "addr", c.RemoteAddr().String(), "reason", msg)
			_ = c.Conn.Close()
			return 0, net.ErrClosed
		}
	}
	return n, err
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
)

// feed scans b and returns an error reply text if a limit is crossed.
func (sc *respScanner) feed(b []byte, maxBulk, maxArgs int64, noAuth bool) string {
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
		case scanInline:
			if b[i] == '\n' {
				sc.state = scanCommand
				continue
			}
			if sc.inline++; sc.inline > maxInline {
				return errInlineTooBig
			}
		case scanHeader:
			if b[i] != '\n' {
				if sc.hlen == len(sc.header) {
					sc.state = scanCommand // no valid header is this long
					continue
				}
				sc.header[sc.hlen] = b[i]
				sc.hlen++
				continue
			}
			n, ok := parseHeaderInt(sc.header[:sc.hlen])
			switch {
			case !ok:
				sc.state = scanCommand
			case sc.isArray && n > maxArgs && noAuth:
				return errNoAuthMultibulkLen
			case sc.isArray && n > maxArgs:
				return errMultibulkLen
			case sc.isArray && n <= 0:
				sc.state = scanCommand
			case sc.isArray:
				sc.args, sc.state = n, scanArg
			case n > maxBulk && noAuth:
				return errNoAuthBulkLen
			case n > maxBulk:
				return errBulkLen
			case n < 0:
				sc.state = scanCommand
			default:
				sc.bulk, sc.state = n+2, scanBulk
			}
		case scanBulk:
			skip := min(int64(len(b)-i), sc.bulk)
			sc.bulk -= skip
			i += int(skip) - 1
			if sc.bulk == 0 {
				if sc.args--; sc.args > 0 {
					sc.state = scanArg
				} else {
					sc.state = scanCommand
				}
			}
		}
	}
	return ""
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
