package server

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// startServerOpts runs a Server with opts on network address listen
// ("127.0.0.1:0", "0.0.0.0:0"); the broker is set by the caller.
func startServerOpts(t *testing.T, listen string, opts Options) (*Server, string) {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	s := New(opts)
	done := make(chan error, 1)
	go func() { done <- s.Serve(ln) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return s, ln.Addr().String()
}

// respConn is one test connection that reads whole replies.
type respConn struct {
	t *testing.T
	c net.Conn
	r *bufio.Reader
}

func dialResp(t *testing.T, addr string) *respConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &respConn{t: t, c: c, r: bufio.NewReader(c)}
}

func (rc *respConn) send(raw string) {
	rc.t.Helper()
	rc.c.SetWriteDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(rc.c, raw); err != nil {
		rc.t.Fatal(err)
	}
}

// read reads one reply as text: "+OK", "-ERR …", ":1", "$-1", "$body",
// "*-1", or "*[a b …]" for arrays.
func (rc *respConn) read() string {
	rc.t.Helper()
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	s, err := readResp(rc.r)
	if err != nil {
		rc.t.Fatalf("read reply: %v", err)
	}
	return s
}

// do sends one inline command and reads its reply.
func (rc *respConn) do(cmd string) string {
	rc.t.Helper()
	rc.send(cmd + "\r\n")
	return rc.read()
}

// closedByServer says whether the server closed the connection (EOF)
// without sending anything more.
func (rc *respConn) closedByServer() bool {
	rc.c.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err := rc.r.ReadByte()
	return errors.Is(err, io.EOF)
}

func readResp(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("empty reply line")
	}
	switch line[0] {
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return line, err
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		return "$" + string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil || n < 0 {
			return line, err
		}
		parts := make([]string, n)
		for i := range parts {
			if parts[i], err = readResp(r); err != nil {
				return "", err
			}
		}
		return "*[" + strings.Join(parts, " ") + "]", nil
	}
	return line, nil
}

func TestAuth(t *testing.T) {
	s, addr := startServerOpts(t, "127.0.0.1:0", Options{RequirePass: "s3cret"})
	s.SetBroker(newBroker(t))
	got := roundTrip(t, addr, "PING\r\nHELLO\r\nHELLO 3\r\nQLEN q\r\nADDJOB q x 0\r\nFOO\r\nQLEN\r\n"+
		"AUTH wrong\r\nQLEN q\r\nAUTH s3cret\r\nPING\r\nQLEN q\r\nAUTH wrong\r\nPING\r\nAUTH default s3cret\r\nPING\r\nQUIT\r\n", 17)
	want := []string{"-" + errNoAuth, "-" + errNoAuth, "-" + errNoAuth, "-" + errNoAuth, "-" + errNoAuth,
		"-ERR unknown command 'FOO'", "-ERR wrong number of arguments for 'qlen' command",
		"-" + errBadPassword, "-" + errNoAuth, "+OK", "+PONG", ":0",
		"-" + errBadPassword, "-" + errNoAuth, "+OK", "+PONG", "+OK"}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("reply %d = %q, want %q (all: %q)", i, got[i], want[i], got)
		}
	}
	// Authentication belongs to the connection.
	c1, c2 := dialResp(t, addr), dialResp(t, addr)
	if got := c1.do("AUTH s3cret"); got != "+OK" {
		t.Fatalf("AUTH = %q", got)
	}
	if got := c2.do("QLEN q"); got != "-"+errNoAuth {
		t.Errorf("other connection QLEN = %q, want NOAUTH", got)
	}
	if got := c1.do("QLEN q"); got != ":0" {
		t.Errorf("authenticated QLEN = %q", got)
	}
}

func TestAuthWithoutPassword(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	got := roundTrip(t, addr, "AUTH x\r\nPING\r\n", 2)
	if got[0] != "-"+errNoPasswordSet || got[1] != "+PONG" {
		t.Fatalf("replies = %q", got)
	}
}

func TestAuthWhileLoading(t *testing.T) {
	_, addr := startServerOpts(t, "127.0.0.1:0", Options{RequirePass: "pw"})
	got := roundTrip(t, addr, "INFO\r\nAUTH pw\r\nQLEN q\r\nPING\r\n", 4)
	if got[0] != "-"+errNoAuth || got[1] != "+OK" || !strings.HasPrefix(got[2], "-LOADING ") || got[3] != "+PONG" {
		t.Fatalf("replies = %q", got)
	}
}

func TestProtectedDenied(t *testing.T) {
	remote := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 40000} }
	for _, tc := range []struct {
		listen, pass, remote string
		denied               bool
	}{
		{"0.0.0.0", "", "10.1.2.3", true},
		{"::", "", "2001:db8::1", true},
		{"192.168.1.5", "", "192.168.1.9", true},
		{"0.0.0.0", "", "127.0.0.1", false},
		{"::", "", "::1", false},
		{"0.0.0.0", "pw", "10.1.2.3", false},
		{"127.0.0.1", "", "10.1.2.3", false}, // cannot happen, but a loopback bind is never protected
		{"", "", "10.1.2.3", false},          // not a TCP listener
	} {
		if got := protectedDenied(tc.listen, tc.pass, remote(tc.remote)); got != tc.denied {
			t.Errorf("protectedDenied(%q, %q, %s) = %v, want %v", tc.listen, tc.pass, tc.remote, got, tc.denied)
		}
	}
}

// A server on the wildcard address without a password serves loopback
// clients, refuses others with -DENIED and closes them.
func TestProtectedModeWildcardBind(t *testing.T) {
	s, addr := startServerOpts(t, "0.0.0.0:0", Options{})
	s.SetBroker(newBroker(t))
	_, port, _ := net.SplitHostPort(addr)
	if got := roundTrip(t, net.JoinHostPort("127.0.0.1", port), "PING\r\n", 1); got[0] != "+PONG" {
		t.Fatalf("loopback client: %q", got)
	}
	ip := nonLoopbackIPv4()
	if ip == nil {
		t.Skip("no non-loopback IPv4 address to connect from")
	}
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: ip}}
	c, err := d.Dial("tcp", net.JoinHostPort(ip.String(), port))
	if err != nil {
		t.Skipf("cannot reach our own %s: %v", ip, err)
	}
	rc := &respConn{t: t, c: c, r: bufio.NewReader(c)}
	defer c.Close()
	if got := rc.do("PING"); got != "-"+errDenied {
		t.Fatalf("remote client: %q, want -DENIED", got)
	}
	if !rc.closedByServer() {
		t.Error("refused connection not closed")
	}
	// Refused connections do not count (the count drops once the server
	// has noticed the close).
	eventually(t, "no connected clients", func() bool { return s.connectedClients() == 0 })
}

func nonLoopbackIPv4() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLoopback() && n.IP.To4() != nil && !n.IP.IsLinkLocalUnicast() {
			return n.IP
		}
	}
	return nil
}
