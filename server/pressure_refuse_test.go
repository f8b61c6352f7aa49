package server

import "testing"

// RefusesCopies (the job protocol's RefuseCopies) says why while the node
// is leaving or short of memory or disk, and "" otherwise.
func TestRefusesCopies(t *testing.T) {
	s, addr := startServer(t)
	s.SetBroker(newBroker(t))
	if why := s.RefusesCopies(); why != "" {
		t.Fatalf("a node neither leaving nor short refuses copies: %q", why)
	}
	c := newClientOn(t, addr)
	if got := do(t, c, "CLUSTER", "LEAVING", "yes"); got != "OK" {
		t.Fatalf("CLUSTER LEAVING yes: %v", got)
	}
	if why := s.RefusesCopies(); why != "leaving" {
		t.Errorf("leaving: RefusesCopies %q, want \"leaving\"", why)
	}
	do(t, c, "CLUSTER", "LEAVING", "no")
	for _, f := range []struct {
		name string
		set  func(bool)
		want string
	}{
		{"memory high", s.guard.memHigh.Store, "memory short"},
		{"out of memory", s.guard.oom.Store, "memory short"},
		{"disk low", s.guard.diskLow.Store, "disk short"},
		{"no space", s.guard.noSpace.Store, "disk short"},
	} {
		f.set(true)
		if why := s.RefusesCopies(); why != f.want {
			t.Errorf("%s: RefusesCopies %q, want %q", f.name, why, f.want)
		}
		f.set(false)
	}
	if why := s.RefusesCopies(); why != "" {
		t.Errorf("after all cleared: %q", why)
	}
}
