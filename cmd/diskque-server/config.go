package main

import (
	"bufio"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/diskque/diskque/server"
	"github.com/diskque/diskque/wal"
)

// config is the daemon's settings: Disque's directive names, from a config
// file (first argument) and then from --name value flags, which win.
type config struct {
	Port        int
	Bind        string
	Dir         string
	AppendOnly  bool
	AppendFsync wal.SyncPolicy
	LogLevel    slog.Level
	LogFile     string
	PidFile     string
	ConfigFile  string
	RequirePass string
	MaxClients  int
	MaxJobSize  int64
	// MinFreeDisk and MaxMemory are bytes (0: off); see server.Options.
	MinFreeDisk int64
	MaxMemory   int64
	// SlowlogSlowerThan is slowlog-log-slower-than in µs (negative: off).
	SlowlogSlowerThan int64
	SlowlogMaxLen     int
	// MetricsAddr, when set, is where /metrics is served over HTTP.
	MetricsAddr string
	// Pprof (pprof yes) also serves Go's profiler on MetricsAddr, under
	// /debug/pprof/. Off by default: it has no authentication.
	Pprof bool
	// AOFSegmentSize is the AOF segment size in bytes; 0 means the default
	// for the mode (segmentSize).
	AOFSegmentSize int64
	// GCInterval is how often the segment collector looks for work, in
	// seconds (0: no background collection; BGREWRITEAOF still works).
	GCInterval int
	// GCMinLiveRatio: segments less live than this are rewritten.
	GCMinLiveRatio float64
	// RebuildIndex (--rebuild-index, not a directive): set the index aside
	// and rebuild it from the AOF at this start.
	RebuildIndex bool
	// ClusterNodeTimeout is cluster-node-timeout in ms: it drives failure
	// detection (a killed node is "fail" within about twice it).
	ClusterNodeTimeout int64
	// ClusterBusPort is cluster-bus-port as set, or -1 when it was not:
	// then the bus listens on port + 10000 (busPort).
	ClusterBusPort int
	// ClusterSecret authenticates the bus and keys gossip encryption ("":
	// an open bus).
	ClusterSecret string
	// BindSourceAddr is bind-source-addr: the source IP of outgoing bus
	// and gossip connections ("": bind's, when bind is one specific IP;
	// see sourceAddr).
	BindSourceAddr string
	// ClusterAnnounceIP, ClusterAnnouncePort and ClusterAnnounceBusPort are
	// what peers (and HELLO's clients) are told instead of the addresses
	// this node listens on ("" and 0: not set), for a node behind NAT, a
	// port forward or a fault proxy (Redis Cluster's names).
	ClusterAnnounceIP      string
	ClusterAnnouncePort    int
	ClusterAnnounceBusPort int
}

func defaultConfig() config {
	return config{
		Port:        7711,
		Bind:        "127.0.0.1",
		Dir:         "./data",
		AppendOnly:  true,
		AppendFsync: wal.SyncEverySec,
		LogLevel:    slog.LevelInfo,
		MaxClients:  server.DefaultMaxClients,
		MaxJobSize:  server.DefaultMaxJobSize,
		MinFreeDisk: defaultMinFreeDisk,

		SlowlogSlowerThan: server.DefaultSlowlogSlowerThan.Microseconds(),
		SlowlogMaxLen:     server.DefaultSlowlogMaxLen,

		GCInterval:     10,
		GCMinLiveRatio: 0.5,

		ClusterNodeTimeout: defaultClusterNodeTimeout,
		ClusterBusPort:     -1,
	}
}

