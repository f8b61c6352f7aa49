package storage

import (
	"encoding/binary"
	"fmt"
)

// Node ids interned (format 6). A replicated job's index value names the
// nodes that may hold a copy; spelled out that is 41 bytes a node, most of
// a job's value (154 bytes for three nodes against 30 for a lone node's
// job), and it is written twice for a queued job (its j/ and q/ keys). So
// the index gives every node id it has seen a small number, in a
// store-wide table of n/ keys (n <number:4> → node id), and a value lists
// the numbers (indexFlagNodeNums).
//
// The table is part of the index, derived from the log like the rest: the
// AOF's records still spell ids out, and putJob interns a list's new ids
// as it writes the value that refers to them, through the same write
// buffer, so a flush that carries a value carries (or follows) the n/ keys
// it needs, a replay after a crash interns again what the lost buffer had,
// and a rebuild from the log numbers afresh into a fresh index. Numbers are
// never reused (FLUSHALL keeps the table), so a number always means the id
// it first meant: the table grows by one key per node id the store ever
// saw, a few dozen in a cluster's life.

// nodeNames is what an index value may refer to instead of spelling node
// ids out: the store's own node list ([node id], for the flag
// indexFlagSelfNodes) and the table of interned ids. A snapshot is never
// modified once published (Store.names): interning publishes a new one,
// whose ids may share the old one's array past its length, which no
// reader of the old one reads.
type nodeNames struct {
	self []string // [node id], or nil before the store has one
	ids  []string // ids[n-1] is the id numbered n
}

// name returns the id numbered n.
func (nn *nodeNames) name(n uint64) (string, bool) {
	if nn == nil || n == 0 || n > uint64(len(nn.ids)) {
		return "", false
	}
	return nn.ids[n-1], true
}

func (nn *nodeNames) selfList() []string {
	if nn == nil {
		return nil
	}
	return nn.self
}

// maxNodeNumber bounds the table: a store that saw more distinct node ids
// than this spells further ones out (a value can always do that).
const maxNodeNumber = 1 << 24

func nodeNameKey(n uint32) []byte {
	return binary.BigEndian.AppendUint32(append(make([]byte, 0, 5), prefixNodeName), n)
}

// internLocked gives each id of nodes that has none a number, adding its
// n/ key to b, and publishes the new table. mu must be held.
func (s *Store) internLocked(b *writeBuffer, nodes []string) error {
	var grown *nodeNames
	for _, id := range nodes {
		if _, ok := s.nodeNums[id]; ok {
			continue
		}
		if grown == nil {
			cur := s.names.Load()
			grown = &nodeNames{self: cur.self, ids: cur.ids}
		}
		if len(grown.ids) >= maxNodeNumber {
			break
		}
		n := uint32(len(grown.ids) + 1)
		// New to the index: numbers are never reused, and the table's keys
		// are all loaded at Open.
		if err := b.Set(nodeNameKey(n), []byte(id), true); err != nil {
			return err
		}
		grown.ids = append(grown.ids, id)
		s.nodeNums[id] = n
	}
	if grown != nil {
		s.names.Store(grown)
	}
	return nil
}

// nodeNumber is the number interned for id (encodeJob's nums). mu must be
// held.
func (s *Store) nodeNumber(id string) (uint32, bool) {
	n, ok := s.nodeNums[id]
	return n, ok
}

// loadNodeNames reads the table of interned ids from the index.
func (s *Store) loadNodeNames() error {
	var ids []string
	err := s.scanPrefix([]byte{prefixNodeName}, func(k, v []byte) error {
		if len(k) != 5 || binary.BigEndian.Uint32(k[1:]) != uint32(len(ids)+1) {
			return fmt.Errorf("storage: malformed node table key %x (expected number %d)", k, len(ids)+1)
		}
		ids = append(ids, string(v))
		return nil
	})
	if err != nil {
		return err
	}
	s.setNodeTable(ids)
	return nil
}

// setNodeTable replaces the table of interned ids (Open, a rebuild's reset).
func (s *Store) setNodeTable(ids []string) {
	s.nodeNums = make(map[string]uint32, len(ids))
	for i, id := range ids {
		s.nodeNums[id] = uint32(i + 1)
	}
	cur := s.names.Load()
	s.names.Store(&nodeNames{self: cur.selfList(), ids: ids})
}
