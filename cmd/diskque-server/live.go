package main

import (
	"bufio"
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/internal/durable"
	"github.com/diskque/diskque/server"
)

// liveConfig is the running configuration behind CONFIG (server.Config):
// it owns cfg and the config file, and applies CONFIG SET to the server,
// the store (appendfsync, at once) and the logger. appendonly is kept for
// the next start: this run goes on in the mode it started in (see
// setAppendOnly). Safe for concurrent use.
type liveConfig struct {
	mu    sync.Mutex
	cfg   config
	srv   *server.Server // set once, before the server serves
	level *slog.LevelVar
	log   *slog.Logger
	// appendOnly is the mode this run started in, which cfg.AppendOnly
	// (what CONFIG SET stored, and CONFIG REWRITE saves) may differ from
	// until the next start.
	appendOnly bool
	// node is the store's owner, once there is one (attach); until then
	// appendfsync is only recorded, and attach hands it over.
	node *node
	// cluster is membership, once it runs (attachCluster).
	cluster nodeTimeouter
}

var _ server.Config = (*liveConfig)(nil)

// runtimeDirectives are those CONFIG SET may change.
var runtimeDirectives = map[string]bool{
	"loglevel": true, "requirepass": true, "maxclients": true, "max-job-size": true,
	"min-free-disk": true, "maxmemory": true,
	"slowlog-log-slower-than": true, "slowlog-max-len": true,
	"appendfsync": true, "appendonly": true, "cluster-node-timeout": true,
}

// redacted is what CONFIG GET shows of a cluster-secret that is set: a
// secret is not for clients to read (CONFIG REWRITE still writes it).
const redacted = "(redacted)"

func (l *liveConfig) Get(glob string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, name := range directives {
		if ok, _ := path.Match(strings.ToLower(glob), name); ok {
			v := l.cfg.value(name)
			if name == "cluster-secret" && v != "" {
				v = redacted
			}
			out = append(out, name, v)
		}
	}
	return out
}

func (l *liveConfig) Set(name, value string) error {
	name = strings.ToLower(name)
	if !slices.Contains(directives, name) {
		return server.ErrConfigUnknown
	}
	if !runtimeDirectives[name] {
		return server.ErrConfigRestart
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	next := l.cfg
	if err := next.set(name, []string{value}); err != nil {
		return err
	}
	prev := l.cfg
	l.cfg = next
	l.apply()
	switch name {
	case "appendfsync":
		if l.node != nil && next.AppendFsync != prev.AppendFsync {
			l.node.setSync(next.AppendFsync)
		}
		l.log.Info("appendfsync applies now", "appendfsync", next.AppendFsync.String(), "was", prev.AppendFsync.String())
	case "appendonly":
		l.logAppendOnly(prev.AppendOnly)
	case "cluster-node-timeout":
		if l.cluster != nil {
			l.cluster.SetNodeTimeout(time.Duration(next.ClusterNodeTimeout) * time.Millisecond)
		}
	}
	return nil
}

// nodeTimeouter is what CONFIG SET cluster-node-timeout needs of
// membership (*replication.Membership).
type nodeTimeouter interface {
	SetNodeTimeout(time.Duration)
}

// attachCluster makes m the membership CONFIG SET cluster-node-timeout
// applies to, first handing it a value set before it existed.
func (l *liveConfig) attachCluster(m nodeTimeouter) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cluster = m
	m.SetNodeTimeout(time.Duration(l.cfg.ClusterNodeTimeout) * time.Millisecond)
}

// attach makes n the store CONFIG SET appendfsync switches, first handing
// it a switch made before it existed (the server answers CONFIG while the
// store opens).
func (l *liveConfig) attach(n *node) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.node = n
	n.setSync(l.cfg.AppendFsync)
}

