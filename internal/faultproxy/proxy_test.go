package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/diskque/diskque/internal/leakcheck"
)

func TestMain(m *testing.M) { os.Exit(leakcheck.Main(m)) }

// echoServer echoes every line back on 127.0.0.1 (or ip) until the test
// ends.
func echoServer(t *testing.T, ip string) string {
	t.Helper()
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() { ln.Close(); <-done })
	go func() {
		defer close(done)
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns = append(conns, c)
			go func() { io.Copy(c, c); c.(*net.TCPConn).CloseWrite() }()
		}
	}()
	return ln.Addr().String()
}

// dialFrom connects to addr from source address src.
func dialFrom(t *testing.T, src netip.Addr, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: src.AsSlice()}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s from %s: %v", addr, src, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes line and reads it back within timeout.
func roundTrip(c net.Conn, line string, timeout time.Duration) error {
	c.SetDeadline(time.Now().Add(timeout))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, line+"\n"); err != nil {
		return err
	}
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if got != line+"\n" {
		return errors.New("echoed " + got)
	}
	return nil
}

var (
	srcA = netip.MustParseAddr("127.0.0.7")
	srcB = netip.MustParseAddr("127.0.0.8")
)

func listenProxy(t *testing.T, target string) *Proxy {
	t.Helper()
	p, err := Listen("127.0.0.1:0", target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func TestProxyForwardsBothWaysAndCounts(t *testing.T) {
	p := listenProxy(t, echoServer(t, "127.0.0.1"))
	c := dialFrom(t, srcA, p.Addr().String())
	if err := roundTrip(c, "hello", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	// The counters follow the writes: poll.
	want := Stats{Accepted: 1, Open: 1, BytesUp: 6, BytesDown: 6}
	if !pollFor(5*time.Second, func() bool { return p.Stats() == want }) {
		t.Fatalf("stats after one echo = %+v, want %+v", p.Stats(), want)
	}
	// A half-close reaches the target, whose EOF comes back.
	c.(*net.TCPConn).CloseWrite()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("read after CloseWrite = %d, %v; want EOF", n, err)
	}
}

func TestProxyResetCutsOneSourceOnly(t *testing.T) {
	p := listenProxy(t, echoServer(t, "127.0.0.1"))
	a := dialFrom(t, srcA, p.Addr().String())
	b := dialFrom(t, srcB, p.Addr().String())
	for _, c := range []net.Conn{a, b} {
		if err := roundTrip(c, "x", 5*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	p.SetRule(srcA, Rule{Reset: true})
	if err := roundTrip(a, "y", 5*time.Second); err == nil {
		t.Fatal("a connection from a cut source still echoes")
	}
	if err := roundTrip(b, "y", 5*time.Second); err != nil {
		t.Fatalf("a connection from another source: %v", err)
	}
	// New connections from the cut source are reset at accept.
	// (The reset may even beat the end of the dialler's connect.)
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: srcA.AsSlice()}}
	if a2, err := d.Dial("tcp", p.Addr().String()); err == nil {
		defer a2.Close()
		if err := roundTrip(a2, "z", 5*time.Second); err == nil {
			t.Fatal("a new connection from a cut source echoes")
		}
	}
	if s := p.Stats(); s.Reset != 1 || s.Refused != 1 {
		t.Fatalf("stats = %+v, want 1 reset and 1 refused", s)
	}
	p.SetRule(srcA, Rule{})
	a3 := dialFrom(t, srcA, p.Addr().String())
	if err := roundTrip(a3, "healed", 5*time.Second); err != nil {
		t.Fatalf("after the heal: %v", err)
	}
}

func TestProxyHoldBlackHolesUntilLifted(t *testing.T) {
	p := listenProxy(t, echoServer(t, "127.0.0.1"))
	c := dialFrom(t, srcA, p.Addr().String())
	p.SetRule(srcA, Rule{HoldDown: true})
	// The echo is held on its way back: nothing arrives while the hold is
	// on (the connection stays open).
	if _, err := io.WriteString(c, "held\n"); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	if n, err := c.Read(make([]byte, 8)); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read under a hold = %d, %v; want a timeout", n, err)
	}
	if !pollFor(5*time.Second, func() bool { return p.Stats().BytesUp == 5 }) {
		t.Fatalf("bytes up under a down-hold = %d, want 5 (up is not held)", p.Stats().BytesUp)
	}
	if got := p.Stats().BytesDown; got != 0 {
		t.Fatalf("bytes down under a down-hold = %d, want 0", got)
	}
	p.ClearRules()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "held\n" {
		t.Fatalf("after lifting the hold: %q, %v", got, err)
	}
}

func TestProxyDelayAddsLatencyEachWay(t *testing.T) {
	p := listenProxy(t, echoServer(t, "127.0.0.1"))
	c := dialFrom(t, srcA, p.Addr().String())
	if err := roundTrip(c, "warm", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetRule(srcA, Rule{Up: 100 * time.Millisecond, Down: 150 * time.Millisecond})
	start := time.Now()
	if err := roundTrip(c, "slow", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if rtt := time.Since(start); rtt < 250*time.Millisecond {
		t.Fatalf("round trip under 100+150 ms of delay took %v", rtt)
	}
	// The delay is the source's: another has no rule.
	if r := p.Rule(srcB); r != (Rule{}) {
		t.Fatalf("rule of another source = %+v", r)
	}
	// Lifting the delay releases what is waiting at once: a 1-minute delay
	// cleared mid-flight does not hold the echo for a minute.
	p.SetRule(srcA, Rule{Up: time.Minute})
	io.WriteString(c, "late\n")
	p.SetRule(srcA, Rule{})
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || got != "late\n" {
		t.Fatalf("after lifting the delay: %q, %v", got, err)
	}
}

func TestProxyCloseEndsConnections(t *testing.T) {
	p, err := Listen("127.0.0.1:0", echoServer(t, "127.0.0.1"))
	if err != nil {
		t.Fatal(err)
	}
	c := dialFrom(t, srcA, p.Addr().String())
	if err := roundTrip(c, "x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.SetRule(srcA, Rule{HoldUp: true}) // a held pipe must not keep Close waiting
	io.WriteString(c, "stuck\n")
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Fatal("a connection outlived its proxy")
	}
}

func TestProxyTargetDownClosesConnection(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	p := listenProxy(t, dead)
	// The reset may even beat the end of the dialler's connect.
	d := net.Dialer{Timeout: 5 * time.Second, LocalAddr: &net.TCPAddr{IP: srcA.AsSlice()}}
	if c, err := d.Dial("tcp", p.Addr().String()); err == nil {
		defer c.Close()
		if err := roundTrip(c, "x", 5*time.Second); err == nil {
			t.Fatal("echo through a proxy whose target is down")
		}
	}
	if !pollFor(5*time.Second, func() bool { return p.Stats().DialErrs == 1 }) {
		t.Fatalf("stats = %+v, want 1 dial error", p.Stats())
	}
}

func pollFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return true
		}
		time.Sleep(5 * time.Millisecond)
	}
	return cond()
}
