package storage

import (
	"cmp"
	"encoding/binary"
	"slices"
	"strings"
)

// sortEntries sorts es by key. A flush sorts the buffer's job keys (random
// ids, tens of thousands of them) and its schedule keys, and comparing the
// keys themselves followed two pointers into the arena per comparison — a
// cache miss each — to compare bytes that are mostly the same: every job
// key starts with the key prefix, "D-" and this node's id, every schedule
// key of one flush with the high bytes of nearby due times. So it first
// finds the prefix all the keys share and sorts on the next eight bytes as
// an integer held beside each entry, comparing whole keys only to break a
// tie. The order is the keys' (cmpEntryKey): the shared prefix compares
// equal, the big-endian word orders the next eight bytes as bytes do (a
// key that ends inside them is padded with zeros, and a tie between
// padded words goes to the whole keys).
func sortEntries(es []*bufEntry) {
	if len(es) < 2 {
		return
	}
	first := es[0].key
	lcp := len(first)
	for _, e := range es[1:] {
		n := min(lcp, len(e.key))
		i := 0
		for i < n && first[i] == e.key[i] {
			i++
		}
		if lcp = i; lcp == 0 {
			break
		}
	}
	type keyed struct {
		w uint64
		e *bufEntry
	}
	ks := make([]keyed, len(es))
	for i, e := range es {
		ks[i] = keyed{keyWord(e.key, lcp), e}
	}
	slices.SortFunc(ks, func(a, b keyed) int {
		if c := cmp.Compare(a.w, b.w); c != 0 {
			return c
		}
		return strings.Compare(a.e.key, b.e.key)
	})
	for i := range ks {
		es[i] = ks[i].e
	}
}

// keyWord is the eight bytes of key from at on, big-endian, zero-padded
// past its end.
func keyWord(key string, at int) uint64 {
	if len(key)-at >= 8 {
		return binary.BigEndian.Uint64(unsafeBytes(key[at : at+8]))
	}
	var b [8]byte
	copy(b[:], key[at:])
	return binary.BigEndian.Uint64(b[:])
}
