package main

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The addresses a node announces and dials from (cluster-announce-ip,
// cluster-announce-port, cluster-announce-bus-port, bind-source-addr):
// parsed, shown by CONFIG GET, kept by CONFIG REWRITE, and what the bus is
// given.
func TestConfigAnnounceAndSourceAddresses(t *testing.T) {
	cfg, err := parseArgs([]string{"--port", "7000", "--bind", "0.0.0.0"})
	if err != nil {
		t.Fatal(err)
	}
	// Defaults: nothing announced beyond what is listened on; no source
	// address under a wildcard bind.
	if got := cfg.announcedClientAddr(7000); got != "127.0.0.1:7000" {
		t.Errorf("client address under bind 0.0.0.0 = %s", got)
	}
	if got := cfg.announcedBusAddr(17000); got != "" {
		t.Errorf("announced bus address by default = %q, want none", got)
	}
	if cfg.sourceAddr().IsValid() {
		t.Errorf("source address under bind 0.0.0.0 = %s, want none", cfg.sourceAddr())
	}

	cfg, err = parseArgs([]string{"--bind", "127.0.0.3"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.sourceAddr(); got != netip.MustParseAddr("127.0.0.3") {
		t.Errorf("source address under bind 127.0.0.3 = %s", got)
	}
	if got := cfg.announcedClientAddr(7000); got != "127.0.0.3:7000" {
		t.Errorf("client address under bind 127.0.0.3 = %s", got)
	}

	cfg, err = parseArgs([]string{"--bind", "127.0.0.3", "--bind-source-addr", "127.0.0.4",
		"--cluster-announce-bus-port", "20001"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.sourceAddr(); got != netip.MustParseAddr("127.0.0.4") {
		t.Errorf("bind-source-addr 127.0.0.4: source %s", got)
	}
	if got := cfg.announcedBusAddr(17000); got != "127.0.0.3:20001" {
		t.Errorf("announce-bus-port alone: bus %q, want bind's IP and the announced port", got)
	}

	cfg, err = parseArgs([]string{"--cluster-announce-ip", "10.1.2.3", "--cluster-announce-port", "30000"})
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.announcedClientAddr(7711); got != "10.1.2.3:30000" {
		t.Errorf("announced client address = %s", got)
	}
	if got := cfg.announcedBusAddr(17711); got != "10.1.2.3:17711" {
		t.Errorf("announce-ip alone: bus %q, want the announced IP and the bus port listened on", got)
	}

	for _, args := range [][]string{
		{"--cluster-announce-ip", "example.com"},
		{"--cluster-announce-ip", "0.0.0.0"},
		{"--bind-source-addr", "::"},
		{"--bind-source-addr", "1.2.3"},
		{"--cluster-announce-port", "65536"},
		{"--cluster-announce-bus-port", "-1"},
		{"--cluster-announce-bus-port", "x"},
	} {
		if _, err := parseArgs(args); err == nil {
			t.Errorf("%v: accepted", args)
		}
	}

	// CONFIG GET shows them; CONFIG REWRITE writes the ones set, and the
	// file it wrote reads back the same.
	dir := t.TempDir()
	file := filepath.Join(dir, "diskque.conf")
	if err := os.WriteFile(file, []byte("port 7000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err = parseArgs([]string{file, "--bind-source-addr", "127.0.0.5", "--cluster-announce-ip", "127.0.0.6",
		"--cluster-announce-bus-port", "20002"})
	if err != nil {
		t.Fatal(err)
	}
	l := &liveConfig{cfg: cfg}
	got := strings.Join(l.Get("*announce*"), " ")
	if want := "cluster-announce-ip 127.0.0.6 cluster-announce-port 0 cluster-announce-bus-port 20002"; got != want {
		t.Errorf("CONFIG GET *announce* = %q, want %q", got, want)
	}
	if err := l.Rewrite(); err != nil {
		t.Fatal(err)
	}
	data, _ := os.ReadFile(file)
	for _, line := range []string{"bind-source-addr 127.0.0.5\n", "cluster-announce-ip 127.0.0.6\n", "cluster-announce-bus-port 20002\n"} {
		if !strings.Contains(string(data), line) {
			t.Errorf("rewritten file lacks %q:\n%s", line, data)
		}
	}
	if strings.Contains(string(data), "cluster-announce-port") {
		t.Errorf("rewritten file has the default cluster-announce-port:\n%s", data)
	}
	again, err := parseArgs([]string{file})
	if err != nil {
		t.Fatal(err)
	}
	if again.BindSourceAddr != "127.0.0.5" || again.ClusterAnnounceIP != "127.0.0.6" || again.ClusterAnnounceBusPort != 20002 {
		t.Errorf("re-read after the rewrite: %+v", again)
	}
}

// TestAnnouncedAddressesAreWhatTheNodeGives: a node started with
// cluster-announce-ip and cluster-announce-port gives them as its own
// address in CLUSTER NODES and HELLO, while it listens where bind says.
func TestAnnouncedAddressesAreWhatTheNodeGives(t *testing.T) {
	s := startServer(t, "--cluster-announce-ip", "127.0.0.9", "--cluster-announce-port", "30000",
		"--cluster-announce-bus-port", "40000")
	c := s.client(t)
	id := myID(t, c)
	if l := clusterNodes(t, c)[id]; l.addr != "127.0.0.9:30000" || l.flags != "myself" {
		t.Errorf("CLUSTER NODES myself = %+v, want 127.0.0.9:30000", l)
	}
	hello := doArr(t, c, "HELLO")
	self := hello[2].([]any)
	if self[0] != id || self[1] != "127.0.0.9" || self[2] != "30000" {
		t.Errorf("HELLO's own entry = %v, want %s 127.0.0.9 30000", self, id)
	}
	if got := doArr(t, c, "CONFIG", "GET", "cluster-announce-bus-port"); len(got) != 2 || got[1] != "40000" {
		t.Errorf("CONFIG GET cluster-announce-bus-port = %v", got)
	}
}
