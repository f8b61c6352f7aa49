package server

import (
	"cmp"
	"crypto/subtle"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The connection's own commands: AUTH and the CLIENT family.

func init() {
	register(
		&command{name: "auth", arity: -2, whileLoading: true, run: cmdAuth},
		&command{name: "client", arity: -2, whileLoading: true, run: cmdClient},
	)
}

// touch records that the client is running command name, at now.
func (c *client) touch(name string, now time.Time) {
	c.mu.Lock()
	c.lastCmd = name
	c.lastActive = now
	c.mu.Unlock()
}

// info is the client's CLIENT LIST line, without the newline.
func (c *client) info(now time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	cmd := c.lastCmd
	if cmd == "" {
		cmd = "NULL"
	}
	return fmt.Sprintf("id=%d addr=%s name=%s age=%d idle=%d cmd=%s", c.id, c.addr, c.name,
		int64(now.Sub(c.created).Seconds()), int64(now.Sub(c.lastActive).Seconds()), cmd)
}

// cmdAuth: AUTH password (or Redis 6's AUTH default password). A wrong
// password also forgets an earlier right one, as in Redis.
func cmdAuth(s *Server, c *call) {
	var given []byte
	switch len(c.args) {
	case 2:
		given = c.args[1]
	case 3:
		if !is(c.args[1], "default") {
			c.conn.WriteError(errBadPassword)
			return
		}
		given = c.args[2]
	default:
		c.conn.WriteError(errSyntax)
		return
	}
	pass := s.password()
	if pass == "" {
		c.conn.WriteError(errNoPasswordSet)
		return
	}
	if subtle.ConstantTimeCompare(given, []byte(pass)) != 1 {
		c.client.authed = false
		c.conn.WriteError(errBadPassword)
		return
	}
	c.client.authed = true
	c.conn.WriteString("OK")
}

// cmdClient: CLIENT LIST | INFO | ID | SETNAME name | GETNAME | KILL ….
// Anything else — SETINFO, go-redis's handshake, among them — is an error
// reply, never a hang.
func cmdClient(s *Server, c *call) {
	sub := strings.ToLower(string(c.args[1]))
	wantArgs := map[string]int{"list": 2, "info": 2, "id": 2, "getname": 2, "setname": 3}
	if n, ok := wantArgs[sub]; ok && len(c.args) != n {
		c.conn.WriteError(fmt.Sprintf("ERR wrong number of arguments for 'client|%s' command", sub))
		return
	}
	switch sub {
	case "list":
		now := time.Now()
		var b strings.Builder
		for _, cl := range s.clientList() {
			b.WriteString(cl.info(now))
			b.WriteByte('\n')
		}
		c.conn.WriteBulkString(b.String())
	case "info":
		c.conn.WriteBulkString(c.client.info(time.Now()) + "\n")
	case "id":
		c.conn.WriteInt64(c.client.id)
	case "getname":
		c.client.mu.Lock()
		name := c.client.name
		c.client.mu.Unlock()
		if name == "" {
			c.conn.WriteNull()
			return
		}
		c.conn.WriteBulkString(name)
	case "setname":
		name := string(c.args[2])
		if !validClientName(name) {
			c.conn.WriteError(errClientName)
			return
		}
		c.client.mu.Lock()
		c.client.name = name
		c.client.mu.Unlock()
		c.conn.WriteString("OK")
	case "kill":
		cmdClientKill(s, c)
	default:
		c.conn.WriteError(fmt.Sprintf("ERR unknown CLIENT subcommand '%s'", truncate(string(c.args[1]), 64)))
	}
}

// validClientName: Redis allows '!' through '~' only; "" clears the name.
func validClientName(name string) bool {
	for i := 0; i < len(name); i++ {
		if name[i] < '!' || name[i] > '~' {
			return false
		}
	}
	return true
}

// cmdClientKill: CLIENT KILL ip:port → +OK or -ERR No such client (the old
// form); CLIENT KILL [ID id] [ADDR ip:port] [SKIPME yes|no] → the number of
// clients killed (Redis's filter form, which go-redis's ClientKillByFilter
// reads as an integer). SKIPME defaults to yes: the caller is spared.
func cmdClientKill(s *Server, c *call) {
	if len(c.args) == 3 {
		addr := string(c.args[2])
		for _, cl := range s.clientList() {
			if cl.addr == addr {
				s.kill(c, cl, "+OK")
				return
			}
		}
		c.conn.WriteError(errNoSuchClient)
		return
	}
	if len(c.args) < 3 || len(c.args)%2 != 0 {
		c.conn.WriteError(errSyntax)
		return
	}
	var id int64
	var addr string
	skipMe := true
	for i := 2; i < len(c.args); i += 2 {
		v := c.args[i+1]
		switch strings.ToLower(string(c.args[i])) {
		case "id":
			n, ok := parseInt(v)
			if !ok || n <= 0 {
				c.conn.WriteError("ERR client-id should be greater than 0")
				return
			}
			id = n
		case "addr":
			addr = string(v)
		case "skipme":
			switch {
			case is(v, "yes"):
				skipMe = true
			case is(v, "no"):
				skipMe = false
			default:
				c.conn.WriteError(errSyntax)
				return
			}
		default:
			c.conn.WriteError(errSyntax)
			return
		}
	}
	killed, self := 0, false
	for _, cl := range s.clientList() {
		if id != 0 && cl.id != id || addr != "" && cl.addr != addr {
			continue
		}
		if cl == c.client {
			if !skipMe {
				self = true
				killed++
			}
			continue
		}
		_ = cl.netConn.Close()
		killed++
	}
	if self {
		s.kill(c, c.client, ":"+strconv.Itoa(killed))
		return
	}
	c.conn.WriteInt(killed)
}

// kill closes cl's connection after writing reply (a raw RESP line without
// CRLF) to the caller. A client killing itself gets the reply first, and
// nothing after this command runs.
func (s *Server) kill(c *call, cl *client, reply string) {
	c.conn.WriteRaw([]byte(reply + "\r\n"))
	if cl == c.client {
		flush(c.conn)
		c.conn.Close()
		c.consumed = len(c.rest)
		return
	}
	// Closing the socket makes that connection's own goroutine see an
	// error and clean up; a GETJOB it is blocked in gives up.
	_ = cl.netConn.Close()
}

// clientList returns the connected clients by id.
func (s *Server) clientList() []*client {
	s.mu.Lock()
	list := make([]*client, 0, len(s.clients))
	for _, cl := range s.clients {
		list = append(list, cl)
	}
	s.mu.Unlock()
	slices.SortFunc(list, func(a, b *client) int { return cmp.Compare(a.id, b.id) })
	return list
}
