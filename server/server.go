package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/gc"
	"github.com/tidwall/redcon"
)

// Options configure a Server.
type Options struct {
	// Logger. Default slog.Default().
	Logger *slog.Logger
	// Info fills in the Persistence section of INFO and other facts the
	// server cannot know itself.
	Info InfoSource
	// MaxPipelineBatch bounds how many pipelined ADDJOBs share one commit.
	// Default 256.
	MaxPipelineBatch int
	// RequirePass, when set, is the password a connection must give with
	// AUTH before any command but AUTH and QUIT. Default "" (no password:
	// then only loopback clients are served when the listener is not on a
	// loopback address, see protectedDenied).
	RequirePass string
	// MaxClients bounds the connected clients; the connections beyond it
	// get an error and are closed. Default 10000.
	MaxClients int
	// MaxJobSize bounds the body of an ADDJOB in bytes. Default 64 MiB.
	MaxJobSize int64
	// MinFreeDisk: below this many free bytes on the data directory's
	// filesystem, ADDJOB gets -NOSPACE. 0: off.
	MinFreeDisk int64
	// MaxMemory: above this many bytes of live Go heap plus request bodies
	// being read (guard.go), ADDJOB gets -OOM. 0: off.
	MaxMemory int64
	// GuardInterval is how often disk space and memory are measured.
	// Default 250 ms.
	GuardInterval time.Duration
	// Config serves CONFIG GET, SET and REWRITE. Default nil: CONFIG GET
	// matches nothing, SET and REWRITE are errors.
	Config Config
	// SlowlogSlowerThan: commands that run at least this long are logged
	// in SLOWLOG; negative disables it. Default (0) DefaultSlowlogSlowerThan,
	// 10ms; SetSlowlog(0, n) logs every command.
	SlowlogSlowerThan time.Duration
	// SlowlogMaxLen bounds the SLOWLOG entries kept. Default 128.
	SlowlogMaxLen int
	// OnShutdown is called (once) by SHUTDOWN; the daemon wires it to its
	// SIGTERM path. Default: SHUTDOWN closes the server itself.
	OnShutdown func()
	// MonitorBufferLimit bounds the output, in bytes, a MONITOR client may
	// have queued and not yet read; past it the client is disconnected, so
	// a slow monitor cannot hold memory or stall the server. Default
	// DefaultMonitorBufferLimit (32 MiB).
	MonitorBufferLimit int
	// BodyWait is how long a large request body waits for room in the
	// budget of request bodies being read (reqmem.go) before it is read,
	// dropped and its command refused. Default DefaultBodyWait (10 s).
	BodyWait time.Duration
	// RequestBudget bounds the bytes of large request bodies being read
	// at once, across all clients (reqmem.go). Default (0): maxmemory / 2,
	// or DefaultRequestBudget without maxmemory. Never less than one body
	// of max-job-size.
	RequestBudget int64
	// LoadingWait is how long a command that needs the store waits for it
	// while the store is still recovering, before it is answered -LOADING.
	// 0 (the default) answers at once. The daemon waits a few seconds, as
	// Disque does: Disque serves no command until its AOF is loaded, and
	// clients (Disque's own test suite among them) treat an answered PING
	// as "ready" and send the next command at once.
	LoadingWait time.Duration
	// AnnounceIP and AnnouncePort, when set, are the address HELLO and
	// CLUSTER NODES give for this node instead of the listener's: the
	// daemon's cluster-announce-ip and cluster-announce-port, for a node
	// behind NAT or a port forward. Default ("", 0): the listener's.
	AnnounceIP   string
	AnnouncePort int
}

// Defaults of Options.
const (
	DefaultMaxClients = 10000
	DefaultMaxJobSize = 64 << 20
	// DefaultSlowlogSlowerThan is Redis's slowlog-log-slower-than.
	DefaultSlowlogSlowerThan = 10 * time.Millisecond
	DefaultSlowlogMaxLen     = 128
)

// InfoSource gives INFO the daemon's settings.
type InfoSource struct {
	AOFEnabled  bool
	AppendFsync string
	Dir         string
	ConfigFile  string
}