const usage = `usage: diskque-server [config-file] [--directive value ...]
       diskque-server check --dir PATH [--repair]   (verify a data directory; see check --help)

  --rebuild-index               set the index aside (index.broken-<time>) and rebuild it
                                from the append-only file at this start; a missing or
                                corrupt index is rebuilt without being asked

Directives (in the config file as "directive value", or as --directive value):
  port N                        TCP port (default 7711)
  bind ADDR                     address to listen on (default 127.0.0.1); on any
                                other address, without requirepass only loopback
                                clients are served
  dir PATH                      data directory (default ./data)
  appendonly yes|no             keep jobs on disk (default yes); no = memory only
  appendfsync always|everysec|no  when the AOF is fsynced (default everysec)
  loglevel debug|verbose|notice|warning  (default notice)
  logfile PATH                  log to a file instead of stderr
  pidfile PATH                  write the process id here
  requirepass PASSWORD          clients must AUTH with it first (default none)
  maxclients N                  most connected clients (default 10000)
  max-job-size BYTES            largest ADDJOB body; 65536, 64kb, 64mb, 1gb
                                (default 64mb)
  min-free-disk BYTES           below this much free disk, ADDJOB gets -NOSPACE
                                (default 64mb; 0 = off)
  maxmemory BYTES               above this much live memory, ADDJOB gets
                                -OOM (default 0 = off)
  slowlog-log-slower-than US    log commands slower than US microseconds in
                                SLOWLOG (default 10000; 0 = all; negative = off)
  slowlog-max-len N             SLOWLOG entries kept (default 128)
  metrics-addr HOST:PORT        serve Prometheus metrics over HTTP at
                                http://HOST:PORT/metrics (default: off); no
                                authentication, requirepass or not: a
                                non-loopback address logs a warning at start
  pprof yes|no                  also serve Go's profiler (heap, goroutines, CPU
                                profile, trace) at http://HOST:PORT/debug/pprof/
                                on metrics-addr, which it needs (default no)
  aof-segment-size BYTES        AOF segment file size, 4kb..1gb (default 64mb;
                                4mb with appendonly no)
  gc-interval SECONDS           how often the segment collector looks for
                                sparse AOF segments to rewrite (default 10;
                                0 = only on BGREWRITEAOF)
  gc-min-live-ratio R           rewrite segments whose live job bodies are
                                less than R of their bytes (default 0.5)
  cluster-node-timeout MS       failure detection: a node that stops answering is
                                flagged fail within about twice this (default
                                15000, Disque's)
  cluster-bus-port N            the cluster bus port, for gossip and job traffic
                                (default port + 10000, as Disque; 0, or port 0,
                                picks a free one); it listens where bind says
  cluster-secret SECRET         authenticate the cluster bus and encrypt gossip
                                with a key derived from SECRET; every node
                                needs the same (default none: an open bus).
                                CONFIG GET shows it as "(redacted)"
  bind-source-addr IP           source address of outgoing cluster bus connections
                                (default: bind's, when bind is one specific IP)
  cluster-announce-ip IP        the IP peers and HELLO are told for this node's
                                client and bus ports (default: bind's, or
                                127.0.0.1 when bind is a wildcard)
  cluster-announce-port N       the client port peers and HELLO are told
                                (default 0: port)
  cluster-announce-bus-port N   the bus port peers are told and dial (default
                                0: the one it listens on); for NAT, a port
                                forward or a proxy in front of the bus
  include PATH                  (config file only) read another config file

A relative dir is relative to the working directory, and the server chdirs
into dir at start (as Disque does): a relative logfile or pidfile lands in it.

At run time CONFIG GET reads these, CONFIG SET changes loglevel, requirepass,
maxclients, max-job-size, min-free-disk, maxmemory, appendfsync,
cluster-node-timeout and the slowlog ones at once, and appendonly for the next start (INFO persistence shows
aof_enabled_after_restart); the rest need a restart. CONFIG REWRITE saves them
into the config file given at start.
`

