// Command diskque-server runs a diskque node: a Disque-compatible job queue
// that keeps its jobs on disk. See the README for a first run.
package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble/v2/vfs"
	"github.com/diskque/diskque/gc"
	"github.com/diskque/diskque/server"
	"github.com/diskque/diskque/storage"
	"github.com/diskque/diskque/wal"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "check" {
		os.Exit(runCheck(os.Args[2:], os.Stdout))
	}
	cfg, err := parseArgs(os.Args[1:])
	if errors.Is(err, errHelp) {
		fmt.Print(usage)
		return
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "diskque-server: %v\n\n%s", err, usage)
		os.Exit(2)
	}
	if os.Getenv("GOGC") == "" {
		// The heap is mostly short-lived garbage (commands, replies, index
		// writes on their way to Pebble), and the backlog lives on disk: a
		// GC every doubling of the live heap cost 5-15% of an ADDJOB's CPU.
		// At 200 the 1M-queued-jobs RSS went from 119 to 133 MB. GOGC set
		// in the environment wins.
		debug.SetGCPercent(200)
	}
	if err := run(cfg); err != nil {
		fmt.Fprintf(os.Stderr, "diskque-server: %v\n", err)
		if errors.Is(err, wal.ErrCorrupt) {
			fmt.Fprintf(os.Stderr, "\nTo see what is damaged and which jobs it holds: diskque-server check --dir %s\n"+
				"To drop only the damaged records and keep every other one: diskque-server check --dir %s --repair\n"+
				"(or restore the named segment from a backup).\n", cfg.Dir, cfg.Dir)
		}
		os.Exit(1)
	}
}