// Server serves RESP clients over a Broker.
type Server struct {
	opts Options
	// broker is what commands run on, nil while loading; see brokerRef.
	broker atomic.Pointer[brokerRef]
	// loaded is closed while there is a broker, and replaced by an open
	// channel when SetBroker(nil) takes it away; loadMu guards the swap.
	// Commands that arrive while loading wait on it (Options.LoadingWait).
	loadMu sync.Mutex
	loaded chan struct{}
	// collector runs segment collections (BGREWRITEAOF, INFO); nil until
	// SetCollector.
	collector atomic.Pointer[gc.Collector]
	// cluster is membership and the bus (cmd_cluster.go); nil: a lone node,
	// whose CLUSTER LEAVING state is loneLeaving.
	cluster     atomic.Pointer[clusterRef]
	loneLeaving atomic.Bool
	start       time.Time

	mu       sync.Mutex
	rs       *redcon.Server
	ln       net.Listener
	clients  map[redcon.Conn]*client
	closing  bool
	running  int             // handlers executing commands
	idle     *sync.Cond      // signalled when running drops to 0
	ctx      context.Context // cancelled by Close: wakes blocked GETJOBs
	cancel   context.CancelFunc
	port     int
	host     string
	nextID   atomic.Int64
	commands atomic.Int64
	// shutdownOnce: SHUTDOWN acts once.
	shutdownOnce sync.Once
	conns        atomic.Int64

	// The settings CONFIG SET changes at run time (Options holds their
	// values at start).
	requirePass atomic.Pointer[string]
	maxClients  atomic.Int64
	maxJobSize  atomic.Int64
	guard       guard
	persist     atomic.Pointer[persistInfo]
	reqMem      reqMem
	bodyWait    atomic.Int64 // time.Duration
	slowlog     slowlog
	metrics     *metrics

	// monitors are the MONITOR clients, nil when there are none: the
	// command path loads it and does nothing more. monMu serialises its
	// writers (monitor.go).
	monitors atomic.Pointer[[]*monitor]
	monMu    sync.Mutex
}

// client is one connection's state. The fields above mu are set at accept
// and never change; authed is touched only by the connection's own
// goroutine; mu guards the rest, which CLIENT LIST reads from others.
type client struct {
	id      int64
	addr    string
	netConn net.Conn
	created time.Time
	// rejected is the error reply (maxclients, protected mode) the
	// connection got at accept: its commands are ignored and it is closed.
	rejected string
	authed   bool
	// monitor is set once the connection has sent MONITOR (monitor.go).
	// Like authed, only the connection's own goroutine touches it.
	monitor *monitor
	// outBytes counts the job bodies written into the reply buffer since
	// it was last flushed (the connection's goroutine only).
	outBytes int64
	// unflushed: replies were written into the reply buffer since it was
	// last flushed (the connection's goroutine only), so a GETJOB about to
	// block flushes them first; without them it spares the write(2).
	unflushed bool

	mu         sync.Mutex
	name       string
	lastCmd    string
	lastActive time.Time
}

// New returns a server with no broker yet: until SetBroker it answers
// -LOADING.
func New(opts Options) *Server {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxPipelineBatch <= 0 {
		opts.MaxPipelineBatch = 256
	}
	if opts.MaxClients <= 0 {
		opts.MaxClients = DefaultMaxClients
	}
	if opts.MaxJobSize <= 0 {
		opts.MaxJobSize = DefaultMaxJobSize
	}
	if opts.SlowlogSlowerThan == 0 {
		opts.SlowlogSlowerThan = DefaultSlowlogSlowerThan
	}
	if opts.SlowlogMaxLen <= 0 {
		opts.SlowlogMaxLen = DefaultSlowlogMaxLen
	}
	if opts.MonitorBufferLimit <= 0 {
		opts.MonitorBufferLimit = DefaultMonitorBufferLimit
	}
	if opts.BodyWait <= 0 {
		opts.BodyWait = DefaultBodyWait
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, start: time.Now(), clients: map[redcon.Conn]*client{}, ctx: ctx, cancel: cancel,
		loaded: make(chan struct{})}
	s.idle = sync.NewCond(&s.mu)
	s.metrics = newMetrics(s)
	s.SetRequirePass(opts.RequirePass)
	s.SetMaxClients(opts.MaxClients)
	s.SetMaxJobSize(opts.MaxJobSize)
	s.SetMinFreeDisk(opts.MinFreeDisk)
	s.SetMaxMemory(opts.MaxMemory)
	s.SetSlowlog(opts.SlowlogSlowerThan, opts.SlowlogMaxLen)
	s.bodyWait.Store(int64(opts.BodyWait))
	return s
}

