package replication

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"
)

// TestAckTableGivesTheDueCollectionsInOrder: the rounds come out by due
// time, dropped and rescheduled collections included, and none before it
// is due.
func TestAckTableGivesTheDueCollectionsInOrder(t *testing.T) {
	base := time.Unix(1000, 0)
	tab := newAckTable()
	want := map[string]time.Time{}
	for i := range 500 {
		id := fmt.Sprint(i)
		next := base.Add(time.Duration(rand.IntN(10_000)) * time.Millisecond)
		tab.put(id, &ackGC{next: next})
		want[id] = next
	}
	for i := 0; i < 500; i += 3 {
		tab.drop(fmt.Sprint(i))
		delete(want, fmt.Sprint(i))
	}
	for i := 1; i < 500; i += 7 {
		id := fmt.Sprint(i)
		if gc := tab.get(id); gc != nil {
			next := base.Add(time.Duration(rand.IntN(10_000)) * time.Millisecond)
			tab.reschedule(gc, next)
			want[id] = next
		}
	}
	if tab.len() != len(want) {
		t.Fatalf("%d collections, want %d", tab.len(), len(want))
	}
	if gc := tab.first(base.Add(-time.Millisecond)); gc != nil {
		t.Fatalf("%s given before it was due", gc.id)
	}
	last := base.Add(-time.Hour)
	for now := base; tab.len() > 0; now = now.Add(100 * time.Millisecond) {
		for gc := tab.first(now); gc != nil; gc = tab.first(now) {
			if gc.next.After(now) || gc.next.Before(last) || !gc.next.Equal(want[gc.id]) {
				t.Fatalf("%s due %v given at %v after one due %v (want due %v)", gc.id, gc.next, now, last, want[gc.id])
			}
			last = gc.next
			tab.drop(gc.id)
			delete(want, gc.id)
		}
	}
	if len(want) != 0 {
		t.Fatalf("%d collections never given", len(want))
	}
}
