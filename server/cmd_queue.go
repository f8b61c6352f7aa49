package server

import (
	"strings"

	"github.com/diskque/diskque/storage"
)

func init() {
	register(
		&command{name: "qlen", arity: 2, run: cmdQLen},
		&command{name: "qpeek", arity: 3, run: cmdQPeek},
		&command{name: "qstat", arity: 2, run: cmdQStat},
		&command{name: "pause", arity: -3, run: cmdPause},
	)
}

func cmdQLen(s *Server, c *call) {
	c.conn.WriteInt64(c.broker.QueueLen(string(c.args[1])))
}

// cmdQStat: QSTAT queue — the 20-element array of SPEC.md, read by
// position, or a null array when there is no such queue.
func cmdQStat(s *Server, c *call) {
	st, ok := c.broker.QueueStat(string(c.args[1]))
	if !ok {
		c.conn.WriteRaw([]byte("*-1\r\n"))
		return
	}
	c.conn.WriteArray(20)
	field := func(k string) { c.conn.WriteBulkString(k) }
	field("name")
	c.conn.WriteBulkString(st.Name)
	field("len")
	c.conn.WriteInt64(st.Len)
	field("age")
	c.conn.WriteInt64(st.Age)
	field("idle")
	c.conn.WriteInt64(st.Idle)
	field("blocked")
	c.conn.WriteInt(st.Blocked)
	field("import-from")
	c.conn.WriteArray(len(st.ImportFrom))
	for _, n := range st.ImportFrom {
		c.conn.WriteBulkString(n)
	}
	field("import-rate")
	c.conn.WriteInt64(st.ImportRate)
	field("jobs-in")
	c.conn.WriteInt64(st.JobsIn)
	field("jobs-out")
	c.conn.WriteInt64(st.JobsOut)
	field("pause")
	c.conn.WriteBulkString(st.Pause.String())
}

// cmdQPeek: QPEEK queue count — oldest first; a negative count, newest first.
func cmdQPeek(s *Server, c *call) {
	n, ok := parseInt(c.args[2])
	if !ok {
		c.conn.WriteError(errNotInteger)
		return
	}
	newest := n < 0
	if newest {
		n = -n
	}
	jobs, err := c.broker.Peek(string(c.args[1]), int(min(n, 1<<20)), newest)
	if err != nil {
		c.conn.WriteError(errorReply(err))
		return
	}
	c.conn.WriteArray(len(jobs))
	for _, j := range jobs {
		c.conn.WriteArray(3)
		c.conn.WriteBulkString(j.Queue)
		c.conn.WriteBulkString(j.ID)
		c.conn.WriteBulk(j.Body)
		c.client.outBytes += int64(len(j.Body))
	}
}

// cmdPause: PAUSE queue option… with options in, out, all, none, state and
// bcast. in/out/all/none set the state (in and out combine); state alone
// only reports it. The reply is the resulting state.
func cmdPause(s *Server, c *call) {
	name := string(c.args[1])
	var set storage.PauseState
	change, bcast := false, false
	for _, a := range c.args[2:] {
		switch strings.ToLower(string(a)) {
		case "in":
			set |= storage.PauseIn
			change = true
		case "out":
			set |= storage.PauseOut
			change = true
		case "all":
			set |= storage.PauseAll
			change = true
		case "none":
			change = true
		case "state":
		case "bcast":
			bcast = true // the resulting state, to every other node
		default:
			c.conn.WriteError(errSyntax)
			return
		}
	}
	state := c.broker.PauseState(name)
	if change {
		var err error
		if state, err = c.broker.Pause(name, set); err != nil {
			c.conn.WriteError(errorReply(err))
			return
		}
	}
	if bcast {
		c.broker.BroadcastPause(name, state)
	}
	c.conn.WriteString(state.String())
}
