package server

import (
	"errors"
	"fmt"
	"strings"
)

// CONFIG GET | SET | REWRITE | RESETSTAT. The daemon owns the directives
// and the config file; the server reaches them through Options.Config.

func init() {
	register(&command{name: "config", arity: -2, whileLoading: true, run: cmdConfig})
}

// Config is the daemon's configuration as CONFIG sees it. Its methods may be
// called from many connections at once. Set applies a directive at run
// time: for the server's own settings it calls the Server's setters
// (SetRequirePass, SetMaxClients, SetMaxJobSize, SetSlowlog).
type Config interface {
	// Get returns name, value pairs of the directives whose names match
	// glob (path.Match syntax, lower case), in a stable order.
	Get(glob string) []string
	// Set changes one directive. It fails with ErrConfigUnknown,
	// ErrConfigRestart or an error saying why the value is invalid.
	Set(name, value string) error
	// Rewrite saves the running configuration into the config file the
	// server was started with (ErrNoConfigFile without one).
	Rewrite() error
}

// Errors a Config returns.
var (
	// ErrConfigUnknown: no such directive.
	ErrConfigUnknown = errors.New("server: unknown config directive")
	// ErrConfigRestart: the directive cannot change while running.
	ErrConfigRestart = errors.New("server: config directive needs a restart")
	// ErrNoConfigFile: CONFIG REWRITE without a config file.
	ErrNoConfigFile = errors.New("server: running without a config file")
)

func cmdConfig(s *Server, c *call) {
	sub := strings.ToLower(string(c.args[1]))
	wantArgs := map[string]int{"get": 3, "set": 4, "rewrite": 2, "resetstat": 2}
	n, ok := wantArgs[sub]
	if !ok {
		c.conn.WriteError(fmt.Sprintf("ERR unknown CONFIG subcommand '%s'", truncate(string(c.args[1]), 64)))
		return
	}
	if len(c.args) != n {
		c.conn.WriteError(fmt.Sprintf("ERR wrong number of arguments for 'config|%s' command", sub))
		return
	}
	cfg := s.opts.Config
	switch sub {
	case "get":
		var pairs []string
		if cfg != nil {
			pairs = cfg.Get(strings.ToLower(string(c.args[2])))
		}
		c.conn.WriteArray(len(pairs))
		for _, p := range pairs {
			c.conn.WriteBulkString(p)
		}
	case "set":
		name := strings.ToLower(string(c.args[2]))
		err := ErrConfigUnknown
		if cfg != nil {
			err = cfg.Set(name, string(c.args[3]))
		}
		if err != nil {
			c.conn.WriteError(configError(name, err))
			return
		}
		s.opts.Logger.Info("CONFIG SET", "directive", name, "addr", c.client.addr)
		c.conn.WriteString("OK")
	case "rewrite":
		err := ErrNoConfigFile
		if cfg != nil {
			err = cfg.Rewrite()
		}
		if err != nil {
			c.conn.WriteError(configError("", err))
			return
		}
		c.conn.WriteString("OK")
	case "resetstat":
		s.ResetStats()
		c.conn.WriteString("OK")
	}
}

// ResetStats zeroes the server's counters INFO Stats reports
// (total_connections_received, total_commands_processed). The broker's job
// counters are left alone.
func (s *Server) ResetStats() {
	s.commands.Store(0)
	s.conns.Store(0)
}
