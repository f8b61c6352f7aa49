package queue

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/diskque/diskque/storage"
)

// TestHeadAgainstModel drives a Head with a small capacity next to a sorted
// slice holding the whole queue (what the disk index holds), refilling from
// it like the broker does, and checks that every Pop returns the queue's
// oldest entry.
func TestHeadAgainstModel(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, seed))
	for _, capacity := range []int{1, 2, 5, 16} {
		h := NewHead(capacity)
		var disk []storage.QueuePos // the whole queue, sorted
		next := uint64(1000)
		refill := func() {
			after, ok := h.Last()
			i := 0
			if ok {
				i, _ = slices.BinarySearchFunc(disk, after, storage.QueuePos.Compare)
				if i < len(disk) && disk[i] == after {
					i++
				}
			}
			want := capacity - h.Len()
			end := min(i+want, len(disk))
			h.Refill(disk[i:end], end == len(disk))
		}
		for step := 0; step < 20000; step++ {
			switch r := rng.IntN(10); {
			case r < 4: // a new job: newest ctime
				next += uint64(rng.IntN(3))
				p := storage.QueuePos{Ctime: next, ID: fmt.Sprintf("id%06d", step)}
				if slices.Contains(disk, p) {
					continue
				}
				disk = insertPos(disk, p)
				h.Insert(p)
			case r < 6: // a requeue: an old ctime slots back in order
				p := storage.QueuePos{Ctime: uint64(rng.IntN(int(next) + 1)), ID: fmt.Sprintf("rq%06d", step)}
				disk = insertPos(disk, p)
				h.Insert(p)
			case r < 9: // GETJOB
				if h.NeedsRefill() || h.Len() == 0 && !h.Complete() {
					refill()
				}
				got, ok := h.Pop()
				if len(disk) == 0 {
					if ok {
						t.Fatalf("cap %d step %d: popped %v from an empty queue", capacity, step, got)
					}
					continue
				}
				if !ok || got != disk[0] {
					t.Fatalf("cap %d step %d: popped %v %v, oldest is %v", capacity, step, got, ok, disk[0])
				}
				disk = disk[1:]
			default: // DEQUEUE / ACK of a queued job
				if len(disk) == 0 {
					continue
				}
				i := rng.IntN(len(disk))
				h.Remove(disk[i])
				disk = slices.Delete(disk, i, i+1)
			}
			if h.Len() > capacity {
				t.Fatalf("cap %d: %d entries in memory", capacity, h.Len())
			}
			mem := h.Entries()
			if len(mem) > len(disk) || !slices.Equal(mem, disk[:len(mem)]) {
				t.Fatalf("cap %d step %d: memory %v is not the front of the queue %v", capacity, step, mem, disk[:min(len(disk), len(mem)+2)])
			}
			if h.Complete() && len(mem) != len(disk) {
				t.Fatalf("cap %d step %d: complete with %d of %d entries", capacity, step, len(mem), len(disk))
			}
		}
	}
}

func insertPos(s []storage.QueuePos, p storage.QueuePos) []storage.QueuePos {
	i, found := slices.BinarySearchFunc(s, p, storage.QueuePos.Compare)
	if found {
		return s
	}
	return slices.Insert(s, i, p)
}
