package server

import (
	"net"
	"testing"
)

// TestMeetResolvesAHostName: CLUSTER MEET of a name looks it up (once, with
// a timeout) and meets its address; a name with no address is refused.
func TestMeetResolvesAHostName(t *testing.T) {
	ip, ok := resolveMeetHost("localhost")
	if !ok || net.ParseIP(ip) == nil || !net.ParseIP(ip).IsLoopback() {
		t.Fatalf("resolveMeetHost(localhost) = %q, %v", ip, ok)
	}
	for _, bad := range []string{"", "no-such-host.invalid"} {
		if ip, ok := resolveMeetHost(bad); ok {
			t.Errorf("resolveMeetHost(%q) = %q", bad, ip)
		}
	}
}