func run(cfg config) error {
	dataDir, err := enterDir(cfg)
	if err != nil {
		return err
	}
	logOut := io.Writer(os.Stderr)
	if cfg.LogFile != "" {
		f, err := os.OpenFile(cfg.LogFile, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return fmt.Errorf("logfile: %w", err)
		}
		defer f.Close()
		logOut = f
	}
	level := new(slog.LevelVar)
	level.Set(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(logOut, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	if cfg.PidFile != "" {
		if err := os.WriteFile(cfg.PidFile, []byte(strconv.Itoa(os.Getpid())+"\n"), 0o644); err != nil {
			return fmt.Errorf("pidfile: %w", err)
		}
		defer os.Remove(cfg.PidFile)
	}

	// Listen first: clients get -LOADING rather than a refused connection
	// while the AOF replays.
	addr := net.JoinHostPort(cfg.Bind, strconv.Itoa(cfg.Port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	// The bus port too, before the store opens: a port that cannot be
	// bound fails the start at once, naming the directive.
	bus, err := listenBus(cfg, log)
	if err != nil {
		ln.Close()
		return err
	}
	// SHUTDOWN takes the same path as SIGTERM.
	shutdown := make(chan struct{}, 1)
	live := &liveConfig{cfg: cfg, level: level, log: log, appendOnly: cfg.AppendOnly}
	srv := server.New(server.Options{
		Config: live,
		Logger: log,
		Info: server.InfoSource{
			AOFEnabled: cfg.AppendOnly, AppendFsync: cfg.AppendFsync.String(), Dir: cfg.Dir, ConfigFile: cfg.ConfigFile,
		},
		RequirePass: cfg.RequirePass,
		MaxClients:  cfg.MaxClients,
		MaxJobSize:  cfg.MaxJobSize,
		MinFreeDisk: cfg.MinFreeDisk,
		MaxMemory:   cfg.MaxMemory,
		// A command sent while the store recovers waits for it (a restart
		// after kill -9 replays in milliseconds) instead of getting
		// -LOADING at once: Disque serves nothing until loaded, and its
		// clients take an answered PING for "ready".
		LoadingWait: loadingWait,
		// What peers are told of this node, clients are told too.
		AnnounceIP:   cfg.ClusterAnnounceIP,
		AnnouncePort: cfg.ClusterAnnouncePort,
		OnShutdown: func() {
			select {
			case shutdown <- struct{}{}:
			default:
			}
		},
	})
	live.srv = srv
	live.mu.Lock()
	live.apply() // slowlog-log-slower-than 0 means "log all", not the default
	live.mu.Unlock()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	if cfg.MetricsAddr != "" {
		mln, err := net.Listen("tcp", cfg.MetricsAddr)
		if err != nil {
			srv.Close()
			return fmt.Errorf("metrics-addr: %w", err)
		}
		hs := &http.Server{Handler: metricsHandler(srv.MetricsHandler(), cfg.Pprof), ReadHeaderTimeout: 10 * time.Second}
		go func() { _ = hs.Serve(mln) }()
		defer hs.Close()
		log.Info("metrics listening", "addr", mln.Addr().String(), "pprof", cfg.Pprof)
		if tcp, ok := mln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
			log.Warn(metricsExposedWarning, "addr", mln.Addr().String(), "pprof", cfg.Pprof)
		}
	}
	log.Info("diskque listening", "addr", ln.Addr().String(), "dir", cfg.Dir,
		"appendonly", cfg.AppendOnly, "appendfsync", cfg.AppendFsync.String(), "pid", os.Getpid())
	if cfg.RequirePass == "" {
		if tcp, ok := ln.Addr().(*net.TCPAddr); ok && !tcp.IP.IsLoopback() {
			log.Warn("no requirepass and bind is not a loopback address: only loopback clients are served")
		}
	}

	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)

	sopts := storage.DefaultOptions()
	sopts.Sync = cfg.AppendFsync
	sopts.SegmentSize = cfg.segmentSize()
	sopts.Logger = log
	dir := dataDir
	if !cfg.AppendOnly {
		sopts.FS = vfs.NewMem()
		dir = "mem"
	}
	// The soft memory limit (memlimit.go), retuned until the process ends.
	pebbleBudget := int64(0)
	if pebbleInGoHeap {
		pebbleBudget = sopts.CacheSize + 2*int64(sopts.MemTableSize) // as storage sizes Pebble's cache
	}
	stopMemLimit := make(chan struct{})
	defer close(stopMemLimit)
	// A node with peers (bus.Nodes counts itself) gets the lower floor.
	clustered := func() bool { return len(bus.Nodes()) > 1 }
	startMemLimit(log, func() int64 { return memLimitFloor(clustered(), live.maxMemory(), pebbleBudget) }, stopMemLimit)
	gcOpts := gc.Options{Interval: time.Duration(cfg.GCInterval) * time.Second, MinLiveRatio: cfg.GCMinLiveRatio, Logger: log}
	if cfg.GCInterval == 0 {
		gcOpts.Interval = -1
	}
	n := newNode(dir, sopts, gcOpts, srv, log)
	n.bus = bus
	bus.refuseCopies = srv.RefusesCopies
	// The server gets the broker once the bus runs (publish, below):
	// commands sent meanwhile wait for it (loadingWait), and none runs on a
	// broker whose job protocol cannot replicate yet.
	n.holdBroker = true
	n.rebuild = cfg.RebuildIndex // --rebuild-index: the first open rebuilds the index
	live.attach(n)               // a CONFIG SET appendfsync while we got here counts
	if err := n.open(); err != nil {
		srv.Close()
		bus.close()
		return err
	}
	go n.run()
	// The nodes file is kept beside the store: a node in memory only
	// (appendonly no) has a new id at every start and keeps nothing on
	// disk, so after a restart it is MEETed again, like its jobs are gone.
	nodesDir := dataDir
	if !cfg.AppendOnly {
		nodesDir = ""
	}
	if err := bus.start(cfg, n.nodeID(), nodesDir, ln.Addr().(*net.TCPAddr).Port); err != nil {
		srv.Close()
		bus.close()
		n.close()
		return err
	}
	srv.SetCluster(clusterControl{Membership: bus.membership, bus: bus, node: n}, bus.transport)
	live.attachCluster(bus.membership)
	n.publish()
	log.Info("ready to accept commands")

	var serveErr error
	select {
	case sig := <-signals:
		log.Info("shutting down", "signal", sig.String())
	case <-shutdown:
		log.Info("shutting down", "reason", "SHUTDOWN command")
	case serveErr = <-served:
		log.Error("server stopped", "err", serveErr)
	}
	// The graceful path below has shutdownTimeout, and a second signal ends
	// it at once: nothing — a store on a dead disk, a stuck client — keeps
	// the process from exiting when asked to.
	var stage atomic.Pointer[string]
	setStage := func(s string) { stage.Store(&s) }
	setStage("closing client connections")
	finished := make(chan struct{})
	defer close(finished)
	go watchShutdown(log, signals, finished, shutdownTimeout, func() string { return *stage.Load() }, os.Exit)
	// Stop accepting and close connections (commands in flight finish and
	// their replies are durable), then stop the timers, then checkpoint.
	srv.Close()
	// Then the cluster bus: nothing it delivers may reach a closed store.
	setStage("closing the cluster bus")
	if err := bus.close(); err != nil {
		log.Warn("closing the cluster bus", "err", err)
	}
	// A running collection finishes (what it moved is safe), the timers
	// stop, the store checkpoints.
	setStage("closing the store (its checkpoint)")
	if err := n.close(); err != nil {
		return fmt.Errorf("close storage: %w", err)
	}
	log.Info("bye")
	return serveErr
}

// loadingWait is how long a command waits for a recovering store before
// it is answered -LOADING (server.Options.LoadingWait).
const loadingWait = 5 * time.Second

// enterDir makes the data directory (dir, relative to the working
// directory) and chdirs into it, as Disque does: Disque's test suite starts
// "disque-server disque_N/disque.conf" with "dir ./disque_N" and
// "logfile log.txt", and expects the log in disque_N. So a relative
// logfile or pidfile lands in dir. It returns dir's absolute path, where
// the store is opened. With appendonly no the directory is still entered
// (and made), but no job is written there.
func enterDir(cfg config) (string, error) {
	abs, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return "", fmt.Errorf("dir %q: %w", cfg.Dir, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return "", fmt.Errorf("dir: %w", err)
	}
	if err := os.Chdir(abs); err != nil {
		return "", fmt.Errorf("dir: cannot chdir to %q: %w", abs, err)
	}
	return abs, nil
}

// metricsExposedWarning is logged at start when metrics-addr is not a
// loopback address: its HTTP has no authentication, requirepass or not.
const metricsExposedWarning = "metrics-addr is not a loopback address and has no authentication " +
	"(requirepass does not cover it): anyone who can reach it can read the metrics, and with pprof yes " +
	"profile the server; bind it to 127.0.0.1 or firewall it"

// metricsHandler is what metrics-addr serves: metrics at /metrics and,
// only when profile is set (pprof yes), Go's profiler under /debug/pprof/:
// heap, goroutine and the other runtime profiles, a CPU profile and an
// execution trace. /debug/pprof/cmdline is left out: the command line may
// hold --requirepass.
func metricsHandler(metrics http.Handler, profile bool) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", metrics)
	if profile {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", http.NotFound)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return mux
}

// shutdownTimeout bounds a graceful shutdown.
const shutdownTimeout = 10 * time.Second

// watchShutdown ends the process with status 1 if the shutdown has not
// finished within timeout, or at once on another signal, logging which
// stage did not finish (stage says).
func watchShutdown(log *slog.Logger, signals <-chan os.Signal, finished <-chan struct{}, timeout time.Duration,
	stage func() string, exit func(int)) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-finished:
	case sig := <-signals:
		log.Error("second signal: exiting without finishing the shutdown", "signal", sig.String(), "unfinished", stage())
		exit(1)
	case <-t.C:
		log.Error("the shutdown did not finish in time: exiting", "timeout", timeout.String(), "unfinished", stage())
		exit(1)
	}
}
