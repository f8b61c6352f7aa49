package jepsen

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
)

// Partitioner is what the partition nemesis acts on: the network between
// the nodes (a fault proxy per node in a test).
type Partitioner interface {
	// Partition cuts every link between nodes of different groups, both
	// ways; links within a group work. Groups cover every node.
	Partition(groups [][]int) error
	// Heal restores every link.
	Heal() error
}

// PartitionNemesis splits the cluster in two (a minority of one or two
// nodes and the rest) and heals it, alternately.
type PartitionNemesis struct {
	Net Partitioner
	N   int // nodes in the cluster
}

// Name is "partition".
func (p *PartitionNemesis) Name() string { return "partition" }

// Next heals a partitioned network, or splits a whole one.
func (p *PartitionNemesis) Next(rng *rand.Rand, w *World) (Op, bool) {
	if w.Partitioned {
		w.Partitioned = false
		return Op{Kind: Heal}, true
	}
	if p.N < 2 {
		return Op{}, false
	}
	perm := rng.Perm(p.N)
	k := 1 + rng.IntN(max(1, min(2, (p.N-1)/2)))
	groups := [][]int{slices.Sorted(slices.Values(perm[:k])), slices.Sorted(slices.Values(perm[k:]))}
	w.Partitioned = true
	return Op{Kind: Partition, Nodes: groups[0], Detail: FormatGroups(groups)}, true
}

// Recover heals a partitioned network.
func (p *PartitionNemesis) Recover(w *World) []Op {
	if !w.Partitioned {
		return nil
	}
	w.Partitioned = false
	return []Op{{Kind: Heal}}
}

// Apply partitions along op.Detail's groups, or heals.
func (p *PartitionNemesis) Apply(op Op) error {
	switch op.Kind {
	case Heal:
		return p.Net.Heal()
	case Partition:
		groups, err := ParseGroups(op.Detail)
		if err != nil {
			return err
		}
		return p.Net.Partition(groups)
	}
	return fmt.Errorf("partition nemesis: op kind %q", op.Kind)
}

// FormatGroups writes groups as "n1,n3|n2,n4,n5".
func FormatGroups(groups [][]int) string {
	parts := make([]string, len(groups))
	for i, g := range groups {
		names := make([]string, len(g))
		for j, n := range g {
			names[j] = NodeName(n)
		}
		parts[i] = strings.Join(names, ",")
	}
	return strings.Join(parts, "|")
}

// ParseGroups reads FormatGroups's text.
func ParseGroups(s string) ([][]int, error) {
	var out [][]int
	for _, part := range strings.Split(s, "|") {
		var g []int
		for _, name := range strings.Split(part, ",") {
			var n int
			if _, err := fmt.Sscanf(name, "n%d", &n); err != nil || n < 1 {
				return nil, fmt.Errorf("partition groups %q: bad node %q", s, name)
			}
			g = append(g, n-1)
		}
		out = append(out, g)
	}
	return out, nil
}