// parseArgs reads the optional config file and the flags.
func parseArgs(args []string) (config, error) {
	cfg := defaultConfig()
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		// Absolute: the daemon chdirs into dir before CONFIG REWRITE
		// writes the file back.
		file, err := filepath.Abs(args[0])
		if err != nil {
			return cfg, fmt.Errorf("config: %w", err)
		}
		cfg.ConfigFile = file
		if err := cfg.loadFile(file, 0); err != nil {
			return cfg, err
		}
		args = args[1:]
	}
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "-h" || a == "--help" || a == "-help" {
			return cfg, errHelp
		}
		if a == "--rebuild-index" {
			// Not a directive: what this start does, not how the server runs.
			cfg.RebuildIndex = true
			continue
		}
		name, ok := strings.CutPrefix(a, "--")
		if !ok || name == "" {
			return cfg, fmt.Errorf("unexpected argument %q (flags are --directive value)", a)
		}
		var value string
		if n, v, found := strings.Cut(name, "="); found {
			name, value = n, v
		} else {
			if i+1 >= len(args) {
				return cfg, fmt.Errorf("--%s needs a value", name)
			}
			i++
			value = args[i]
		}
		if name == "include" {
			return cfg, fmt.Errorf("--include is only valid in a config file")
		}
		if err := cfg.set(name, []string{value}); err != nil {
			return cfg, err
		}
	}
	if cfg.Pprof && cfg.MetricsAddr == "" {
		return cfg, fmt.Errorf("pprof yes needs metrics-addr: the profiler is served there")
	}
	if cfg.ClusterBusPort < 0 && cfg.Port+busPortOffset > 65535 {
		return cfg, fmt.Errorf("port %d: the default cluster-bus-port, port + %d, is above 65535; set cluster-bus-port",
			cfg.Port, busPortOffset)
	}
	return cfg, nil
}

var errHelp = fmt.Errorf("help requested")

