package server

import (
	"fmt"
	"strings"

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

// call is one command being executed.
type call struct {
	conn   redcon.Conn
	args   [][]byte
	broker *queue.Broker
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
// commands it consumed.
func (s *Server) execute(conn redcon.Conn, cmds []redcon.Command) int {
	s.commands.Add(1)
	args := cmds[0].Args
	if len(args) == 0 {
		return 1
	}
	name := strings.ToLower(string(args[0]))
	cmd := commands[name]
	if cmd == nil {
		conn.WriteError(fmt.Sprintf("ERR unknown command '%s'", truncate(string(args[0]), 128)))
		return 1
	}
	if cmd.arity > 0 && len(args) != cmd.arity || cmd.arity < 0 && len(args) < -cmd.arity {
		conn.WriteError(fmt.Sprintf("ERR wrong number of arguments for '%s' command", name))
		return 1
	}
	b := s.broker.Load()
	if b == nil && !cmd.whileLoading {
		conn.WriteError(errLoading)
		return 1
	}
	c := &call{conn: conn, args: args, broker: b, rest: cmds[1:]}
	cmd.run(s, c)
	return 1 + c.consumed
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}