// SetRequirePass changes the password (CONFIG SET requirepass): "" turns
// authentication off. Connections already authenticated stay so; new ones
// need the new password.
func (s *Server) SetRequirePass(pass string) { s.requirePass.Store(&pass) }

// SetMaxClients changes maxclients; connected clients beyond it stay.
func (s *Server) SetMaxClients(n int) { s.maxClients.Store(int64(n)) }

// SetMaxJobSize changes max-job-size in bytes.
func (s *Server) SetMaxJobSize(n int64) { s.maxJobSize.Store(n) }

func (s *Server) password() string { return *s.requirePass.Load() }

// SetCollector gives the server the store's segment collector, which
// BGREWRITEAOF starts and INFO reports on, and keeps its collections above
// min-free-disk (gc.Collector.SetRoom, diskguard.go). Call it before
// SetBroker.
func (s *Server) SetCollector(c *gc.Collector) {
	if c != nil {
		c.SetRoom(s.collectorRoom)
	}
	s.collector.Store(c)
}

// Serve accepts connections on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return errors.New("server: closed")
	}
	ln = limitListener{Listener: ln, s: s}
	s.ln = ln
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok {
		s.port = tcp.Port
		s.host = tcp.IP.String()
	}
	s.rs = redcon.NewServerNetwork("tcp", ln.Addr().String(), s.handle, s.accept, s.closed)
	rs := s.rs
	s.mu.Unlock()
	every := s.opts.GuardInterval
	if every <= 0 {
		every = 250 * time.Millisecond
	}
	go s.runGuard(every)
	return rs.Serve(ln)
}

// Close stops accepting, wakes blocked clients, waits for the commands being
// executed to finish (their effects are durable when they reply) and closes
// every connection. Commands read after Close get an error.
func (s *Server) Close() error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return nil
	}
	s.closing = true
	rs := s.rs
	s.mu.Unlock()
	s.cancel()
	var err error
	if rs != nil {
		err = rs.Close()
	}
	s.closeMonitors()
	s.mu.Lock()
	for s.running > 0 {
		s.idle.Wait()
	}
	s.mu.Unlock()
	return err
}

// rejectLinger is how long a refused connection is kept open to read what
// the client sends, so that closing it sends FIN rather than a reset that
// could destroy the error reply before the client reads it.
const rejectLinger = 2 * time.Second

func (s *Server) accept(conn redcon.Conn) bool {
	now := time.Now()
	c := &client{id: s.nextID.Add(1), addr: conn.RemoteAddr(), netConn: conn.NetConn(), created: now, lastActive: now}
	conn.SetContext(c)
	if lc, ok := c.netConn.(*limitConn); ok {
		lc.client.Store(c)
	}
	s.conns.Add(1)
	s.mu.Lock()
	switch {
	case protectedDenied(s.host, s.password(), c.netConn.RemoteAddr()):
		c.rejected = errDenied
	case int64(len(s.clients)) >= s.maxClients.Load():
		c.rejected = errMaxClients
	default:
		s.clients[conn] = c
	}
	s.mu.Unlock()
	if c.rejected != "" {
		// The reply goes out now; whatever the client sends is read and
		// dropped (handle), and the connection is closed after that or
		// after rejectLinger.
		s.opts.Logger.Warn("connection refused", "addr", c.addr, "reason", c.rejected)
		conn.WriteError(c.rejected)
		flush(conn)
		_ = c.netConn.SetReadDeadline(now.Add(rejectLinger))
	}
	return true
}