func (c *config) loadFile(path string, depth int) error {
	if depth > 8 {
		return fmt.Errorf("%s: includes nested too deep", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	line := 0
	for sc.Scan() {
		line++
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		name, vals := strings.ToLower(fields[0]), fields[1:]
		if name == "include" {
			if len(vals) != 1 {
				return fmt.Errorf("%s:%d: include takes one path", path, line)
			}
			inc := vals[0]
			if !filepath.IsAbs(inc) {
				inc = filepath.Join(filepath.Dir(path), inc)
			}
			if err := c.loadFile(inc, depth+1); err != nil {
				return err
			}
			continue
		}
		if err := c.set(name, vals); err != nil {
			return fmt.Errorf("%s:%d: %w", path, line, err)
		}
	}
	return sc.Err()
}

// set applies one directive.
func (c *config) set(name string, vals []string) error {
	name = strings.ToLower(name)
	if len(vals) != 1 {
		return fmt.Errorf("%s takes one value", name)
	}
	v := vals[0]
	switch name {
	case "port":
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("port: %q is not a port number", v)
		}
		c.Port = p
	case "bind":
		c.Bind = v
	case "dir":
		c.Dir = v
	case "appendonly":
		b, err := parseYesNo(name, v)
		if err != nil {
			return err
		}
		c.AppendOnly = b
	case "appendfsync":
		p, err := wal.ParseSyncPolicy(v)
		if err != nil {
			return fmt.Errorf("appendfsync: want always, everysec or no, got %q", v)
		}
		c.AppendFsync = p
	case "loglevel":
		switch strings.ToLower(v) {
		case "debug":
			c.LogLevel = slog.LevelDebug
		case "verbose", "notice", "info":
			c.LogLevel = slog.LevelInfo
		case "warning", "warn":
			c.LogLevel = slog.LevelWarn
		default:
			return fmt.Errorf("loglevel: want debug, verbose, notice or warning, got %q", v)
		}
	case "logfile":
		c.LogFile = v
	case "pidfile":
		c.PidFile = v
	case "requirepass":
		if v == `""` {
			v = "" // requirepass "" in a config file: no password
		}
		c.RequirePass = v
	case "maxclients":
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("maxclients: want a number of clients of at least 1, got %q", v)
		}
		c.MaxClients = n
	case "max-job-size":
		n, err := parseBytes(v)
		if err != nil || n < 1 || n > maxJobSizeLimit {
			return fmt.Errorf("max-job-size: want a size from 1 byte to 1gb (65536, 64kb, 64mb, 1gb), got %q", v)
		}
		c.MaxJobSize = n
	case "min-free-disk", "maxmemory":
		n, err := parseBytes(v)
		if err != nil || n < 0 {
			return fmt.Errorf("%s: want a size in bytes (0, 65536, 64mb, 2gb), got %q", name, v)
		}
		if name == "maxmemory" {
			c.MaxMemory = n
		} else {
			c.MinFreeDisk = n
		}
	case "slowlog-log-slower-than":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > math.MaxInt64/1000 {
			return fmt.Errorf("slowlog-log-slower-than: want a number of microseconds, got %q", v)
		}
		c.SlowlogSlowerThan = n
	case "metrics-addr":
		if v == `""` {
			v = ""
		}
		c.MetricsAddr = v
	case "pprof":
		b, err := parseYesNo(name, v)
		if err != nil {
			return err
		}
		c.Pprof = b
	case "aof-segment-size":
		n, err := parseBytes(v)
		if err != nil || n < 4096 || n > 1<<30 {
			return fmt.Errorf("aof-segment-size: want a size from 4kb to 1gb, got %q", v)
		}
		c.AOFSegmentSize = n
	case "gc-interval":
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 86400 {
			return fmt.Errorf("gc-interval: want a number of seconds from 0 to 86400, got %q", v)
		}
		c.GCInterval = n
	case "gc-min-live-ratio":
		r, err := strconv.ParseFloat(v, 64)
		if err != nil || !(r > 0 && r <= 1) {
			return fmt.Errorf("gc-min-live-ratio: want a ratio above 0 and at most 1, got %q", v)
		}
		c.GCMinLiveRatio = r
	case "slowlog-max-len":
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 1<<20 {
			return fmt.Errorf("slowlog-max-len: want a number of entries from 0 to 1048576, got %q", v)
		}
		c.SlowlogMaxLen = n
	case "cluster-node-timeout":
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < minClusterNodeTimeout || n > maxClusterNodeTimeout {
			return fmt.Errorf("cluster-node-timeout: want a number of milliseconds from %d to %d, got %q",
				minClusterNodeTimeout, maxClusterNodeTimeout, v)
		}
		c.ClusterNodeTimeout = n
	case "cluster-bus-port":
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("cluster-bus-port: %q is not a port number (0 picks a free one)", v)
		}
		c.ClusterBusPort = p
	case "cluster-secret":
		if v == `""` {
			v = ""
		}
		c.ClusterSecret = v
	case "bind-source-addr", "cluster-announce-ip":
		if v == `""` {
			v = ""
		}
		if ip, err := netip.ParseAddr(v); v != "" && (err != nil || ip.IsUnspecified() || ip.Zone() != "") {
			return fmt.Errorf("%s: want one specific IP address, got %q", name, v)
		}
		if name == "bind-source-addr" {
			c.BindSourceAddr = v
		} else {
			c.ClusterAnnounceIP = v
		}
	case "cluster-announce-port", "cluster-announce-bus-port":
		p, err := strconv.Atoi(v)
		if err != nil || p < 0 || p > 65535 {
			return fmt.Errorf("%s: %q is not a port number (0: not set)", name, v)
		}
		if name == "cluster-announce-port" {
			c.ClusterAnnouncePort = p
		} else {
			c.ClusterAnnounceBusPort = p
		}
	default:
		return fmt.Errorf("unknown or not yet supported directive %q", name)
	}
	return nil
}

