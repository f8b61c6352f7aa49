package server

import (
	"fmt"
	"runtime/debug"
	"time"

	"github.com/diskque/diskque/queue"
	"github.com/tidwall/redcon"
)

// command is one entry of the command table.
type command struct {
	name string
	// arity is the exact number of arguments with the name, or -n for at
	// least n (Redis's convention).
	arity int
	// whileLoading: answered before the store has finished recovering.
	whileLoading bool
	run          func(s *Server, c *call)
}

// noAuth are the commands a connection may send before AUTH when the
// server has a password (Redis: AUTH and QUIT; HELLO gets -NOAUTH, which
// go-redis takes as "no RESP3").
var noAuth = map[string]bool{"auth": true, "quit": true}

// call is one command being executed.
type call struct {
	conn   redcon.Conn
	args   [][]byte
	broker *queue.Broker
	client *client
	// rest is the pipeline after this command; a handler that consumes
	// more of it (pipelined ADDJOBs) sets consumed.
	rest     []redcon.Command
	consumed int
	// external is how ADDJOB replicates under pressure (pressure.go).
	external queue.External
	// reply is conn as the handler writes to it (conn points here).
	reply replyConn
}

var commands = map[string]*command{}

// maxCommandName bounds the length of command names: lookup lowers a name
// into a buffer of this size.
const maxCommandName = 16

func register(cmds ...*command) {
	for _, c := range cmds {
		if len(c.name) > maxCommandName {
			panic("server: command name longer than maxCommandName: " + c.name)
		}
		commands[c.name] = c
	}
}

// execute runs cmds[0] (and maybe more of the pipeline) and returns how many
// commands it consumed. The checks run in Redis's order: unknown command,
// arity, authentication, loading; then ADDJOB's max-job-size. A command that
// ran long is recorded in the slow log.
func (s *Server) execute(conn redcon.Conn, cmds []redcon.Command) int {
	s.commands.Add(1)
	args := cmds[0].Args
	if len(args) == 0 {
		return 1
	}
	cl, _ := conn.Context().(*client)
	if cl == nil {
		cl = &client{} // not accepted through accept (never in practice)
	}
	if cl.monitor != nil {
		return s.monitorMode(cl, cmds)
	}
	cmd := lookup(args[0])
	if cmd == nil {
		s.metrics.observe("unknown", 0, 1)
		conn.WriteError(fmt.Sprintf("ERR unknown command '%s'", truncate(string(args[0]), 128)))
		return 1
	}
	name := cmd.name
	if cmd.arity > 0 && len(args) != cmd.arity || cmd.arity < 0 && len(args) < -cmd.arity {
		conn.WriteError(fmt.Sprintf("ERR wrong number of arguments for '%s' command", name))
		return 1
	}
	// One clock read serves CLIENT LIST's idle time and the command's
	// duration (slowlog, metrics): it is taken for every command.
	start := time.Now()
	cl.touch(name, start)
	if s.password() != "" && !cl.authed && !noAuth[name] {
		conn.WriteError(errNoAuth)
		return 1
	}
	ref := s.useBroker()
	if ref == nil && (!cmd.whileLoading || name == "ping") {
		// The store is recovering: wait a moment for it (LoadingWait)
		// rather than answer -LOADING to a client that just saw PING
		// answered. PING waits too (then answers even while loading):
		// clients take PONG for "ready", as Disque answers nothing before
		// it is.
		ref = s.waitBroker()
	}
	defer ref.done()
	b := ref.broker()
	if b == nil && !cmd.whileLoading {
		conn.WriteError(errLoading)
		return 1
	}
	rest := cmds[1:]
	var external queue.External
	if name == "addjob" && b != nil {
		var refusal string
		if external, refusal = s.addJobPressure(b); refusal != "" {
			conn.WriteError(refusal)
			return 1
		}
	}
	if name == "addjob" {
		if s.jobTooLarge(args) {
			conn.WriteError(fmt.Sprintf(errJobTooLarge, s.maxJobSize.Load()))
			return 1
		}
		rest = s.addJobBatchable(rest)
		if !external.Required() { // external jobs write nothing here
			var reserved int64
			var ok bool
			if rest, reserved, ok = s.reserveAddJobs(b.Store(), args, rest); !ok {
				if b.ReachablePeers() == 0 {
					conn.WriteError(errNoSpace)
					return 1
				}
				external = queue.ExternalOutOfDisk
			}
			defer s.releaseDisk(reserved)
		}
	}
	c := &call{args: args, broker: b, client: cl, rest: rest, external: external}
	c.reply.Conn = conn
	c.conn = &c.reply
	if mons := s.monitors.Load(); mons != nil {
		// Fed before running, so that a GETJOB shows when it starts to
		// block. A run of pipelined ADDJOBs is fed whole: rest is exactly
		// what cmdAddJob will consume.
		fed := cmds[:1]
		if name == "addjob" {
			fed = cmds[:1+len(rest)]
		}
		s.feedMonitors(*mons, cl, name, fed)
		start = time.Now() // feeding monitors is not the command's time
	}
	s.run(cmd, c)
	took := time.Since(start)
	// Pipelined ADDJOBs run as one batch but are as many commands, for
	// INFO and /metrics alike; each gets its share of the batch's time.
	if c.consumed > 0 {
		s.commands.Add(int64(c.consumed))
	}
	s.metrics.observe(name, took, 1+c.consumed)
	if !blocking(name, args) {
		s.slowlog.record(args, start, took, cl)
	}
	return 1 + c.consumed
}

