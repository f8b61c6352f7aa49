package storage

import (
	"fmt"
	"testing"
)

func TestJobCacheEvictsOldestFirst(t *testing.T) {
	c := newJobCache(3)
	id := func(i int) string { return fmt.Sprintf("%040d", i) }
	for i := 0; i < 5; i++ {
		c.put(&Job{ID: id(i)})
	}
	for i, want := range []bool{false, false, true, true, true} {
		if _, ok := c.get(id(i)); ok != want {
			t.Errorf("job %d cached = %v, want %v", i, ok, want)
		}
	}
	// An update keeps the entry's place and replaces the job.
	c.put(&Job{ID: id(2), Nacks: 7})
	if j, _ := c.get(id(2)); j.Nacks != 7 {
		t.Fatalf("update lost: %+v", j)
	}
	c.drop(id(3))
	if _, ok := c.get(id(3)); ok {
		t.Fatal("dropped job still cached")
	}
	// An id of another length is never cached (the map's keys are ids'
	// bytes, JobIDLen of them).
	c.put(&Job{ID: "5"})
	if _, ok := c.get("5"); ok {
		t.Fatal("a short id was cached")
	}
	var nilCache *jobCache
	nilCache.put(&Job{ID: "x"})
	if _, ok := nilCache.get("x"); ok {
		t.Fatal("a disabled cache returned a job")
	}
}
