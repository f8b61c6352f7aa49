package server

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/diskque/diskque/queue"
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
}

// InfoSource gives INFO the daemon's settings.
type InfoSource struct {
	AOFEnabled  bool
	AppendFsync string
	Dir         string
	ConfigFile  string
}

// Server serves RESP clients over a Broker.
type Server struct {
	opts   Options
	broker atomic.Pointer[queue.Broker]
	start  time.Time

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
	conns    atomic.Int64
}

// client is one connection's state.
type client struct {
	id   int64
	addr string
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
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{opts: opts, start: time.Now(), clients: map[redcon.Conn]*client{}, ctx: ctx, cancel: cancel}
	s.idle = sync.NewCond(&s.mu)
	return s
}

// SetBroker makes the server ready: loading is over.
func (s *Server) SetBroker(b *queue.Broker) { s.broker.Store(b) }

// Serve accepts connections on ln until Close. It returns nil after Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return errors.New("server: closed")
	}
	s.ln = ln
	if tcp, ok := ln.Addr().(*net.TCPAddr); ok {
		s.port = tcp.Port
		s.host = tcp.IP.String()
	}
	s.rs = redcon.NewServerNetwork("tcp", ln.Addr().String(), s.handle, s.accept, s.closed)
	rs := s.rs
	s.mu.Unlock()
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
	s.mu.Lock()
	for s.running > 0 {
		s.idle.Wait()
	}
	s.mu.Unlock()
	return err
}

func (s *Server) accept(conn redcon.Conn) bool {
	c := &client{id: s.nextID.Add(1), addr: conn.RemoteAddr()}
	conn.SetContext(c)
	s.mu.Lock()
	s.clients[conn] = c
	s.mu.Unlock()
	s.conns.Add(1)
	return true
}

func (s *Server) closed(conn redcon.Conn, err error) {
	s.mu.Lock()
	delete(s.clients, conn)
	s.mu.Unlock()
}

// handle takes the command redcon read and every command read with it, so
// that runs of pipelined ADDJOBs can share one commit.
func (s *Server) handle(conn redcon.Conn, cmd redcon.Command) {
	cmds := append([]redcon.Command{cmd}, conn.ReadPipeline()...)
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
	for i := 0; i < len(cmds); {
		n := s.execute(conn, cmds[i:])
		i += n
	}
}

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
// the local address the client reached, which the client can use.
func (s *Server) advertised(c *call) (string, string) {
	host, port := s.addrParts()
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if tcp, ok := c.conn.NetConn().LocalAddr().(*net.TCPAddr); ok {
			host = tcp.IP.String()
		}
	}
	return host, port
}
