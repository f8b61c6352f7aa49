package server

import (
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/tidwall/redcon"
)

// MONITOR, as Redis has it: the connection gets +OK, then one status line
// per command every other client runs,
//
//	+1700000000.123456 [0 127.0.0.1:54321] "ADDJOB" "q" "body" "0"
//
// (Unix time in µs, database 0, the client's address, the arguments
// quoted). AUTH's arguments, and HELLO's after AUTH, read "(redacted)";
// admin commands (CONFIG, CLIENT, DEBUG, …: commandFlags) are not shown at
// all, so CONFIG SET requirepass never reaches a monitor. Commands refused
// before they run (unknown, wrong arity, -NOAUTH, -LOADING) are not shown
// either: Redis feeds its monitors from call(), which they never reach.
//
// A line is formatted once, by the goroutine of the client that runs the
// command, and appended to each monitor's buffer; the monitor's own writer
// goroutine sends it. A monitor that does not read cannot stall anyone: once
// its unsent output passes Options.MonitorBufferLimit it is disconnected
// (Redis's client-output-buffer-limit). With no monitor the only cost on the
// command path is one atomic load (Server.monitors).
//
// A monitor connection takes only QUIT (+OK, then the connection closes
// once its pending lines are sent); anything else gets an error, queued
// after the lines already pending.

func init() {
	register(&command{name: "monitor", arity: 1, whileLoading: true, run: cmdMonitor})
}

// DefaultMonitorBufferLimit is Options.MonitorBufferLimit's default: Redis's
// hard output buffer limit for pubsub clients.
const DefaultMonitorBufferLimit = 32 << 20

// errMonitorMode answers what a monitor sends besides QUIT.
const errMonitorMode = "ERR only QUIT is allowed in MONITOR mode"

// monitorHidden are the commands no monitor sees: the admin ones, as in
// Redis (their arguments may hold secrets: CONFIG SET requirepass).
var monitorHidden = func() map[string]bool {
	hidden := map[string]bool{}
	for name, flags := range commandFlags {
		if slices.Contains(flags, "admin") {
			hidden[name] = true
		}
	}
	return hidden
}()

// monitor is one MONITOR connection's output: a buffer that the clients'
// goroutines fill (queue) and its writer goroutine (run) empties into the
// socket. cl.monitor points to it; only cl's goroutine reads that field.
type monitor struct {
	cl    *client
	conn  net.Conn
	limit int
	wake  chan struct{} // capacity 1: the writer has something to do
	done  chan struct{} // closed when the writer has returned

	mu      sync.Mutex
	pending []byte // queued, not yet taken by the writer
	// inflight is what the writer is sending now: it counts against the
	// limit too, so a monitor holds at most limit bytes of output.
	inflight int
	// stopped: nothing more is queued; the writer sends what is pending
	// and returns, closing the connection if closeAfter is set (QUIT).
	stopped    bool
	closeAfter bool
}

// cmdMonitor makes the connection a monitor. The replies to the commands
// before it in the pipeline are flushed first; from here on the monitor's
// writer owns the socket's output, and +OK is the first thing it sends.
func cmdMonitor(s *Server, c *call) {
	flush(c.conn)
	m := &monitor{
		cl:      c.client,
		conn:    c.client.netConn,
		limit:   s.opts.MonitorBufferLimit,
		wake:    make(chan struct{}, 1),
		done:    make(chan struct{}),
		pending: []byte("+OK\r\n"),
	}
	c.client.monitor = m
	// Listed before the writer starts: once the client reads +OK, every
	// command another client runs is fed to it.
	s.addMonitor(m)
	go m.run()
}

// monitorMode answers a command sent by a monitor (cmds[0]) and returns how
// many commands it consumed.
func (s *Server) monitorMode(cl *client, cmds []redcon.Command) int {
	m := cl.monitor
	if !is(cmds[0].Args[0], "quit") {
		if !m.queue([]byte("-" + errMonitorMode + "\r\n")) {
			s.dropMonitor(m, "output buffer over limit")
		}
		return 1
	}
	s.removeMonitor(m)
	m.mu.Lock()
	if !m.stopped {
		m.pending = append(m.pending, "+OK\r\n"...)
		m.stopped, m.closeAfter = true, true
	}
	m.mu.Unlock()
	m.signal()
	return len(cmds) // nothing after QUIT runs
}

// queue appends out to the monitor's buffer. It reports false when that
// would take the monitor over its limit: the caller drops it.
func (m *monitor) queue(out []byte) bool {
	m.mu.Lock()
	if m.stopped {
		m.mu.Unlock()
		return true
	}
	if len(m.pending)+m.inflight+len(out) > m.limit {
		m.stopped, m.pending = true, nil
		m.mu.Unlock()
		return false
	}
	m.pending = append(m.pending, out...)
	m.mu.Unlock()
	m.signal()
	return true
}

func (m *monitor) signal() {
	select {
	case m.wake <- struct{}{}:
	default:
	}
}

// stop ends the writer once what is pending has been sent (or the
// connection has failed).
func (m *monitor) stop() {
	m.mu.Lock()
	m.stopped = true
	m.mu.Unlock()
	m.signal()
}

// monitorKeepCap bounds the buffer capacity a monitor keeps between bursts.
const monitorKeepCap = 64 << 10