// run runs the command's handler. A handler that panics — a bug — is logged
// with its stack at ERROR and answered "-ERR internal error" (one reply per
// command it consumed), and the connection and the server carry on. If it
// had already written part of a reply, which cannot be taken back, the
// connection is closed instead: the client would otherwise read the rest
// of the stream out of step with its commands.
func (s *Server) run(cmd *command, c *call) {
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		s.opts.Logger.Error("server: command handler panicked; replying -ERR internal error",
			"command", cmd.name, "client", c.client.addr, "panic", v, "stack", string(debug.Stack()),
			"connection_closed", c.reply.wrote)
		if c.reply.wrote {
			c.reply.Conn.Close()
			return
		}
		for range 1 + c.consumed {
			c.reply.Conn.WriteError(errInternal)
		}
	}()
	cmd.run(s, c)
}

// replyConn is the connection as handlers see it: it notes whether the
// handler has written anything, for run's recovery from a panic.
type replyConn struct {
	redcon.Conn
	wrote bool
}

func (r *replyConn) WriteError(msg string)       { r.wrote = true; r.Conn.WriteError(msg) }
func (r *replyConn) WriteString(str string)      { r.wrote = true; r.Conn.WriteString(str) }
func (r *replyConn) WriteBulk(bulk []byte)       { r.wrote = true; r.Conn.WriteBulk(bulk) }
func (r *replyConn) WriteBulkString(bulk string) { r.wrote = true; r.Conn.WriteBulkString(bulk) }
func (r *replyConn) WriteInt(num int)            { r.wrote = true; r.Conn.WriteInt(num) }
func (r *replyConn) WriteInt64(num int64)        { r.wrote = true; r.Conn.WriteInt64(num) }
func (r *replyConn) WriteUint64(num uint64)      { r.wrote = true; r.Conn.WriteUint64(num) }
func (r *replyConn) WriteArray(count int)        { r.wrote = true; r.Conn.WriteArray(count) }
func (r *replyConn) WriteNull()                  { r.wrote = true; r.Conn.WriteNull() }
func (r *replyConn) WriteRaw(data []byte)        { r.wrote = true; r.Conn.WriteRaw(data) }
func (r *replyConn) WriteAny(v any)              { r.wrote = true; r.Conn.WriteAny(v) }

// lookup finds the command named (in any case) by arg. It lowers the name
// into a stack buffer rather than a new string: every command goes through
// here.
func lookup(arg []byte) *command {
	var buf [maxCommandName]byte
	if len(arg) > len(buf) {
		return nil
	}
	lower := buf[:len(arg)]
	for i, c := range arg {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		lower[i] = c
	}
	return commands[string(lower)] // no allocation: a map index by converted bytes
}

// jobTooLarge says whether ADDJOB args carry a body over max-job-size.
func (s *Server) jobTooLarge(args [][]byte) bool {
	return len(args) >= 3 && int64(len(args[2])) > s.maxJobSize.Load()
}

// addJobBatchable returns the ADDJOBs that follow an ADDJOB in the pipeline
// and share its commit — exactly what cmdAddJob consumes: the run of ADDJOBs
// up to MaxPipelineBatch in all, cut before the first oversized one, which
// is left to the next execute to refuse, so every reply keeps its place in
// the order.
func (s *Server) addJobBatchable(rest []redcon.Command) []redcon.Command {
	for i, next := range rest {
		if i+1 >= s.opts.MaxPipelineBatch || len(next.Args) == 0 || !is(next.Args[0], "addjob") ||
			s.jobTooLarge(next.Args) {
			return rest[:i]
		}
	}
	return rest
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
