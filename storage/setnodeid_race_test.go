package storage

import (
	"errors"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestSetNodeIDRefusesAJobAddedDuringIt: a job that commits after
// SetNodeID began (here from its hook, before its record applies) makes it
// fail with ErrNotEmpty. It read the count first and then committed: an
// add in between passed, and the store held a job under the new id.
func TestSetNodeIDRefusesAJobAddedDuringIt(t *testing.T) {
	s := mustOpen(t, vfs.NewMem())
	defer s.Close()
	old := s.NodeID()
	setNodeIDHook = func() {
		if err := s.Add(newTestJob(old, "q", 1_000_000, 1), nil); err != nil {
			t.Error(err)
		}
	}
	defer func() { setNodeIDHook = nil }()
	const id = "0123456789abcdef0123456789abcdef01234567"
	if err := s.SetNodeID(id); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("SetNodeID with a job added meanwhile: %v, want ErrNotEmpty", err)
	}
	if s.NodeID() != old {
		t.Fatalf("node id changed to %s", s.NodeID())
	}
}