// run is the monitor's writer: it sends the buffer as it fills, double
// buffered so that clients append while it writes.
func (m *monitor) run() {
	defer close(m.done)
	var spare []byte
	for {
		m.mu.Lock()
		for len(m.pending) == 0 && !m.stopped {
			m.mu.Unlock()
			<-m.wake
			m.mu.Lock()
		}
		if len(m.pending) == 0 {
			closeAfter := m.closeAfter
			m.mu.Unlock()
			if closeAfter {
				_ = m.conn.Close()
			}
			return
		}
		out := m.pending
		m.pending, m.inflight = spare[:0], len(out)
		m.mu.Unlock()
		_, err := m.conn.Write(out)
		m.mu.Lock()
		m.inflight = 0
		if err != nil {
			m.stopped, m.pending = true, nil
		}
		m.mu.Unlock()
		if err != nil {
			_ = m.conn.Close() // the connection's goroutine sees it and cleans up
			return
		}
		if cap(out) <= monitorKeepCap {
			spare = out
		} else {
			spare = nil
		}
	}
}

// addMonitor and removeMonitor replace the monitor list; feeders read it
// without a lock (copy on write).
func (s *Server) addMonitor(m *monitor) {
	s.monMu.Lock()
	defer s.monMu.Unlock()
	var list []*monitor
	if old := s.monitors.Load(); old != nil {
		list = slices.Clone(*old)
	}
	list = append(list, m)
	s.monitors.Store(&list)
}

// removeMonitor takes m off the list (if it is on it); the list becomes nil
// when it is empty, so that the command path skips feeding.
func (s *Server) removeMonitor(m *monitor) bool {
	s.monMu.Lock()
	defer s.monMu.Unlock()
	old := s.monitors.Load()
	if old == nil {
		return false
	}
	i := slices.Index(*old, m)
	if i < 0 {
		return false
	}
	list := slices.Delete(slices.Clone(*old), i, i+1)
	if len(list) == 0 {
		s.monitors.Store(nil)
	} else {
		s.monitors.Store(&list)
	}
	return true
}

// dropMonitor disconnects a monitor that fell behind.
func (s *Server) dropMonitor(m *monitor, reason string) {
	if !s.removeMonitor(m) {
		return // already dropped, by another feeder
	}
	s.opts.Logger.Warn("monitor client dropped", "addr", m.cl.addr, "id", m.cl.id, "reason", reason,
		"limit", m.limit)
	m.stop()
	_ = m.conn.Close()
}

// stopMonitor is called when a monitor's connection has closed.
func (s *Server) stopMonitor(m *monitor) {
	s.removeMonitor(m)
	m.stop()
}

// closeMonitors disconnects every monitor (Close).
func (s *Server) closeMonitors() {
	s.monMu.Lock()
	old := s.monitors.Load()
	s.monitors.Store(nil)
	s.monMu.Unlock()
	if old == nil {
		return
	}
	for _, m := range *old {
		m.stop()
		_ = m.conn.Close()
	}
}

// feedMonitors sends every monitor but from's own a line for each of cmds,
// which from is about to run.
func (s *Server) feedMonitors(mons []*monitor, from *client, name string, cmds []redcon.Command) {
	if monitorHidden[name] {
		return
	}
	now := time.Now()
	var line []byte
	for _, cmd := range cmds {
		line = appendMonitorLine(line, now, from.addr, cmd.Args)
	}
	for _, m := range mons {
		if m.cl == from {
			continue
		}
		if !m.queue(line) {
			s.dropMonitor(m, "output buffer over limit")
		}
	}
}

// appendMonitorLine appends Redis's MONITOR line for args run by the client
// at addr at now.
func appendMonitorLine(b []byte, now time.Time, addr string, args [][]byte) []byte {
	b = append(b, '+')
	b = strconv.AppendInt(b, now.Unix(), 10)
	b = append(b, '.')
	us := now.Nanosecond() / 1000
	for div := 100000; div > 0; div /= 10 {
		b = append(b, byte('0'+us/div%10))
	}
	b = append(b, " [0 "...)
	b = append(b, addr...)
	b = append(b, ']')
	for i, a := range args {
		b = append(b, ' ')
		if redacted(args, i) {
			b = append(b, `"(redacted)"`...)
			continue
		}
		b = appendRepr(b, a)
	}
	return append(b, '\r', '\n')
}

// redacted says whether args[i] is a secret: every argument of AUTH, and
// the user name and password after HELLO's AUTH.
func redacted(args [][]byte, i int) bool {
	switch {
	case i == 0:
		return false
	case is(args[0], "auth"):
		return true
	case is(args[0], "hello"):
		for j := 1; j < i && j < len(args); j++ {
			if is(args[j], "auth") && i <= j+2 {
				return true
			}
		}
	}
	return false
}

// appendRepr appends a quoted the way Redis's sdscatrepr does: \" \\ \n \r
// \t \a \b escaped, other bytes outside printable ASCII as \xhh.
func appendRepr(b, a []byte) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	for _, c := range a {
		switch c {
		case '\\', '"':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\r':
			b = append(b, '\\', 'r')
		case '\t':
			b = append(b, '\\', 't')
		case '\a':
			b = append(b, '\\', 'a')
		case '\b':
			b = append(b, '\\', 'b')
		default:
			if c >= ' ' && c <= '~' {
				b = append(b, c)
			} else {
				b = append(b, '\\', 'x', hex[c>>4], hex[c&0xf])
			}
		}
	}
	return append(b, '"')
}
