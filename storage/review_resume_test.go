package storage

import (
	"slices"
	"testing"

	"github.com/cockroachdb/pebble/v2/vfs"
)

// TestReviewScanResumableShortPageMidScan: a job of the resume set that
// leaves it between ScanResumable's read of a page of r/ keys and its read
// of the jobs (a DELJOB or a TTL expiry while replication.Jobs.resume
// runs: the transport and the broker are live) makes the page short, and
// its caller (resume, and the documented contract: "a page shorter than
// limit ends the scan") stops there: the resumable jobs after it are
// never resumed (an acked job's copies are then requeued elsewhere).
func TestReviewScanResumableShortPageMidScan(t *testing.T) {
	opts := TestingOptions()
	opts.FS = vfs.Default
	s, err := Open(t.TempDir(), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	want := resumableFixture(t, s, 60)
	if len(want) < 8 {
		t.Fatalf("fixture: %d", len(want))
	}
	victim := want[1]
	once := true
	afterResumePage = func() {
		if !once {
			return
		}
		once = false
		b := s.NewBatch()
		b.Delete(victim)
		for _, r := range s.Commit(b) {
			if r.Err != nil {
				t.Error(r.Err)
			}
		}
	}
	t.Cleanup(func() { afterResumePage = nil })
	got := resumableIDs(t, s, 4)
	rest := slices.DeleteFunc(slices.Clone(want), func(id string) bool { return id == victim })
	if !slices.Equal(got, rest) {
		t.Fatalf("the scan found %d of the %d resumable jobs left", len(got), len(rest))
	}
}