func (s *Server) closed(conn redcon.Conn, err error) {
	s.mu.Lock()
	delete(s.clients, conn)
	s.mu.Unlock()
	if c, _ := conn.Context().(*client); c != nil && c.monitor != nil {
		s.stopMonitor(c.monitor)
	}
}

// protectedDenied says whether a client at remote is refused because the
// server listens on listenHost — a wildcard or other non-loopback address —
// without a password: like Redis's protected mode, only loopback clients
// are served then.
func protectedDenied(listenHost, requirePass string, remote net.Addr) bool {
	if requirePass != "" {
		return false
	}
	if ip := net.ParseIP(listenHost); ip == nil || ip.IsLoopback() {
		return false // a loopback listener, or not TCP (a test pipe)
	}
	tcp, ok := remote.(*net.TCPAddr)
	if !ok {
		return false
	}
	return !tcp.IP.IsLoopback()
}

// handle takes the command redcon read and every command read with it, so
// that runs of pipelined ADDJOBs can share one commit.
func (s *Server) handle(conn redcon.Conn, cmd redcon.Command) {
	cmds := append([]redcon.Command{cmd}, conn.ReadPipeline()...)
	if c, _ := conn.Context().(*client); c != nil && c.rejected != "" {
		conn.Close() // already told why; what it sent has been read
		return
	}
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		for range cmds {
			conn.WriteError(errShuttingDown)
		}
		conn.Close()
		return
	}
	s.running++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.running--; s.running == 0 {
			s.idle.Broadcast()
		}
		s.mu.Unlock()
	}()
	cl, _ := conn.Context().(*client)
	var refused []bool
	if lc := cl.limitConn(); lc != nil {
		var charged int64
		charged, refused = lc.takeBodies(cmds)
		defer lc.unreserve(charged)
	}
	for i := 0; i < len(cmds); {
		if refused != nil && refused[i] {
			conn.WriteError(fmt.Sprintf(errBodyBudget, s.requestBudget()))
			if cl != nil {
				cl.unflushed = true
			}
			i++
			continue
		}
		end := len(cmds)
		for j := i + 1; refused != nil && j < end; j++ {
			if refused[j] {
				end = j // a pipelined batch stops before it
			}
		}
		n := s.execute(conn, cmds[i:end])
		i += n
		if cl != nil {
			cl.unflushed = true
		}
		// The output limit for slow consumers: redcon buffers a whole
		// pipeline's replies before writing them, so a client that sends
		// many GETJOBs and reads slowly would make that buffer grow
		// without end. Past outputFlushBytes of job bodies it is written
		// out now, which blocks this connection alone until its client
		// reads: the server holds at most that plus one reply for it.
		if cl != nil && cl.outBytes >= outputFlushBytes {
			flush(conn)
			cl.outBytes, cl.unflushed = 0, false
		}
	}
	if cl != nil {
		cl.outBytes, cl.unflushed = 0, false // redcon flushes after the handler
	}
}

// limitConn is the client's connection as the server reads it (nil for a
// client not accepted through Serve's listener).
func (c *client) limitConn() *limitConn {
	if c == nil {
		return nil
	}
	lc, _ := c.netConn.(*limitConn)
	return lc
}

// outputFlushBytes is how many bytes of job bodies a connection's replies
// may buffer before they are written out mid-pipeline.
const outputFlushBytes = 1 << 20

func (s *Server) connectedClients() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.clients)
}

func (s *Server) addrParts() (string, string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.host, strconv.Itoa(s.port)
}

// advertised is the address HELLO and CLUSTER NODES give for this node: the
// listener's, or — when it listens on a wildcard address such as 0.0.0.0 —
// the local address the client reached, which the client can use; an
// announced IP or port (Options.AnnounceIP, AnnouncePort) replaces either.
func (s *Server) advertised(c *call) (string, string) {
	host, port := s.addrParts()
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if tcp, ok := c.conn.NetConn().LocalAddr().(*net.TCPAddr); ok {
			host = tcp.IP.String()
		}
	}
	if s.opts.AnnounceIP != "" {
		host = s.opts.AnnounceIP
	}
	if s.opts.AnnouncePort > 0 {
		port = strconv.Itoa(s.opts.AnnouncePort)
	}
	return host, port
}
