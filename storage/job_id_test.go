package storage

import (
	"strings"
	"testing"
)

// TestJobIDShape: every id has SPEC.md's shape — "D-", the node's 8 hex
// digits, 24 characters of A-Za-z0-9+/, the TTL's 4 hex digits — whatever
// the ctime, and the TTL digits say what IDTTLMinutes and IDAtMostOnce read.
func TestJobIDShape(t *testing.T) {
	const middle = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
	for _, ctime := range []uint64{0, 1, 1e15, 1_764_000_000_000 * 1_000_000, 1<<63 + 12345, ^uint64(0)} {
		for _, c := range []struct{ ttl, retry, mins int64 }{{3600, 60, 61}, {3600, 0, 60}, {1 << 30, 1, 65535}, {-5, 0, 0}} {
			id := NewJobIDAt("3f9a1c2e77", ctime, c.ttl, c.retry)
			if !ValidJobID(id) || !strings.HasPrefix(id, "D-3f9a1c2e-") {
				t.Fatalf("ctime %d: id %q has not the shape D-<node 8>-<24>-<4>", ctime, id)
			}
			for _, ch := range id[11:35] {
				if !strings.ContainsRune(middle, ch) {
					t.Fatalf("ctime %d: id %q has %q in its middle part", ctime, id, ch)
				}
			}
			if got := IDTTLMinutes(id); got != c.mins {
				t.Errorf("id %q: TTL %d minutes, want %d", id, got, c.mins)
			}
			if IDAtMostOnce(id) != (c.retry == 0) {
				t.Errorf("id %q: at-most-once %v with retry %d", id, IDAtMostOnce(id), c.retry)
			}
		}
	}
	if id := NewJobIDAt("ab", 7, 60, 1); !strings.HasPrefix(id, "D-ab000000-") || !ValidJobID(id) {
		t.Errorf("short node id: %q", id)
	}
}

// TestJobIDsSortByCtime: ids of one node compare as their ctimes do, for
// neighbouring ctimes and ones far apart (every digit carried), so the
// index's job keys arrive in order; ids with the same ctime still differ.
func TestJobIDsSortByCtime(t *testing.T) {
	ctimes := []uint64{0, 1, 2, 63, 64, 65, 4095, 4096, 1e15, 1e15 + 1}
	for c := uint64(1_764_000_000_000) * 1_000_000; len(ctimes) < 2000; c += 999_983 {
		ctimes = append(ctimes, c, c+1)
	}
	ctimes = append(ctimes, 1<<62, 1<<63-1, 1<<63, ^uint64(0)-1, ^uint64(0))
	prev := ""
	for _, c := range ctimes {
		id := NewJobIDAt("0123abcd", c, 86400, 60)
		if prev != "" && id <= prev {
			t.Fatalf("ctime %d: id %q does not sort after the previous ctime's %q", c, id, prev)
		}
		prev = id
	}
	seen := map[string]bool{}
	for range 10000 {
		id := NewJobIDAt("0123abcd", 1e15, 86400, 60)
		if seen[id] {
			t.Fatalf("id %q made twice for one ctime", id)
		}
		seen[id] = true
	}
}

// TestJobIDsOrderedAcrossClockStepBack: ids made from a CtimeClock's ctimes
// keep sorting in the order made when the wall clock steps back, since the
// clock's ctimes never do.
func TestJobIDsOrderedAcrossClockStepBack(t *testing.T) {
	var clk CtimeClock
	now := int64(1_764_000_000_000)
	prev := ""
	for i := range 3000 {
		switch i {
		case 1000:
			now -= 60_000 // a minute back
		case 2000:
			now -= 1 // and a millisecond, with jobs in it
		}
		if i%7 == 0 {
			now++
		}
		id := NewJobIDAt("0123abcd", clk.Next(now), 86400, 60)
		if id <= prev {
			t.Fatalf("job %d: id %q does not sort after %q", i, id, prev)
		}
		prev = id
	}
}
