package storage

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestSortEntriesIsKeyOrder: sortEntries orders entries as comparing their
// keys does, for keys sharing long prefixes, keys that are prefixes of
// others, keys ending inside the compared word, zero bytes, repeats and
// the empty key.
func TestSortEntriesIsKeyOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte{0, 1, 'a', 'b', 0xfe, 0xff}
	for round := range 3000 {
		n := rng.IntN(40)
		prefix := make([]byte, rng.IntN(14))
		for i := range prefix {
			prefix[i] = alphabet[rng.IntN(len(alphabet))]
		}
		var es []*bufEntry
		for range n {
			k := append([]byte(nil), prefix[:rng.IntN(len(prefix)+1)]...)
			if rng.IntN(4) > 0 {
				k = prefix
			}
			tail := make([]byte, rng.IntN(12))
			for i := range tail {
				tail[i] = alphabet[rng.IntN(len(alphabet))]
			}
			es = append(es, &bufEntry{key: string(append(append([]byte(nil), k...), tail...))})
		}
		got := slices.Clone(es)
		sortEntries(got)
		want := slices.Clone(es)
		slices.SortStableFunc(want, cmpEntryKey)
		for i := range want {
			if got[i].key != want[i].key {
				t.Fatalf("round %d: position %d: %q, want %q (keys %q)", round, i, got[i].key, want[i].key, keysOf(want))
			}
		}
	}
}

func keysOf(es []*bufEntry) []string {
	var ks []string
	for _, e := range es {
		ks = append(ks, e.key)
	}
	return ks
}

// BenchmarkSortEntries: a flush's job keys (random ids of one node), by
// sortEntries and by comparing the keys.
func BenchmarkSortEntries(b *testing.B) {
	// As in the buffer: each job's entry among its others (a queue key,
	// schedule keys) in the slabs, its key among theirs in the arena.
	const n, others = 20000, 4
	slab := make([]bufEntry, n*(others+1))
	var arena []byte
	es := make([]*bufEntry, n)
	for i := range es {
		id := NewJobID("3f9a1c2e9b0d4e5f6a7b8c9d0e1f2a3b4c5d6e7f", 86400, 300)
		at := len(arena)
		arena = appendJobKey(arena, id)
		arena = append(arena, make([]byte, others*56)...)
		slab[i*(others+1)].key = unsafeString(arena[at : at+len(id)+1])
		es[i] = &slab[i*(others+1)]
	}
	for i := range es {
		es[i].key = strings.Clone(es[i].key) // the arena moved as it grew
	}
	work := make([]*bufEntry, len(es))
	b.Run("words", func(b *testing.B) {
		for b.Loop() {
			copy(work, es)
			sortEntries(work)
		}
	})
	b.Run("keys", func(b *testing.B) {
		for b.Loop() {
			copy(work, es)
			slices.SortFunc(work, cmpEntryKey)
		}
	})
}
