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