// logAppendOnly says what CONFIG SET appendonly will do: nothing until the
// next start. Switching a running store between disk and memory would
// mean copying every job one way or dropping them the other; a restart
// does it plainly (with CONFIG REWRITE saving the setting for it). l.mu is
// held.
func (l *liveConfig) logAppendOnly(was bool) {
	now, dir := l.cfg.AppendOnly, l.cfg.Dir
	switch {
	case now == l.appendOnly && now != was:
		l.log.Info("CONFIG SET appendonly: back to the mode this run started in; a restart changes nothing", "appendonly", l.cfg.value("appendonly"))
	case now == l.appendOnly:
	case now:
		l.log.Warn("CONFIG SET appendonly yes applies at the next start: until then jobs stay in memory only and a restart loses "+
			"them; the next start keeps jobs on disk in dir (CONFIG REWRITE saves the setting for it)", "dir", dir)
	default:
		l.log.Warn("CONFIG SET appendonly no applies at the next start: until then jobs are still written to disk in dir; "+
			"the next start keeps jobs in memory only and does not read dir, whose jobs stay there until a start with appendonly yes "+
			"(CONFIG REWRITE saves the setting for it)", "dir", dir)
	}
}

// maxMemory is maxmemory as CONFIG SET left it.
func (l *liveConfig) maxMemory() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cfg.MaxMemory
}

// apply pushes the run-time settings of l.cfg to the server and the
// logger. l.mu is held.
func (l *liveConfig) apply() {
	c := &l.cfg
	l.level.Set(c.LogLevel)
	l.srv.SetRequirePass(c.RequirePass)
	l.srv.SetMaxClients(c.MaxClients)
	l.srv.SetMaxJobSize(c.MaxJobSize)
	l.srv.SetMinFreeDisk(c.MinFreeDisk)
	l.srv.SetMaxMemory(c.MaxMemory)
	l.srv.SetSlowlog(slowlogThreshold(c.SlowlogSlowerThan), c.SlowlogMaxLen)
	l.srv.SetPersistence(c.AppendFsync.String(), c.AppendOnly)
}

// slowlogThreshold: µs to a duration, negative kept negative (off).
func slowlogThreshold(us int64) time.Duration {
	if us < 0 {
		return -1
	}
	return time.Duration(us) * time.Microsecond
}

// Rewrite saves the running configuration into the config file: each
// directive line of the file gets the current value (repeated ones are
// dropped), comments, blank lines and includes stay where they are, and
// the directives the file lacks are appended when they differ from the
// defaults. The new file replaces the old atomically.
func (l *liveConfig) Rewrite() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	file := l.cfg.ConfigFile
	if file == "" {
		return server.ErrNoConfigFile
	}
	old, err := os.ReadFile(file)
	if err != nil {
		return fmt.Errorf("config rewrite: %w", err)
	}
	return writeFileAtomic(file, rewriteConfig(old, &l.cfg))
}

// rewriteConfig returns the config file old updated to cfg.
func rewriteConfig(old []byte, cfg *config) []byte {
	def := defaultConfig()
	var out bytes.Buffer
	seen := map[string]bool{}
	sc := bufio.NewScanner(bytes.NewReader(old))
	for sc.Scan() {
		line := sc.Text()
		fields := strings.Fields(line)
		if len(fields) > 0 && !strings.HasPrefix(fields[0], "#") {
			name := strings.ToLower(fields[0])
			if slices.Contains(directives, name) {
				if seen[name] {
					continue
				}
				seen[name] = true
				line = directiveLine(name, cfg.value(name))
			}
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	appended := false
	for _, name := range directives {
		if seen[name] || cfg.value(name) == def.value(name) {
			continue
		}
		if name == "cluster-bus-port" && cfg.ClusterBusPort < 0 {
			// port + 10000, not a setting: written out, it would outlive a
			// later change of port.
			continue
		}
		if name == "aof-segment-size" && cfg.AOFSegmentSize == 0 {
			// The mode's default (4mb with appendonly no), not a setting:
			// written out, it would outlive a later switch of appendonly.
			continue
		}
		if !appended {
			out.WriteString("# Generated by CONFIG REWRITE\n")
			appended = true
		}
		out.WriteString(directiveLine(name, cfg.value(name)))
		out.WriteByte('\n')
	}
	return out.Bytes()
}

func directiveLine(name, value string) string {
	if value == "" {
		value = `""`
	}
	return name + " " + value
}

// writeFileAtomic replaces name with data, crash-safely (durable.WriteFile),
// keeping the file's permissions: a config file may hold requirepass.
func writeFileAtomic(name string, data []byte) error {
	mode := os.FileMode(0o644)
	if fi, err := os.Stat(name); err == nil {
		mode = fi.Mode().Perm()
	}
	if err := durable.WriteFile(vfs.Default, name, data, mode); err != nil {
		return fmt.Errorf("config rewrite: %w", err)
	}
	return nil
}
