package cputime

import "testing"

// TestUsedGrowsWithWork: spinning for a while shows up as CPU time.
func TestUsedGrowsWithWork(t *testing.T) {
	before := Used()
	if before <= 0 {
		t.Fatalf("Used() = %v before any work, want > 0", before)
	}
	x := uint64(1)
	for Used()-before < 2_000_000 { // 2 ms of CPU
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
	}
	if after := Used(); after < before {
		t.Fatalf("Used() went back from %v to %v (%d)", before, after, x)
	}
}
