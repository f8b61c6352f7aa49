package storage

import (
	"fmt"
	"testing"
)

func TestJobCacheEvictsOldestFirst(t *testing.T) {
	c := newJobCache(3)
	for i := 0; i < 5; i++ {
		c.put(&Job{ID: fmt.Sprint(i)})
	}
	for i, want := range []bool{false, false, true, true, true} {
		if _, ok := c.get(fmt.Sprint(i)); ok != want {
			t.Errorf("job %d cached = %v, want %v", i, ok, want)
		}
	}
	// An update keeps the entry's place and replaces the job.
	c.put(&Job{ID: "2", Nacks: 7})
	if j, _ := c.get("2"); j.Nacks != 7 {
		t.Fatalf("update lost: %+v", j)
	}
	c.drop("3")
	if _, ok := c.get("3"); ok {
		t.Fatal("dropped job still cached")
	}
	var nilCache *jobCache
	nilCache.put(&Job{ID: "x"})
	if _, ok := nilCache.get("x"); ok {
		t.Fatal("a disabled cache returned a job")
	}
}

// A job dropped and cached again while the ring's next slot is still its
// own (put inserts before it evicts) stays cached.
func TestJobCachePutIntoItsOwnStaleSlot(t *testing.T) {
	c := newJobCache(3)
	for _, id := range []string{"a", "b", "c"} {
		c.put(&Job{ID: id})
	}
	c.drop("a") // its slot, the next to be reused, still says "a"
	c.put(&Job{ID: "a", Nacks: 1})
	if j, ok := c.get("a"); !ok || j.Nacks != 1 {
		t.Fatalf("a re-cached into its own slot: %+v, %v", j, ok)
	}
	if len(c.m) != 3 {
		t.Fatalf("%d jobs cached, want 3 (b, c, a)", len(c.m))
	}
}