// directives are the names set knows, in the order CONFIG GET and
// CONFIG REWRITE list them.
var directives = []string{
	"port", "bind", "dir", "appendonly", "appendfsync", "loglevel", "logfile", "pidfile",
	"requirepass", "maxclients", "max-job-size", "min-free-disk", "maxmemory",
	"slowlog-log-slower-than", "slowlog-max-len",
	"metrics-addr", "pprof", "aof-segment-size", "gc-interval", "gc-min-live-ratio",
	"cluster-node-timeout", "cluster-bus-port", "cluster-secret",
	"bind-source-addr", "cluster-announce-ip", "cluster-announce-port", "cluster-announce-bus-port",
}

// parseYesNo reads the yes|no value v of directive name.
func parseYesNo(name, v string) (bool, error) {
	switch strings.ToLower(v) {
	case "yes":
		return true, nil
	case "no":
		return false, nil
	}
	return false, fmt.Errorf("%s: want yes or no, got %q", name, v)
}

// yesNo is the value of a yes|no directive.
func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// value is directive name's value as set would read it back.
func (c *config) value(name string) string {
	switch name {
	case "port":
		return strconv.Itoa(c.Port)
	case "bind":
		return c.Bind
	case "dir":
		return c.Dir
	case "appendonly":
		return yesNo(c.AppendOnly)
	case "appendfsync":
		return c.AppendFsync.String()
	case "loglevel":
		switch {
		case c.LogLevel <= slog.LevelDebug:
			return "debug"
		case c.LogLevel <= slog.LevelInfo:
			return "notice"
		}
		return "warning"
	case "logfile":
		return c.LogFile
	case "pidfile":
		return c.PidFile
	case "requirepass":
		return c.RequirePass
	case "maxclients":
		return strconv.Itoa(c.MaxClients)
	case "max-job-size":
		return strconv.FormatInt(c.MaxJobSize, 10)
	case "min-free-disk":
		return strconv.FormatInt(c.MinFreeDisk, 10)
	case "maxmemory":
		return strconv.FormatInt(c.MaxMemory, 10)
	case "slowlog-log-slower-than":
		return strconv.FormatInt(c.SlowlogSlowerThan, 10)
	case "slowlog-max-len":
		return strconv.Itoa(c.SlowlogMaxLen)
	case "metrics-addr":
		return c.MetricsAddr
	case "pprof":
		return yesNo(c.Pprof)
	case "aof-segment-size":
		return strconv.FormatInt(c.segmentSize(), 10)
	case "gc-interval":
		return strconv.Itoa(c.GCInterval)
	case "gc-min-live-ratio":
		return strconv.FormatFloat(c.GCMinLiveRatio, 'g', -1, 64)
	case "cluster-node-timeout":
		return strconv.FormatInt(c.ClusterNodeTimeout, 10)
	case "cluster-bus-port":
		return strconv.Itoa(c.busPort())
	case "cluster-secret":
		return c.ClusterSecret
	case "bind-source-addr":
		return c.BindSourceAddr
	case "cluster-announce-ip":
		return c.ClusterAnnounceIP
	case "cluster-announce-port":
		return strconv.Itoa(c.ClusterAnnouncePort)
	case "cluster-announce-bus-port":
		return strconv.Itoa(c.ClusterAnnounceBusPort)
	}
	return ""
}

// sourceAddr is the source address of outgoing bus and gossip
// connections: bind-source-addr, or bind when it is one specific IP (as
// Redis Cluster does), else none (the OS chooses). A node bound to
// 127.0.0.3 is then seen by its peers coming from 127.0.0.3, which is what
// lets a fault proxy tell the nodes of a test cluster apart
// (internal/faultproxy).
func (c *config) sourceAddr() netip.Addr {
	if ip, err := netip.ParseAddr(c.BindSourceAddr); err == nil {
		return ip.Unmap()
	}
	if ip, err := netip.ParseAddr(c.Bind); err == nil && !ip.IsUnspecified() && ip.Zone() == "" {
		return ip.Unmap()
	}
	return netip.Addr{}
}

