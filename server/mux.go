package server

import (
	"fmt"
	"strings"
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
}

var commands = map[string]*command{}

func register(cmds ...*command) {
	for _, c := range cmds {
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
	name := strings.ToLower(string(args[0]))
	cmd := commands[name]
	if cmd == nil {
		s.metrics.observe("unknown", 0)
		conn.WriteError(fmt.Sprintf("ERR unknown command '%s'", truncate(string(args[0]), 128)))
		return 1
	}
	if cmd.arity > 0 && len(args) != cmd.arity || cmd.arity < 0 && len(args) < -cmd.arity {
		conn.WriteError(fmt.Sprintf("ERR wrong number of arguments for '%s' command", name))
		return 1
	}
	cl, _ := conn.Context().(*client)
	if cl == nil {
		cl = &client{} // not accepted through accept (never in practice)
	}
	cl.touch(name)
	if s.password() != "" && !cl.authed && !noAuth[name] {
		conn.WriteError(errNoAuth)
		return 1
	}
	b := s.broker.Load()
	if b == nil && !cmd.whileLoading {
		conn.WriteError(errLoading)
		return 1
	}
	rest := cmds[1:]
	if name == "addjob" && b != nil {
		if refusal := s.refuseNewJob(); refusal != "" {
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
	}
	c := &call{conn: conn, args: args, broker: b, client: cl, rest: rest}
	start := time.Now()
	cmd.run(s, c)
	took := time.Since(start)
	s.metrics.observe(name, took)
	if !blocking(name, args) {
		s.slowlog.record(args, start, took, cl)
	}
	return 1 + c.consumed
}

// jobTooLarge says whether ADDJOB args carry a body over max-job-size.
func (s *Server) jobTooLarge(args [][]byte) bool {
	return len(args) >= 3 && int64(len(args[2])) > s.maxJobSize.Load()
}

// addJobBatchable cuts the pipeline after an ADDJOB before the first
// oversized ADDJOB of the run of ADDJOBs it starts with. cmdAddJob batches
// that run; cutting it there leaves the oversized one to the next execute,
// which refuses it, so every reply keeps its place in the order.
func (s *Server) addJobBatchable(rest []redcon.Command) []redcon.Command {
	for i, next := range rest {
		if len(next.Args) == 0 || !is(next.Args[0], "addjob") {
			break
		}
		if s.jobTooLarge(next.Args) {
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
