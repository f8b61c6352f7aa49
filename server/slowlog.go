package server

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tidwall/redcon"
)

// SLOWLOG GET [n] | LEN | RESET: the commands that ran longer than
// slowlog-log-slower-than, newest first, as Redis keeps them.

func init() {
	register(&command{name: "slowlog", arity: -2, whileLoading: true, run: cmdSlowlog})
}

// Limits of what an entry keeps of a command's arguments (Redis's).
const (
	slowlogMaxArgs     = 32
	slowlogMaxArgBytes = 128
)

// slowlog is a bounded list of slow commands, guarded by mu.
type slowlog struct {
	// threshold mirrors slowerThan, or is negative when nothing is logged
	// (slowerThan < 0 or maxLen 0): every command checks it, and only those
	// that pass take mu, which would otherwise serialise all clients.
	threshold atomic.Int64

	mu         sync.Mutex
	slowerThan time.Duration // negative: off
	maxLen     int
	nextID     int64
	entries    []slowEntry // oldest first
}

type slowEntry struct {
	id       int64
	at       time.Time
	duration time.Duration
	args     []string
	addr     string
	name     string
}

// SetSlowlog changes slowlog-log-slower-than (negative disables the log, 0
// logs every command) and slowlog-max-len (the oldest entries beyond it
// are dropped).
func (s *Server) SetSlowlog(slowerThan time.Duration, maxLen int) {
	l := &s.slowlog
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slowerThan, l.maxLen = slowerThan, max(maxLen, 0)
	if l.maxLen == 0 {
		l.threshold.Store(-1)
	} else {
		l.threshold.Store(int64(l.slowerThan))
	}
	l.trim()
}

func (l *slowlog) trim() {
	if over := len(l.entries) - l.maxLen; over > 0 {
		l.entries = append(l.entries[:0], l.entries[over:]...)
	}
}

// record logs the command args that started at start and took d, if slow.
func (l *slowlog) record(args [][]byte, start time.Time, d time.Duration, cl *client) {
	if t := l.threshold.Load(); t < 0 || int64(d) < t {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.slowerThan < 0 || d < l.slowerThan || l.maxLen == 0 {
		return
	}
	n := min(len(args), slowlogMaxArgs)
	kept := make([]string, 0, n)
	for i, a := range args[:n] {
		if i == slowlogMaxArgs-1 && len(args) > slowlogMaxArgs {
			kept = append(kept, fmt.Sprintf("... (%d more arguments)", len(args)-slowlogMaxArgs+1))
			break
		}
		if len(a) > slowlogMaxArgBytes {
			kept = append(kept, fmt.Sprintf("%s... (%d more bytes)", a[:slowlogMaxArgBytes], len(a)-slowlogMaxArgBytes))
			continue
		}
		kept = append(kept, string(a))
	}
	cl.mu.Lock()
	name := cl.name
	cl.mu.Unlock()
	l.entries = append(l.entries, slowEntry{id: l.nextID, at: start, duration: d, args: kept, addr: cl.addr, name: name})
	l.nextID++
	l.trim()
}

// blocking says whether a command may wait for jobs: its waiting is not
// slowness (Redis leaves blocked time out of the slow log too).
func blocking(name string, args [][]byte) bool {
	if name != "getjob" {
		return false
	}
	for _, a := range args[1:] {
		if is(a, "nohang") {
			return false
		}
	}
	return true
}

func cmdSlowlog(s *Server, c *call) {
	l := &s.slowlog
	switch strings.ToLower(string(c.args[1])) {
	case "get":
		if len(c.args) > 3 {
			c.conn.WriteError("ERR wrong number of arguments for 'slowlog|get' command")
			return
		}
		want := int64(10)
		if len(c.args) == 3 {
			n, ok := parseInt(c.args[2])
			if !ok || n < -1 {
				c.conn.WriteError("ERR count should be greater than or equal to -1")
				return
			}
			want = n
		}
		l.mu.Lock()
		var out []slowEntry
		for i := len(l.entries) - 1; i >= 0 && (want < 0 || int64(len(out)) < want); i-- {
			out = append(out, l.entries[i])
		}
		l.mu.Unlock()
		c.conn.WriteArray(len(out))
		for _, e := range out {
			writeSlowEntry(c.conn, e)
		}
	case "len":
		l.mu.Lock()
		n := len(l.entries)
		l.mu.Unlock()
		c.conn.WriteInt(n)
	case "reset":
		l.mu.Lock()
		l.entries = nil
		l.mu.Unlock()
		c.conn.WriteString("OK")
	default:
		c.conn.WriteError(fmt.Sprintf("ERR unknown SLOWLOG subcommand '%s'", truncate(string(c.args[1]), 64)))
	}
}

// writeSlowEntry: [id, unix time, duration µs, [args…], addr, name].
func writeSlowEntry(conn redcon.Conn, e slowEntry) {
	conn.WriteArray(6)
	conn.WriteInt64(e.id)
	conn.WriteInt64(e.at.Unix())
	conn.WriteInt64(e.duration.Microseconds())
	conn.WriteArray(len(e.args))
	for _, a := range e.args {
		conn.WriteBulkString(a)
	}
	conn.WriteBulkString(e.addr)
	conn.WriteBulkString(e.name)
}