// announcedClientAddr is the client address this node gives its peers (in
// CLUSTER NODES and HELLO): cluster-announce-ip and cluster-announce-port
// where set; else the bind address, or 127.0.0.1 when it is a wildcard or
// not an IP, as Disque does, and the port it listens on.
func (c *config) announcedClientAddr(port int) string {
	if c.ClusterAnnouncePort > 0 {
		port = c.ClusterAnnouncePort
	}
	return net.JoinHostPort(c.announcedIP(), strconv.Itoa(port))
}

func (c *config) announcedIP() string {
	if c.ClusterAnnounceIP != "" {
		return c.ClusterAnnounceIP
	}
	if ip := net.ParseIP(c.Bind); ip != nil && !ip.IsUnspecified() {
		return c.Bind
	}
	return "127.0.0.1"
}

// announcedBusAddr is the bus address peers are told, when something is
// announced ("": membership advertises the address the bus listens on).
// busPort is the port it listens on.
func (c *config) announcedBusAddr(busPort int) string {
	if c.ClusterAnnounceIP == "" && c.ClusterAnnounceBusPort == 0 {
		return ""
	}
	if c.ClusterAnnounceBusPort > 0 {
		busPort = c.ClusterAnnounceBusPort
	}
	return net.JoinHostPort(c.announcedIP(), strconv.Itoa(busPort))
}

// busPort is the bus port to listen on: cluster-bus-port, or port + 10000
// as in Disque; 0 (also when port is 0, so that servers started on port 0
// never collide on 10000) picks a free one.
func (c *config) busPort() int {
	switch {
	case c.ClusterBusPort >= 0:
		return c.ClusterBusPort
	case c.Port == 0:
		return 0
	}
	return c.Port + busPortOffset
}

// busPortOffset is Disque's distance from the client port to the bus port.
const busPortOffset = 10000

// The cluster-node-timeout default (Disque's) and bounds: under 100 ms
// gossip could not probe every node in time on a loaded machine.
const (
	defaultClusterNodeTimeout = 15000
	minClusterNodeTimeout     = 100
	maxClusterNodeTimeout     = 24 * 3600 * 1000
)

// segmentSize is the AOF segment size in effect: the directive's, or 64 MiB
// on disk and 4 MiB in memory. In memory a segment is one byte slice that
// grows by appending, and every regrowth copies it under the file's lock:
// with 64 MiB segments GETJOB stalled for 0.2–0.8 s at a time, with 4 MiB
// for under 0.1 s (bench/README.md, appendonly no).
func (c *config) segmentSize() int64 {
	switch {
	case c.AOFSegmentSize > 0:
		return c.AOFSegmentSize
	case !c.AppendOnly:
		return 4 << 20
	}
	return 64 << 20
}

// defaultMinFreeDisk keeps the AOF off a full disk: running out fails the
// store until a restart, refusing new jobs first does not.
const defaultMinFreeDisk = 64 << 20

// maxJobSizeLimit bounds max-job-size: a job is held in memory whole.
const maxJobSizeLimit = 1 << 30

// parseBytes reads a size the way Redis's config does: a plain number of
// bytes, or with a unit, case-insensitive: k = 1000, kb = 1024, m = 1000²,
// mb = 1024², g = 1000³, gb = 1024³ (b = bytes).
func parseBytes(v string) (int64, error) {
	lower := strings.ToLower(v)
	units := []struct {
		suffix string
		mul    int64
	}{{"kb", 1 << 10}, {"mb", 1 << 20}, {"gb", 1 << 30}, {"k", 1e3}, {"m", 1e6}, {"g", 1e9}, {"b", 1}}
	mul := int64(1)
	for _, u := range units {
		if num, ok := strings.CutSuffix(lower, u.suffix); ok {
			lower, mul = num, u.mul
			break
		}
	}
	n, err := strconv.ParseInt(lower, 10, 64)
	if err != nil || n < 0 || lower[0] == '+' {
		return 0, fmt.Errorf("%q is not a size", v)
	}
	if n > math.MaxInt64/mul {
		return 0, fmt.Errorf("%q is too large", v)
	}
	return n * mul, nil
}
